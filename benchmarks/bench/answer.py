"""``bench answer``: time to a correct answer with the trained collaborator, and the controls that take it away.

    python -m benchmarks.bench answer [--workers 1 2 4 8] [--tasks 64] [--seed 0]
                                              [--layouts contiguous isolated interleaved] [--json F] [--plot F]

Every task lists 12 to 24 numbers (``--seed`` draws them) to be written in
Roman numerals (:mod:`vllm_hogwild.tasks.roman`); the collaborator
(:mod:`vllm_hogwild.models.roman_collaborator`) runs as a Hogwild group of N workers
in raw mode, sampled at temperature 1 with ``min_p`` 0.2 and the request's
seed (worker i: seed + i). For each N and layout, over the same tasks:

- ``accuracy``: the share of tasks whose workers' entries, together, give every
  number exactly its numeral (:func:`vllm_hogwild.tasks.roman.check`);
- ``mean_sequential_steps``: engine steps until the group's last worker ended
  (its longest output, end of sequence included);
- ``duplicated_items``: entries beyond the first for a number, per task;
- ``wall_s``: the whole batch of tasks, submitted at once.

Layouts: ``contiguous`` (co-workers' text is read the step after it is
written), ``isolated`` (a control: every worker reads only the prompt and its
own text, so nobody sees a claim), ``interleaved`` (a control: co-workers'
entries are read only once finished, ``step_end=";"``: claims are seen late)
and ``greedy`` (a control: contiguous, every worker sampled with ``top_k=1``,
so nothing breaks the workers' symmetry).
``fixed split`` rows are computed, not run: the list dealt out in prompt order
(worker i takes items i, i + N, ...) with no duplicate, each worker's entries
as the collaborator writes them. ``policy (simulated)`` rows run the policy the
model was trained to imitate on the simulated views, no model: what a perfect
imitation would take. The wall-clock model of
:mod:`vllm_hogwild.tools.planner` is fitted on the N=1 and N=2 contiguous runs
(per task) and its prediction for every other N is set beside the measurement.
"""


from __future__ import annotations

import argparse

import json
import random
import statistics
import time

from vllm_hogwild.models import solve
from vllm_hogwild.models.roman_collaborator import MIN_P, TEMPERATURE
from vllm_hogwild.tasks import roman
from vllm_hogwild.tools import planner

from . import answer_merges
from .common import steps_against_workers


def _at_least_one(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("at least 1")
    return value


def add_arguments(parser) -> None:
    parser.add_argument("--task", choices=("roman", "links", "merges"), default="roman",
                        help="roman: Roman numerals (the first collaborator); links: paths through a table of links, "
                             "costs unknown until done (the links collaborator, --mode all or find); merges: links "
                             "whose paths run into each other (the merges collaborator, every baseline and the "
                             "simulated policy)")
    parser.add_argument("--mode", choices=("all", "find"), default="find", help="links: every path, or the one find")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--tasks", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--min-items", type=int, default=12)
    parser.add_argument("--max-items", type=int, default=24)
    parser.add_argument("--layouts", nargs="+", choices=solve.LAYOUTS, default=list(solve.LAYOUTS))
    parser.add_argument("--protocol", choices=("raw", "multiverse", "collab"), default="raw",
                        help="raw: Hogwild groups of the collaborator; multiverse: fork/join requests of the "
                             "fork/join collaborator; collab: a general model (--model) on sums, collab protocol")
    parser.add_argument("--budgets", type=int, nargs="+", default=[1024, 2048, 4096], help="collab: per worker")
    parser.add_argument("--parts", type=int, default=4, help="collab: additions per task")
    parser.add_argument("--computed", action="store_true",
                        help="merges: start no engine, only the rows computed from the true costs")
    parser.add_argument("--table-repeats", type=int, choices=(1, 2, 3), default=1,
                        help="links: the prompt lists each link this many times (a longer table, the same paths; "
                             "each row then counts the errors by kind, and the isolated rows also a vote per start)")
    parser.add_argument("--sampling-seeds", type=_at_least_one, default=1, metavar="K",
                        help="merges: run the model's groups with K sampling seeds (--seed, --seed + 1, ...) on the "
                             "same tasks; its rows are the means, each seed's kept in the JSON")


def fixed_split_steps(tokenizer, task: roman.Task, num_workers: int) -> int:
    """A fixed split's sequential steps: worker i takes items i, i + N, ... and then ends as the collaborator
    does (a new line, then its end of sequence: two steps more)."""
    cost = {n: len(tokenizer.encode(roman.entry(n), add_special_tokens=False)) for n in task.items}
    return max(sum(cost[n] for n in task.items[w::num_workers]) for w in range(num_workers)) + 2


def answer(llm, args) -> dict:
    if args.task == "merges":
        return answer_merges.merges_answer(args, llm)
    if args.task == "links":
        return links_answer(llm, args)
    if args.protocol == "multiverse":
        return forkjoin_answer(llm, args)
    if args.protocol == "collab":
        return collab_answer(llm, args)
    tasks = roman.make_tasks(args.tasks, args.seed, args.min_items, args.max_items)
    tokenizer = llm.get_tokenizer()
    results, per_task = run_layouts(args, tasks, lambda n, layout: solve.run_groups(llm, tasks, n, layout, args.seed),
                                    roman.check)
    for n in args.workers:
        steps = [fixed_split_steps(tokenizer, t, n) for t in tasks]
        results.append({"workers": n, "layout": "fixed split", "tasks": len(tasks), "accuracy": None,
                        "mean_sequential_steps": statistics.mean(steps), "duplicated_items": 0.0, "wall_s": None})
        results.append(policy_row(tasks, n, args.seed))
    base = {r["layout"]: r for r in results if r["workers"] == 1}
    one = base.get("contiguous") or base.get("fixed split")
    for r in results:
        r["steps_vs_one_worker"] = r["mean_sequential_steps"] / one["mean_sequential_steps"]
    report = {"benchmark": "answer", "results": results, "sampling": {"temperature": TEMPERATURE, "min_p": MIN_P},
              "items": [args.min_items, args.max_items], "seed": args.seed}
    if (1, "contiguous") in per_task and (2, "contiguous") in per_task:
        report["planner"] = planner_check(per_task, args.workers)
    return report


LINKS_ITEMS = (16, 20)  # paths per task (the links generator's default)
SPLITS = ("round-robin split", "split + cancel", "ideal policy", "longest-first (true cost)", "makespan bound")


def links_answer(llm, args) -> dict:
    """The links collaborator on ``--mode`` tasks: every layout that runs, and beside them, from the true costs
    of the same tasks, the splits made in advance and the bounds (:mod:`vllm_hogwild.tasks.links`)."""
    from vllm_hogwild.tasks import links as L
    from vllm_hogwild.models.links_collaborator import MIN_P as LP, TEMPERATURE as LT

    lo, hi = (args.min_items, args.max_items) if args.min_items != 12 or args.max_items != 24 else LINKS_ITEMS
    repeats = getattr(args, "table_repeats", 1)
    tasks = L.make_tasks(args.tasks, args.seed, args.mode, lo, hi, repeats)
    errors = None if repeats == 1 else links_errors
    results, per_task = run_layouts(args, tasks,
                                    lambda n, layout: solve.run_links_groups(llm, tasks, n, layout, args.seed), L.check,
                                    errors)
    checks = solve.check_tokens(llm)  # the checking collaborator's: its groups again with every check barred
    if checks and "contiguous" in args.layouts:
        results += checks_barred_rows(args, tasks, llm, checks, errors)
    computed = {"round-robin split": L.round_robin_steps, "split + cancel": L.split_cancel_steps,
                "ideal policy": L.ideal_steps,
                "longest-first (true cost)": L.longest_first_steps, "makespan bound": L.makespan_bound}
    for n in args.workers:
        for name, steps_of in computed.items():
            results.append({"workers": n, "layout": name, "tasks": len(tasks), "accuracy": None,
                            "mean_sequential_steps": statistics.mean(steps_of(t, n) for t in tasks),
                            "duplicated_items": 0.0, "wall_s": None})
        results.append(links_policy_row(tasks, n, args.seed))
    one = next(r for r in results if r["workers"] == 1 and r["layout"] in ("contiguous", "round-robin split"))
    rr = {r["workers"]: r["mean_sequential_steps"] for r in results if r["layout"] == "round-robin split"}
    cancel = {r["workers"]: r["mean_sequential_steps"] for r in results if r["layout"] == "split + cancel"}
    ideal = {r["workers"]: r["mean_sequential_steps"] for r in results if r["layout"] == "ideal policy"}
    for r in results:
        r["steps_vs_one_worker"] = r["mean_sequential_steps"] / one["mean_sequential_steps"]
        r["steps_vs_round_robin"] = r["mean_sequential_steps"] / rr[r["workers"]]
        r["steps_vs_split_cancel"] = r["mean_sequential_steps"] / cancel[r["workers"]]
        r["steps_vs_ideal"] = r["mean_sequential_steps"] / ideal[r["workers"]]
    barred = {r["workers"]: r["mean_sequential_steps"] for r in results if r["layout"] == CHECKS_BARRED}
    for r in results:  # the checking collaborator's group against itself with checks barred (1.15x at most: issue)
        if r["layout"] == "contiguous" and r["workers"] in barred:
            r["steps_vs_checks_barred"] = r["mean_sequential_steps"] / barred[r["workers"]]
    costs = [c for t in tasks for c in t.costs()]
    report = {"benchmark": "answer", "task": "links", "mode": args.mode, "results": results,
              "sampling": {"temperature": LT, "min_p": LP}, "items": [lo, hi], "seed": args.seed, "repeats": repeats,
              "item_cost": {"mean": statistics.mean(costs), "cv": statistics.pstdev(costs) / statistics.mean(costs),
                            "min": min(costs), "max": max(costs)}}
    if (1, "contiguous") in per_task and (2, "contiguous") in per_task:
        report["planner"] = planner_check(per_task, args.workers)
    return report


CHECKS_BARRED = "contiguous, checks barred"  # the layout name of the checking collaborator's group without checks


def checks_barred_rows(args, tasks, llm, checks, errors) -> list[dict]:
    """The checking collaborator's contiguous groups with its check claims barred (a logit bias of -100 on each
    ``"\\nb?"``): the same model, tasks and seed, checking turned off; the rows' layout :data:`CHECKS_BARRED`."""
    from vllm_hogwild.tasks import links as L

    extra = errors and (lambda ts, outs, n, _: errors(ts, outs, n, CHECKS_BARRED))
    rows = run_layouts(argparse.Namespace(layouts=["contiguous"], workers=args.workers), tasks,
                       lambda n, _: solve.run_links_groups(llm, tasks, n, "contiguous", args.seed, checks), L.check,
                       extra)[0]
    return [row | {"layout": CHECKS_BARRED} for row in rows]


def links_errors(tasks, outs, num_workers: int, layout: str) -> dict:
    """A links row's errors (``--table-repeats`` above 1): every kind summed over the tasks
    (:func:`vllm_hogwild.tasks.links_review.error_kinds`); for the isolated control in all mode the accuracy of a
    majority vote per start over its workers (:func:`vllm_hogwild.tasks.links_review.vote`): what a client that sends N
    requests and votes gets, at the control's own steps; and for the group in all mode the checking policy played
    on from its runs (:func:`vllm_hogwild.tasks.links_review.checked_replay`, seeded by the task's place): the accuracy
    and steps a model that learned to check would reach from them, and what its checks did."""
    from vllm_hogwild.tasks import links as L
    from vllm_hogwild.tasks import links_review as R

    texts = [solve.texts_of(o) for o in outs]
    extra = {"errors": dict.fromkeys(R.ERROR_KINDS, 0), "checks": dict.fromkeys(L.CHECK_KINDS, 0)}
    for task, group in zip(tasks, texts):  # the errors, and what the model's own checks did (none unless it writes them)
        score = L.check(task, group)
        for kind, count in R.error_kinds(task, group, score).items():
            extra["errors"][kind] += count
        for kind, count in score.checks_by_kind().items():
            extra["checks"][kind] += count
    if layout == "isolated" and tasks[0].mode == "all":
        extra["vote_accuracy"] = _share(R.vote(t, g).correct for t, g in zip(tasks, texts))
    if layout == "contiguous" and tasks[0].mode == "all":
        right, steps, checks, replayed = [], [], dict.fromkeys(L.CHECK_KINDS, 0), 0
        for i, (task, group, out) in enumerate(zip(tasks, texts, outs)):
            played = R.checked_replay(task, group, random.Random(i))
            replayed += played is not None
            group, own = played or (group, 0)
            score = L.check(task, group)
            right.append(score.correct)
            steps.append(max(own, solve.steps_of(out)))  # a lane the budget cut off is not played on
            for kind, count in score.checks_by_kind().items():
                checks[kind] += count
        extra["checking_policy"] = {"accuracy": _share(right), "mean_sequential_steps": statistics.mean(steps),
                                    "checks": checks, "replayed_tasks": replayed}
    return extra


def links_policy_row(tasks, num_workers: int, seed: int) -> dict:
    """The policy the links collaborator imitates, run in simulated lock-step (no model)."""
    from vllm_hogwild.tasks import links as L
    from vllm_hogwild.models import links_collaborator as C

    vocab, rng = C.LinksVocab.build(), random.Random(seed)
    runs = [C.simulate(vocab, t, num_workers, rng) for t in tasks]
    scores = [L.check(t, [C.text_of(vocab, o) for o in r]) for t, r in zip(tasks, runs)]
    return {"workers": num_workers, "layout": "policy (simulated)", "tasks": len(tasks),
            "accuracy": _share(s.correct for s in scores),
            "mean_sequential_steps": statistics.mean(max(len(o) for o in r) for r in runs),
            "duplicated_items": statistics.mean(s.duplicated_items for s in scores), "wall_s": None}


def policy_row(tasks: list[roman.Task], num_workers: int, seed: int) -> dict:
    """The policy the model imitates, run on the simulated contiguous views (no model): what a perfect
    imitation would take."""
    from vllm_hogwild.models import roman_collaborator as C

    vocab, rng = C.Vocab.build(), random.Random(seed)
    runs = [C.simulate(vocab, t, num_workers, "contiguous", rng, keep_views=False) for t in tasks]
    scores = [roman.check(t, C.texts_of(vocab, r)) for t, r in zip(tasks, runs)]
    return {"workers": num_workers, "layout": "policy (simulated)", "tasks": len(tasks),
            "accuracy": _share(s.correct for s in scores),
            "mean_sequential_steps": statistics.mean(r.num_steps for r in runs),
            "duplicated_items": statistics.mean(s.duplicated_items for s in scores), "wall_s": None}


def run_layouts(args, tasks, run, check, extra=None) -> tuple[list[dict], dict]:
    """Every ``--layouts`` x ``--workers`` run of ``tasks`` (``run(n, layout)`` -> (outputs, wall s)), each scored
    by ``check(task, texts)``: the rows (with ``extra(tasks, outputs, n, layout)``'s fields), and each run's per-task
    steps."""
    results, per_task = [], {}
    for layout in args.layouts:
        for n in args.workers:
            if layout != "contiguous" and n == 1:
                continue  # one worker reads nobody in any layout: the contiguous row is it
            outs, wall = run(n, layout)
            scores = [check(t, solve.texts_of(o)) for t, o in zip(tasks, outs)]
            steps = [solve.steps_of(o) for o in outs]
            per_task[(n, layout)] = steps
            row = {"workers": n, "layout": layout, "tasks": len(tasks), "accuracy": _share(s.correct for s in scores),
                   "mean_sequential_steps": statistics.mean(steps),
                   "duplicated_items": statistics.mean(s.duplicated_items for s in scores), "wall_s": wall}
            if extra is not None:
                row |= extra(tasks, outs, n, layout)
            results.append(row)
            print(json.dumps(row), flush=True)
    return results, per_task


def planner_check(per_task: dict, workers) -> dict:
    """The wall-clock model fitted per task on N=1 and N=2 (contiguous), its predictions against the runs."""
    one, two = per_task[(1, "contiguous")], per_task[(2, "contiguous")]
    try:
        fit = planner.fit(one, two)
    except ValueError as err:  # every task as long as the others (a model that runs to its budget)
        return {"error": str(err)}
    rows = []
    for n in workers:
        if (n, "contiguous") not in per_task:
            continue
        measured = statistics.mean(per_task[(n, "contiguous")])
        predicted = statistics.mean(planner.steps(t, fit.parallel, fit.coordination, n) for t in one)
        rows.append({"workers": n, "measured": measured, "predicted": predicted,
                     "error": (predicted - measured) / measured})
    return {"parallel": fit.parallel, "coordination": fit.coordination, "rows": rows}


def forkjoin_answer(llm, args) -> dict:
    """Fork/join requests of the fork/join collaborator: accuracy (the numerals and the conclusion), sequential
    steps against the same document decoded one after another, and the control: a join that reads no branch."""
    from vllm import SamplingParams

    from vllm_hogwild.models import collaborator_forkjoin as F

    tasks = roman.make_tasks(args.tasks, args.seed, args.min_items, args.max_items)
    t0 = time.perf_counter()
    outs = llm.generate([F.prompt(t) for t in tasks], solve.forkjoin_params(args.seed), use_tqdm=False)
    wall = time.perf_counter() - t0
    scored = [solve.forkjoin_score(t, o) for t, o in zip(tasks, outs)]
    forked = [tree for _, tree in scored if tree.get("forked")]
    rows = [{"side": "fork/join", "tasks": len(tasks), "forked": len(forked) / len(tasks),
             "accuracy": _share(s.correct for s, _ in scored),
             "numerals_accuracy": _share(s.numerals.correct for s, _ in scored),
             "conclusion_accuracy": _share(s.conclusion_correct for s, _ in scored),
             "mean_sequential_steps": statistics.mean(t["sequential_steps"] for t in forked) if forked else None,
             "wall_s": wall},
            {"side": "one after another", "tasks": len(forked), "forked": None, "accuracy": None,
             "numerals_accuracy": None, "conclusion_accuracy": None,
             "mean_sequential_steps": statistics.mean(t["num_tokens"] for t in forked) if forked else None,
             "wall_s": None}]
    # The control: the conclusion written after a join that reads no branch (the goal, then the join header).
    blind = [F.prompt(t) + F.goal(t) + F.JOIN_HEADER for t in tasks]
    plain = SamplingParams(temperature=TEMPERATURE, min_p=MIN_P, seed=args.seed, max_tokens=16)
    outs = llm.generate(blind, plain, use_tqdm=False)
    ok = []
    for task, (_, tree), out in zip(tasks, scored, outs):
        branches = [b["text"].split(":", 1)[-1] for b in tree.get("branches", ())]
        ok.append(bool(branches) and F.check(task, branches, out.outputs[0].text).conclusion_correct)
    rows.append({"side": "join without the branches (control)", "tasks": len(tasks), "forked": None,
                 "accuracy": None, "numerals_accuracy": None, "conclusion_accuracy": _share(ok),
                 "mean_sequential_steps": None, "wall_s": None})
    for r in rows:
        print(json.dumps(r), flush=True)
    return {"benchmark": "answer", "protocol": "multiverse", "results": rows, "seed": args.seed,
            "sampling": {"temperature": TEMPERATURE, "min_p": MIN_P}, "items": [args.min_items, args.max_items]}


def sum_tasks(num_tasks: int, parts: int, seed: int = 0) -> list[tuple[str, int]]:
    """``(question, answer)``: independent additions whose results are summed; exactly checkable."""
    rng = random.Random(seed)
    tasks = []
    for _ in range(num_tasks):
        pairs = [(rng.randint(10, 99), rng.randint(10, 99)) for _ in range(parts)]
        items = "\n".join(f"{i + 1}. {a} + {b}" for i, (a, b) in enumerate(pairs))
        question = (f"Compute each of these {parts} sums, then add all the results together and give the "
                    f"total.\n{items}")
        tasks.append((question, sum(a + b for a, b in pairs)))
    return tasks


def collab_answer(llm, args) -> dict:
    """A general model (a reasoning model on a GPU: the paper's setting) as a ``collab`` group on sums: accuracy
    of the group's boxed answer against its sequential steps, per width and budget."""
    from vllm import SamplingParams

    from vllm_hogwild.core.protocol.collab import answer as group_answer

    tasks = sum_tasks(args.tasks, args.parts, seed=args.seed)
    results = []
    for n in args.workers:
        for budget in args.budgets:
            params = SamplingParams(n=n, temperature=0.6, seed=args.seed, max_tokens=budget,
                                    extra_args={"hogwild": {"protocol": "collab", "task": "math"}})
            t0 = time.perf_counter()
            outs = llm.chat([[{"role": "user", "content": q}] for q, _ in tasks], params, use_tqdm=False)
            wall = time.perf_counter() - t0
            found = [group_answer(o) for o in outs]
            right = [f is not None and _number(f.text) == truth for f, (_, truth) in zip(found, tasks)]
            row = {"workers": n, "layout": f"collab, budget {budget}", "tasks": len(tasks), "accuracy": _share(right),
                   "answered": _share(f is not None for f in found),
                   "mean_sequential_steps": statistics.mean(solve.steps_of(o) for o in outs),
                   "duplicated_items": None, "wall_s": wall}
            results.append(row)
            print(json.dumps(row), flush=True)
    one = {r["layout"]: r["mean_sequential_steps"] for r in results if r["workers"] == 1}
    for r in results:
        r["steps_vs_one_worker"] = r["mean_sequential_steps"] / one[r["layout"]] if r["layout"] in one else None
    return {"benchmark": "answer", "protocol": "collab", "results": results, "seed": args.seed}


def _number(text: str) -> int | None:
    digits = "".join(ch for ch in text if ch.isdigit() or ch == "-")
    try:
        return int(digits)
    except ValueError:
        return None


def _share(flags) -> float:
    flags = list(flags)
    return sum(flags) / len(flags)


def markdown(report: dict) -> str:
    if report.get("task") == "merges":
        return answer_merges.markdown(report)
    if report.get("protocol") == "multiverse":
        head = ("| side | tasks | forked | accuracy | numerals | conclusion | mean sequential steps | wall s |")
        body = [f"| {r['side']} | {r['tasks']} | {_fmt(r['forked'])} | {_fmt(r['accuracy'])} | "
                f"{_fmt(r['numerals_accuracy'])} | {_fmt(r['conclusion_accuracy'])} | "
                f"{_fmt(r['mean_sequential_steps'], '.1f')} | {_fmt(r['wall_s'], '.1f')} |" for r in report["results"]]
        return "\n".join([head, "|---|---:|---:|---:|---:|---:|---:|---:|", *body])
    if report.get("task") == "links":
        head = ("| workers | layout | tasks | accuracy | mean sequential steps | vs 1 worker | vs round-robin split | "
                "vs split + cancel | vs ideal policy | duplicated items | wall s |")
        body = [f"| {r['workers']} | {r['layout']} | {r['tasks']} | {_fmt(r['accuracy'])} | "
                f"{r['mean_sequential_steps']:.1f} | {_fmt(r['steps_vs_one_worker'])}x | "
                f"{_fmt(r['steps_vs_round_robin'])}x | {_fmt(r['steps_vs_split_cancel'])}x | "
                f"{_fmt(r['steps_vs_ideal'])}x | {_fmt(r['duplicated_items'])} | "
                f"{_fmt(r['wall_s'], '.1f')} |" for r in report["results"]]
        lines = [head, "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|", *body]
        erred = [r for r in report["results"] if "errors" in r]
        if erred:  # --table-repeats: the errors by kind, and the isolated control's vote
            from vllm_hogwild.tasks.links_review import ERROR_KINDS

            lines += ["", f"Each link listed {report['repeats']} times. Errors by kind, over the tasks:", "",
                      "| workers | layout | accuracy | vote per start | " + " | ".join(ERROR_KINDS) + " |",
                      "|---:|---|---:|---:|" + "---:|" * len(ERROR_KINDS)]
            lines += [f"| {r['workers']} | {r['layout']} | {_fmt(r['accuracy'])} | {_fmt(r.get('vote_accuracy'))} | "
                      + " | ".join(str(r["errors"][k]) for k in ERROR_KINDS) + " |" for r in erred]
            played = [r for r in erred if "checking_policy" in r]
            if played:
                from vllm_hogwild.tasks.links import CHECK_KINDS

                lines += ["", "The checking policy played on from the group's runs (its checks never wrong):", "",
                          "| workers | the run: accuracy | steps | played on: accuracy | steps | vs the run | "
                          + " | ".join(CHECK_KINDS) + " |", "|---:|---:|---:|---:|---:|---:|" + "---:|" * len(CHECK_KINDS)]
                for r in played:
                    c = r["checking_policy"]
                    lines.append(f"| {r['workers']} | {_fmt(r['accuracy'])} | {r['mean_sequential_steps']:.1f} | "
                                 f"{_fmt(c['accuracy'])} | {c['mean_sequential_steps']:.1f} | "
                                 f"{c['mean_sequential_steps'] / r['mean_sequential_steps']:.2f}x | "
                                 + " | ".join(str(c["checks"][k]) for k in CHECK_KINDS) + " |")
    else:
        head = "| workers | layout | tasks | accuracy | mean sequential steps | steps vs 1 worker | duplicated items | wall s |"
        body = [f"| {r['workers']} | {r['layout']} | {r['tasks']} | {_fmt(r['accuracy'])} | "
                f"{r['mean_sequential_steps']:.1f} | {_fmt(r['steps_vs_one_worker'])}x | {_fmt(r['duplicated_items'])} | "
                f"{_fmt(r['wall_s'], '.1f')} |" for r in report["results"]]
        lines = [head, "|---:|---|---:|---:|---:|---:|---:|---:|", *body]
    fit = report.get("planner")
    if fit and "error" in fit:
        lines += ["", f"Wall-clock model: not fitted ({fit['error']})."]
    elif fit:
        lines += ["", f"Wall-clock model fitted on N=1 and N=2 (per task): p = {fit['parallel']:.3f}, "
                      f"c = {fit['coordination']:.2f} steps per worker.", "",
                  "| workers | measured steps | predicted | prediction error |", "|---:|---:|---:|---:|"]
        lines += [f"| {r['workers']} | {r['measured']:.1f} | {r['predicted']:.1f} | {r['error']:+.1%} |"
                  for r in fit["rows"]]
    return "\n".join(lines)


def _fmt(value, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def plot(report: dict, ax) -> None:
    """Accuracy against mean sequential steps, one marker per (workers, layout) that ran."""
    if report.get("protocol") == "multiverse":
        pts = [r for r in report["results"] if r["mean_sequential_steps"] is not None]
        ax.bar([r["side"] for r in pts], [r["mean_sequential_steps"] for r in pts], label="mean sequential steps")
        ax.set(ylabel="sequential decode steps", title="Fork/join collaborator")
        return
    if report.get("task") == "merges":
        return answer_merges.plot(report, ax)
    if report.get("task") == "links":  # steps against N: every run, every split, the ideal policy, the bound
        styles = {"contiguous": "o-", "isolated": "s--", "interleaved": "^:", "greedy": "x-.",
                  "round-robin split": "d-", "split + cancel": "D--", "ideal policy": "*-", "longest-first (true cost)": "v--",
                  "makespan bound": "k:", "policy (simulated)": "+:"}
        for layout, style in styles.items():
            pts = sorted((r for r in report["results"] if r["layout"] == layout or (
                r["layout"] == "contiguous" and r["workers"] == 1 and layout in ("isolated", "interleaved"))),
                key=lambda r: r["workers"])
            if any(r["layout"] == layout for r in pts):
                ax.plot([r["workers"] for r in pts], [r["mean_sequential_steps"] for r in pts], style, label=layout)
        steps_against_workers(ax, report, f"Links ({report['mode']} mode): steps against workers")
        return
    markers = {"contiguous": "o-", "isolated": "s--", "interleaved": "^:", "greedy": "x-."}
    for layout, style in markers.items():
        pts = [r for r in report["results"] if r["layout"] == layout or (r["layout"] == "contiguous" and
                                                                         r["workers"] == 1)]
        pts = sorted(pts, key=lambda r: r["workers"])
        if not any(r["layout"] == layout for r in pts):
            continue
        ax.plot([r["mean_sequential_steps"] for r in pts], [r["accuracy"] for r in pts], style, label=layout)
        for r in pts:
            ax.annotate(f"N={r['workers']}", (r["mean_sequential_steps"], r["accuracy"]), fontsize=7,
                        textcoords="offset points", xytext=(3, 3))
    ax.set(xlabel="mean sequential decode steps", ylabel="accuracy", ylim=(-0.02, 1.05),
           title="Roman numerals: time to a correct answer")

