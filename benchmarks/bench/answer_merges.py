"""``bench answer --task merges``: the merges task (:mod:`vllm_hogwild.tasks.merges`), every baseline from the true
costs, and the policy a collaborator would imitate, simulated in lock-step with each of the views.

    python -m benchmarks.bench answer --task merges [--mode all|find] [--workers 1 2 4 8] [--tasks 64] [--seed 0]
        [--model DIR | --computed] [--sampling-seeds K]

The merges collaborator (:mod:`vllm_hogwild.models.merges_collaborator`, or ``--model``) runs through the engine
in three layouts: ``contiguous`` (the group), and the controls ``isolated`` (each worker reads only its own
lane) and ``interleaved`` (a co-worker's entry is read once it ends: ``;``, ``!`` or a reference). In find mode
the benchmark is each group's client: it cancels the group in the step after its texts hold the prompt's count of
finds (:func:`vllm_hogwild.models.solve.run_merges_groups`), in every layout, as the split with cancel's client
does. ``--computed`` starts no engine. ``--sampling-seeds K`` runs the model's groups with K sampling seeds on the
same tasks (one 64-task run's mean steps vary by a few percent with the seed alone): its rows are the means over all
K runs, and each seed's mean steps and accuracy are kept (``steps_by_seed``, ``accuracy_by_seed``). Beside them,
computed from the true costs of the same tasks, per N (``layout``):

- ``round-robin split``: worker ``i`` takes starts ``i, i + N, ...`` made in advance; it reuses only its own
  share's paths (an independent request reads its own text); in find mode every share runs to its end;
- ``split + cancel``: the same, and in find mode the group ends in the step its last start reaching the goal is
  written (a client that cancels the rest);
- ``ideal policy``: claim as you go (the next free start, no collision), no reuse;
- ``ideal reuse policy``: claim as you go, and a path that reaches a node some written entry has gone on past
  ends there by reference;
- ``policy (simulated)``: the reuse policy with claims drawn uniformly among the free starts (sampled workers:
  two free in one step may take the same start), reading everyone's lane the step after it is written
  (``contiguous``); in find mode its client cancels at the last find;
- the controls, the same sampled policy and client: ``isolated (simulated)`` (each worker reads only its own
  lane: nobody sees a claim or a path) and ``interleaved (simulated)`` (co-workers' entries read only once
  finished).

Each row is scored by :func:`vllm_hogwild.tasks.merges.check` (references expanded, exactly); ``references`` and
``links_skipped`` are per task. The wall-clock model of :mod:`vllm_hogwild.tools.planner` is fitted on the
simulated policy's N=1 and N=2 runs per task.
"""

from __future__ import annotations

import json
import random
import statistics

from vllm_hogwild.models import solve
from vllm_hogwild.tasks import merges as M
from vllm_hogwild.tasks import merges_policy as P
from vllm_hogwild.tools import planner

from .common import steps_against_workers

ITEMS = (16, 20)
SIMULATED = {"policy (simulated)": "shared", "isolated (simulated)": "own", "interleaved (simulated)": "finished"}


MODEL_LAYOUTS = ("contiguous", "isolated", "interleaved")  # the model's runs: the group, and the two controls


def merges_answer(args, llm=None) -> dict:
    lo, hi = (args.min_items, args.max_items) if args.min_items != 12 or args.max_items != 24 else ITEMS
    tasks = M.make_tasks(args.tasks, args.seed, args.mode, lo, hi)
    results, per_task = [], {}
    seeds = range(args.seed, args.seed + getattr(args, "sampling_seeds", 1))
    if llm is not None:
        for layout in (x for x in args.layouts if x in MODEL_LAYOUTS):
            for n in args.workers:
                if layout != "contiguous" and n == 1:
                    continue  # one worker reads nobody in any layout
                by_seed = [solve.run_merges_groups(llm, tasks, n, layout, seed, f"s{seed}") for seed in seeds]
                runs = [r for seed_runs, _ in by_seed for r in seed_runs]
                steps = [r.steps for r in runs]
                row = _scored(layout, n, tasks * len(seeds), [r.texts for r in runs], steps)
                row["wall_s"] = sum(wall for _, wall in by_seed)
                row["tasks"] = len(tasks)
                if len(seeds) > 1:
                    row["sampling_seeds"] = list(seeds)
                    row["steps_by_seed"] = [statistics.mean(r.steps for r in seed_runs) for seed_runs, _ in by_seed]
                    row["accuracy_by_seed"] = [statistics.mean(M.check(t, r.texts).correct for t, r in
                                                               zip(tasks, seed_runs)) for seed_runs, _ in by_seed]
                results.append(row)
                if layout == "contiguous":
                    per_task[("model", n)] = steps
                print(json.dumps(row), flush=True)
    for n in args.workers:
        for name, how in P.BASELINES.items():
            results.append(_row(name, n, tasks, [P.run(t, n, *how) for t in tasks]))
        for name, reads in SIMULATED.items():
            if n == 1 and reads != "shared":
                continue  # one worker reads nobody in any view
            rng = random.Random(args.seed * 1009 + n)
            runs = [P.run(t, n, "sample", reads, True, True, rng) for t in tasks]  # find: the client cancels
            results.append(_row(name, n, tasks, runs))
            if reads == "shared":
                per_task[n] = [r.steps for r in runs]
    by = {(r["workers"], r["layout"]): r["mean_sequential_steps"] for r in results}
    one = by.get((1, "contiguous" if llm is not None else "ideal reuse policy")) if 1 in args.workers else None
    for r in results:
        n, steps = r["workers"], r["mean_sequential_steps"]
        r["steps_vs_one_worker"] = None if one is None else steps / one
        r["steps_vs_round_robin"] = steps / by[(n, "round-robin split")]
        r["steps_vs_split_cancel"] = steps / by[(n, "split + cancel")]
        r["steps_vs_ideal_reuse"] = steps / by[(n, "ideal reuse policy")]
    costs = [c for t in tasks for c in t.costs()]
    report = {"benchmark": "answer", "task": "merges", "mode": args.mode, "results": results, "items": [lo, hi],
              "seed": args.seed, "merges": M.merge_stats(tasks),
              "item_cost": {"mean": statistics.mean(costs), "cv": statistics.pstdev(costs) / statistics.mean(costs),
                            "min": min(costs), "max": max(costs)},
              "model": getattr(args, "model_dir", None),
              "runs": ("the merges collaborator through the engine (contiguous, isolated, interleaved); the other "
                       "rows computed" if llm is not None else "none: every row is computed, no engine")}
    if llm is not None:
        from vllm_hogwild.models.merges_collaborator import MIN_P, TEMPERATURE

        report["sampling"] = {"temperature": TEMPERATURE, "min_p": MIN_P}
    fits = [(("model", 1), ("model", 2), "the model (contiguous), N=1 and N=2"),
            (1, 2, "policy (simulated), N=1 and N=2")]
    for one_key, two_key, what in fits:
        if per_task.get(one_key) and per_task.get(two_key):
            try:
                fit = planner.fit(per_task[one_key], per_task[two_key])
                report["planner"] = {"parallel": fit.parallel, "coordination": fit.coordination, "fitted_on": what}
            except ValueError as err:
                report["planner"] = {"error": str(err)}
            break
    return report


def _row(layout: str, n: int, tasks, runs) -> dict:
    return _scored(layout, n, tasks, [r.texts for r in runs], [r.steps for r in runs])


def _scored(layout: str, n: int, tasks, texts, steps) -> dict:
    scores = [M.check(t, x) for t, x in zip(tasks, texts)]
    return {"workers": n, "layout": layout, "tasks": len(tasks),
            "accuracy": sum(s.correct for s in scores) / len(scores),
            "mean_sequential_steps": statistics.mean(steps),
            "duplicated_items": statistics.mean(s.duplicated_items for s in scores),
            "references": statistics.mean(len(s.references) for s in scores),
            "links_skipped": statistics.mean(sum(x.skipped for x in s.references) for s in scores),
            "wall_s": None}


def markdown(report: dict) -> str:
    m = report["merges"]
    head = ("| workers | layout | accuracy | mean sequential steps | vs 1 worker | vs round-robin split | "
            "vs split + cancel | vs ideal reuse | references | links skipped | duplicated |")
    fmt = lambda v, spec=".2f": "-" if v is None else format(v, spec)  # noqa: E731
    body = [f"| {r['workers']} | {r['layout']} | {fmt(r['accuracy'])} | {r['mean_sequential_steps']:.1f} | "
            f"{fmt(r['steps_vs_one_worker'])}x | {fmt(r['steps_vs_round_robin'])}x | "
            f"{fmt(r['steps_vs_split_cancel'])}x | {fmt(r['steps_vs_ideal_reuse'])}x | {r['references']:.1f} | "
            f"{r['links_skipped']:.1f} | {r['duplicated_items']:.2f} |" for r in report["results"]]
    lines = [f"Merges ({report['mode']} mode), {report['results'][0]['tasks']} tasks of {report['items'][0]} to "
             f"{report['items'][1]} starts (seed {report['seed']}): {m['merging_share']:.0%} of the starts run into "
             f"a path listed before them, sharing {m['shared_suffix_share']:.0%} of their links on average; "
             f"{m['links_skippable']:.0%} of all links could be skipped. Runs: {report['runs']}.", "",
             head, "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|", *body]
    spread = [r for r in report["results"] if r.get("steps_by_seed")]
    if spread:
        lines += ["", f"The model's rows: means over {len(spread[0]['steps_by_seed'])} sampling seeds on the same "
                      "tasks; one seed's mean steps (accuracy) ranged: " + "; ".join(
                          f"{r['layout']} N={r['workers']} {min(r['steps_by_seed']):.1f} to "
                          f"{max(r['steps_by_seed']):.1f} ({min(r['accuracy_by_seed']):.2f} to "
                          f"{max(r['accuracy_by_seed']):.2f})" for r in spread) + "."]
    fit = report.get("planner")
    if fit and "error" not in fit:
        lines += ["", f"Wall-clock model fitted on {fit['fitted_on']} (per task): p = {fit['parallel']:.3f}, "
                      f"c = {fit['coordination']:.2f} steps per worker."]
    return "\n".join(lines)


def plot(report: dict, ax) -> None:
    styles = {"contiguous": "o-", "isolated": "s-", "interleaved": "^-", "round-robin split": "d-", "split + cancel": "D--", "ideal policy": "*-", "ideal reuse policy": "o--",
              "policy (simulated)": "+:", "isolated (simulated)": "s--", "interleaved (simulated)": "^:"}
    for layout, style in styles.items():
        pts = sorted((r for r in report["results"] if r["layout"] == layout), key=lambda r: r["workers"])
        if pts:
            ax.plot([r["workers"] for r in pts], [r["mean_sequential_steps"] for r in pts], style, label=layout)
    steps_against_workers(ax, report, f"Merges ({report['mode']} mode): steps against workers")
