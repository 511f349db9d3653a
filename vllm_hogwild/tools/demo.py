"""The main job: a trained collaborator solves one task with 1 worker, then as a Hogwild group of 4.

    python -m vllm_hogwild.tools.demo [--workers 4] [--items 18] [--seed 0] [--mode all] [--layout contiguous]
    python -m vllm_hogwild.tools.demo --links [--mode find] ...  # the links collaborator
    python -m vllm_hogwild.tools.demo --roman [--items 20] ...  # the Roman-numeral collaborator
    python -m vllm_hogwild.tools.demo --smollm2 [--help]      # the SmolLM2 collab demo

By default the task is a merges task (:mod:`vllm_hogwild.tasks.merges`): a
table of links and a list of lettered starts whose paths run into each other,
where nobody knows until a path through the node is written. The merges
collaborator (:mod:`vllm_hogwild.models.merges_collaborator`, shipped in the
package) takes a start by writing its letter and follows its path link by
link; a co-worker that reads the claim takes another start, and a worker whose
path reaches a node some lane has written ends its entry there by reference
(``" 7="``: the rest as written), instead of following the rest again. With one
shared KV cache, a co-worker's tokens are readable one engine step after they
are written. Both runs stream who took which start and whose path each
reference reuses; the summary sets the group's steps beside one worker's and
beside a split made in advance (worker i takes starts i, i + N, ..., each
reusing only its own paths: independent requests cannot read each other),
with a client that cancels the rest at the last find in ``--mode find``; there
the group's client cancels it in the same way, once its texts hold every start
the prompt's count names (the model counts nothing).
``--layout isolated`` runs the control where workers cannot read each other.
``--links`` runs the links collaborator on a links task (paths that do not
merge; ``--mode find`` by default); ``--roman`` the first collaborator (Roman
numerals).

The engine's logs go to a file whose path the demo prints first; ``--verbose``
shows them in the terminal instead.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time

from vllm_hogwild.core.protocol_text import NAMES

def announce_take(claimed: dict, step: int, worker: int, item) -> None:
    """Print a worker's claim of ``item`` the first time it makes it, naming the co-workers who took it before
    (``claimed``: item -> the names of its takers, kept by the board)."""
    takers = claimed.setdefault(item, [])
    if NAMES[worker] not in takers:
        takers.append(NAMES[worker])
        also = f"   (also taken by {', '.join(takers[:-1])})" if len(takers) > 1 else ""
        print(f"  step {step:4d}  {NAMES[worker]:<5}  takes {item}{also}")


class ClaimBoard:
    """Who took which number, printed as the workers write: a claim when an entry starts, the entry when done."""

    def __init__(self, num_workers: int) -> None:
        self.texts = [""] * num_workers
        self.num_entries = [0] * num_workers
        self.claimed: dict[int, list[str]] = {}

    def update(self, step: int, worker: int, text: str) -> None:
        from vllm_hogwild.tasks import roman

        entries, _ = roman.parse(text)
        for number, numeral in entries[self.num_entries[worker]:]:
            print(f"  step {step:4d}  {NAMES[worker]:<5}  {number:>2} = {numeral}")
        self.num_entries[worker] = len(entries)
        claim = re.match(r"\s*(\d+)", text[text.rfind(roman.ENTRY_END) + 1:])  # an entry started, not ended
        if claim and text != self.texts[worker]:
            announce_take(self.claimed, step, worker, int(claim.group(1)))
        self.texts[worker] = text


def run_task(llm, task, num_workers: int, layout: str, seed: int) -> dict:
    """One group (``num_workers`` 1: a plain request) on ``task``, its claims printed as they are written."""
    from vllm.sampling_params import RequestOutputKind

    from vllm_hogwild.tasks import roman
    from vllm_hogwild.models import solve

    params = solve.params(num_workers, layout, seed, solve.budget(task.num_items))
    params.output_kind = RequestOutputKind.CUMULATIVE  # every engine step's text (LLM.enqueue asks for the last only)
    engine = llm.llm_engine
    board = ClaimBoard(num_workers)
    t0 = time.perf_counter()
    engine.add_request(f"demo-{num_workers}-{layout}-{seed}", roman.prompt(task), params)
    step, num_tokens = 0, [0] * num_workers
    while engine.has_unfinished_requests():
        outs = engine.step()
        step += 1
        for out in outs:  # a step's output carries the workers that moved (each one's whole text so far)
            for completion in out.outputs:
                board.update(step, completion.index, completion.text)
                num_tokens[completion.index] = len(completion.token_ids)
    wall = time.perf_counter() - t0
    texts = board.texts
    score = roman.check(task, texts)
    return {"workers": num_workers, "layout": layout, "texts": texts, "score": score, "steps": max(num_tokens),
            "wall_s": wall}


class PathBoard:
    """Who took which start, each path's end and the find, printed as the workers write."""

    def __init__(self, num_workers: int, task) -> None:
        self.task = task
        self.texts = [""] * num_workers
        self.num_entries = [0] * num_workers
        self.claimed: dict[str, list[str]] = {}

    def start(self, letter: str) -> str:
        """``b=12``: a claimed letter and the start it names (``?`` for a letter no start has)."""
        from vllm_hogwild.tasks import links

        index = links.SLOTS.index(letter)
        return f"{letter}={self.task.starts[index] if index < len(self.task.starts) else '?'}"

    def update(self, step: int, worker: int, text: str) -> None:
        from vllm_hogwild.tasks import links

        entries, _ = links.parse(text, allow_unfinished=True)
        for index, nodes, found in entries[self.num_entries[worker]:]:
            start = self.start(links.SLOTS[index])
            what = f"FOUND: {start} leads to {nodes[-1]}" if found else f"{start} leads to {nodes[-1]}"
            print(f"  step {step:4d}  {NAMES[worker]:<5}  {what} ({len(nodes) - 1} links)")
        self.num_entries[worker] = len(entries)
        claim = re.search(r"\n([a-z]):[^;!\n]*$", text)  # an entry started, not ended
        if claim and text != self.texts[worker]:
            announce_take(self.claimed, step, worker, self.start(claim.group(1)))
        self.texts[worker] = text


def run_links(llm, task, num_workers: int, layout: str, seed: int) -> dict:
    """One group (``num_workers`` 1: a plain request) on a links task, printed as it is written."""
    from vllm.sampling_params import RequestOutputKind

    from vllm_hogwild.models import solve
    from vllm_hogwild.tasks import links

    params = solve.links_params(num_workers, layout, seed, solve.links_budget([task]))
    params.output_kind = RequestOutputKind.CUMULATIVE
    engine = llm.llm_engine
    board = PathBoard(num_workers, task)
    t0 = time.perf_counter()
    engine.add_request(f"demo-links-{num_workers}-{layout}-{seed}", task.prompt(), params)
    step, num_tokens = 0, [0] * num_workers
    while engine.has_unfinished_requests():
        outs = engine.step()
        step += 1
        for out in outs:
            for completion in out.outputs:
                board.update(step, completion.index, completion.text)
                num_tokens[completion.index] = len(completion.token_ids)
    return {"workers": num_workers, "texts": board.texts, "score": links.check(task, board.texts),
            "steps": max(num_tokens), "wall_s": time.perf_counter() - t0}


class MergesBoard(PathBoard):
    """Who took which start and each entry as it ends: a whole path, or a path that ran into a node a co-worker
    (or the worker itself) had written, finished by reference: whose path it reused and how many links that
    skipped."""

    def update(self, step: int, worker: int, text: str) -> None:
        from vllm_hogwild.tasks import merges

        entries, _ = merges.parse(text, allow_unfinished=True)
        previous, self.texts[worker] = self.texts[worker], text
        for index, nodes, end in entries[self.num_entries[worker]:]:
            if not end:
                break  # still being written
            start = self.start(merges.SLOTS[index])
            if end == merges.REFERENCE:
                print(f"  step {step:4d}  {NAMES[worker]:<5}  {start} runs into {nodes[-1]}: "
                      f"{self.reused(worker, nodes[-1], index, len(nodes))}")
            else:
                found = "FOUND: " if end == merges.FOUND else ""
                print(f"  step {step:4d}  {NAMES[worker]:<5}  {found}{start} leads to {nodes[-1]} "
                      f"({len(nodes) - 1} links)")
            self.num_entries[worker] += 1
        claim = re.search(r"\n([a-z]):[^;!=\n]*$", text)  # an entry started, not ended
        if claim and text != previous:
            announce_take(self.claimed, step, worker, self.start(claim.group(1)))

    def reused(self, worker: int, node: int, index: int, written: int) -> str:
        """Whose entry the reference reads on from: the first (in worker order) that wrote ``node`` as a node (a
        node written as a node goes on past it, even where the next one is not shown yet)."""
        from vllm_hogwild.tasks import merges

        for other, text in enumerate(self.texts):
            for source, nodes, end in merges.parse(text, allow_unfinished=True)[0]:
                upto = nodes[:-1] if end == merges.REFERENCE else nodes
                if node in upto and (other, source) != (worker, index):
                    who = "its own" if other == worker else f"{NAMES[other]}'s"
                    path = self.task.paths[index] if index < len(self.task.paths) else ()
                    skipped = f"skips {len(path) - written} links" if path else "a start the task does not have"
                    return f"the rest as {who} path for {self.start(merges.SLOTS[source])} goes on ({skipped})"
        return "no entry in the texts has gone on past it (WRONG)"


def run_merges(llm, task, num_workers: int, layout: str, seed: int) -> dict:
    """One group (``num_workers`` 1: a plain request) on a merges task, printed as it is written."""
    from vllm.sampling_params import RequestOutputKind

    from vllm_hogwild.models import solve
    from vllm_hogwild.tasks import merges

    params = solve.links_params(num_workers, layout, seed, solve.links_budget([task]), "[;!=]")
    params.output_kind = RequestOutputKind.CUMULATIVE
    engine = llm.llm_engine
    board = MergesBoard(num_workers, task)
    t0 = time.perf_counter()
    request_id = f"demo-merges-{num_workers}-{layout}-{seed}"
    engine.add_request(request_id, task.prompt(), params)
    step, num_tokens, cancelled = 0, [0] * num_workers, False
    while engine.has_unfinished_requests() and not cancelled:
        outs = engine.step()
        step += 1
        for out in outs:
            for completion in out.outputs:
                board.update(step, completion.index, completion.text)
                num_tokens[completion.index] = len(completion.token_ids)
            if not out.finished and not cancelled and merges.find_done(task, board.texts):
                engine.abort_request([request_id])  # the client cancels the group at the last find
                cancelled = True
                print(f"  step {step + 1:4d}  the client cancels the group: its texts hold all {len(task.answer)} "
                      f"starts that reach {merges.GOAL}")
    return {"workers": num_workers, "texts": board.texts, "score": merges.check(task, board.texts),
            "steps": max(num_tokens) + cancelled, "wall_s": time.perf_counter() - t0}


def merges_demo(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m vllm_hogwild.tools.demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=4, help="the group's size (the first run has 1)")
    parser.add_argument("--items", type=int, default=18, help="starts in the task (1 to 26)")
    parser.add_argument("--seed", type=int, default=0, help="draws the task and seeds the sampling")
    parser.add_argument("--mode", default="all", choices=["all", "find"])
    parser.add_argument("--layout", default="contiguous", choices=["contiguous", "isolated", "interleaved"])
    parser.add_argument("--model", default=None, help="HF folder (default: the shipped merges collaborator)")
    parser.add_argument("--links", action="store_true", help="run the links collaborator instead")
    parser.add_argument("--roman", action="store_true", help="run the Roman-numeral collaborator instead")
    parser.add_argument("--smollm2", action="store_true", help="run the SmolLM2 collab demo instead")
    args = parser.parse_args(argv)
    if not 1 <= args.workers <= 8:
        parser.error("--workers: 1 to 8")
    from vllm_hogwild.tasks import merges, merges_policy

    try:
        task = merges.make_task(args.items, args.seed, args.mode)
    except ValueError as err:
        parser.error(f"--{err}")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    from vllm_hogwild.models import solve

    t0 = time.perf_counter()
    llm = solve.links_engine(args.model, "merges")
    what = (f"find the {len(task.answer)} starts whose paths end at {merges.GOAL}" if task.mode == "find"
            else "follow every path")
    lines = task.prompt().split("\n")
    shown = "\n".join(lines[:7] + [f"... ({len(task.links)} links in all)"] + lines[1 + len(task.links):])
    stats = merges.merge_stats([task])
    print(f"\nengine start-up {time.perf_counter() - t0:.1f} s\n\nTask ({len(task.paths)} starts, {what}; seed "
          f"{args.seed}; {stats['merging_share']:.0%} of the paths run into a path listed before them, where "
          f"nobody knows until it is written; an entry may end there by reference, '=', instead of following the "
          f"rest again):\n{shown}\n")
    runs = []
    for n in (1, args.workers):
        print(f"--- {n} worker{'s' if n > 1 else ''} ({'raw mode, ' + args.layout if n > 1 else 'a plain request'}) ---")
        run = run_merges(llm, task, n, args.layout, args.seed)
        score = run["score"]
        verdict = "correct" if score.correct else (f"WRONG (missing {list(score.missing)}, wrong {list(score.wrong)}, "
                                                   f"{score.malformed} malformed characters)")
        reused = sum(r.from_worker != r.worker for r in score.references)
        print(f"  answer: {verdict}; {len(score.references)} path(s) ended by reference ({reused} to a "
              f"co-worker's), {sum(r.skipped for r in score.references)} links skipped; {run['steps']} sequential "
              f"decode steps; {run['wall_s']:.2f} s\n")
        runs.append(run)
    one, group = runs
    split = merges_policy.baseline_steps(task, args.workers, "round-robin split")
    cancel = merges_policy.baseline_steps(task, args.workers, "split + cancel")
    against = (f"{cancel} for a split made in advance whose client cancels the rest at the last find (worker i "
               f"takes starts i, i + {args.workers}, ..., reusing its own paths; {group['steps'] / cancel:.2f}x; "
               f"{split} without the cancel)" if task.mode == "find" else
               f"{cancel} for a split made in advance, with or without a cancel (worker i takes starts i, "
               f"i + {args.workers}, ..., reusing only its own paths: an independent request reads nobody "
               f"else's; {group['steps'] / cancel:.2f}x)")
    print(f"{args.workers} workers: {group['steps']} steps against {one['steps']} for one worker "
          f"({group['steps'] / one['steps']:.2f}x) and {against}; wall {group['wall_s']:.2f} s against "
          f"{one['wall_s']:.2f} s; both answers "
          f"{'correct' if one['score'].correct and group['score'].correct else 'checked above'}.")


def links_demo(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m vllm_hogwild.tools.demo --links", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=4, help="the group's size (the first run has 1)")
    parser.add_argument("--items", type=int, default=18, help="starts in the task (1 to 25)")
    parser.add_argument("--seed", type=int, default=0, help="draws the task and seeds the sampling")
    parser.add_argument("--mode", default="find", choices=["find", "all"])
    parser.add_argument("--layout", default="contiguous", choices=["contiguous", "isolated", "interleaved"])
    parser.add_argument("--model", default=None, help="HF folder (default: the shipped links collaborator)")
    parser.add_argument("--roman", action="store_true", help="run the Roman-numeral collaborator instead")
    parser.add_argument("--smollm2", action="store_true", help="run the SmolLM2 collab demo instead")
    args = parser.parse_args(argv)
    if not 1 <= args.workers <= 8:
        parser.error("--workers: 1 to 8")
    from vllm_hogwild.tasks import links

    try:
        task = links.make_task(args.items, args.seed, args.mode)
    except ValueError as err:
        parser.error(f"--{err}")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    from vllm_hogwild.models import solve

    t0 = time.perf_counter()
    llm = solve.links_engine(args.model)
    what = f"find the start whose path ends at {task.target}" if task.mode == "find" else "follow every path"
    lines = task.prompt().split("\n")
    shown = "\n".join(lines[:7] + [f"... ({len(task.links)} links in all)"] + lines[1 + len(task.links):])
    print(f"\nengine start-up {time.perf_counter() - t0:.1f} s\n\nTask ({len(task.paths)} starts, {what}; seed "
          f"{args.seed}; the paths take 1 to {max(task.hops())} links, nowhere written):\n{shown}\n")
    runs = []
    for n in (1, args.workers):
        print(f"--- {n} worker{'s' if n > 1 else ''} ({'raw mode, ' + args.layout if n > 1 else 'a plain request'}) ---")
        run = run_links(llm, task, n, args.layout, args.seed)
        score = run["score"]
        verdict = "correct" if score.correct else (f"WRONG (missing {list(score.missing)}, wrong {list(score.wrong)}, "
                                                   f"{score.malformed} malformed characters)")
        print(f"  answer: {verdict}; {score.duplicated_items} duplicated item(s); {run['steps']} sequential decode "
              f"steps; {run['wall_s']:.2f} s\n")
        runs.append(run)
    one, group = runs
    split = links.round_robin_steps(task, args.workers)
    cancel = links.split_cancel_steps(task, args.workers)
    against = (f"{cancel} for a split made in advance whose client cancels the rest at the find (worker i takes "
               f"starts i, i + {args.workers}, ...; {group['steps'] / cancel:.2f}x; {split} without the cancel)"
               if task.mode == "find" else
               f"{split} for a split made in advance (worker i takes starts i, i + {args.workers}, ...; "
               f"{group['steps'] / split:.2f}x)")
    print(f"{args.workers} workers: {group['steps']} steps against {one['steps']} for one worker "
          f"({group['steps'] / one['steps']:.2f}x) and {against}; wall {group['wall_s']:.2f} s against "
          f"{one['wall_s']:.2f} s; both answers "
          f"{'correct' if one['score'].correct and group['score'].correct else 'checked above'}.")


def logs_to_file(folder=None):
    """Send this process's and the engine's logs (vLLM's, the plugin's, warnings, progress bars: everything on
    standard error) to a fresh file, so that standard output holds the demo's own lines; returns the path, which
    the demo prints first. The engine's processes inherit the redirection."""
    import tempfile

    folder = folder or os.environ.get("VLLM_HOGWILD_LOG_DIR") or tempfile.gettempdir()
    fd, path = tempfile.mkstemp(prefix="hogwild-demo-", suffix=".log", dir=folder)
    os.environ["VLLM_LOGGING_STREAM"] = "ext://sys.stderr"  # vLLM logs to standard output unless told
    sys.stderr.flush()
    os.dup2(fd, 2)
    os.close(fd)
    return path


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if "--verbose" in argv:
        argv = [a for a in argv if a != "--verbose"]
    elif not {"-h", "--help"} & set(argv):
        saved = os.dup(2)
        path = logs_to_file()
        print(f"(vLLM's logs: {path}; --verbose shows them here)", flush=True)
        try:
            return _main(argv)
        except BaseException:
            os.dup2(saved, 2)
            with open(path, errors="replace") as log:
                tail = log.readlines()[-20:]
            print("".join(tail) + f"(the run stopped; the last lines of {path} are above)", file=sys.stderr,
                  flush=True)
            raise
    return _main(argv)


def _main(argv: list[str]) -> None:
    if "--smollm2" in argv:
        from vllm_hogwild.tools.demo_smollm2 import smollm2_demo

        return smollm2_demo([a for a in argv if a != "--smollm2"])
    if "--links" in argv:
        return links_demo([a for a in argv if a != "--links"])
    if "--roman" not in argv:
        return merges_demo(argv)
    argv = [a for a in argv if a != "--roman"]
    parser = argparse.ArgumentParser(prog="python -m vllm_hogwild.tools.demo --roman", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=4, help="the group's size (the first run has 1)")
    parser.add_argument("--items", type=int, default=20, help="numbers in the task (1 to 39)")
    parser.add_argument("--seed", type=int, default=0, help="draws the task and seeds the sampling")
    parser.add_argument("--layout", default="contiguous", choices=["contiguous", "isolated", "interleaved"])
    parser.add_argument("--model", default=None, help="HF folder (default: the shipped collaborator)")
    parser.add_argument("--smollm2", action="store_true", help="run the SmolLM2 collab demo instead")
    args = parser.parse_args(argv)
    if not 1 <= args.workers <= 8:
        parser.error("--workers: 1 to 8")
    from vllm_hogwild.tasks import roman

    try:
        task = roman.make_task(args.items, args.seed)
    except ValueError as err:
        parser.error(f"--{err}")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    from vllm_hogwild.models import solve

    t0 = time.perf_counter()
    llm = solve.engine(args.model)
    print(f"\nengine start-up {time.perf_counter() - t0:.1f} s\n\nTask ({task.num_items} numbers, seed {args.seed}):\n"
          f"{roman.prompt(task)}\n")
    runs = []
    for n in (1, args.workers):
        print(f"--- {n} worker{'s' if n > 1 else ''} ({'raw mode, ' + args.layout if n > 1 else 'a plain request'}) ---")
        run = run_task(llm, task, n, args.layout, args.seed)
        score = run["score"]
        for w in range(n):
            print(f"  {NAMES[w]} did {score.claims(w)}")
        verdict = "correct" if score.correct else (f"WRONG (missing {list(score.missing)}, wrong {list(score.wrong)}, "
                                                   f"{score.malformed} malformed characters)")
        print(f"  answer: {verdict}; {score.duplicated_items} duplicated item(s); {run['steps']} sequential decode "
              f"steps; {run['wall_s']:.2f} s\n")
        runs.append(run)
    one, group = runs
    print(f"{args.workers} workers: {group['steps']} steps against {one['steps']} for one worker "
          f"({group['steps'] / one['steps']:.2f}x), wall {group['wall_s']:.2f} s against {one['wall_s']:.2f} s; "
          f"both answers {'correct' if one['score'].correct and group['score'].correct else 'checked above'}.")


if __name__ == "__main__":
    main()
