"""The main job: a trained collaborator solves one task with 1 worker, then as a Hogwild group of 4.

    python -m vllm_hogwild.tools.demo [--workers 4] [--items 18] [--seed 0] [--mode find] [--layout contiguous]
    python -m vllm_hogwild.tools.demo --roman [--items 20] ...  # the Roman-numeral collaborator
    python -m vllm_hogwild.tools.demo --smollm2 [--help]      # the SmolLM2 collab demo

By default the task is a *find* (:mod:`vllm_hogwild.tasks.links`): a table of
links and a list of lettered starts, and exactly one start's path ends at the
goal the prompt names (``Z``). What a path costs nobody knows until it is
followed. The links collaborator (:mod:`vllm_hogwild.models.links_collaborator`,
shipped in the package) takes a start by writing its letter, follows its path
link by link, and a co-worker that reads the claim takes another start; a
worker that reads a co-worker's find stops. With one shared KV cache, a co-worker's tokens are
readable one engine step after they are written. Both runs stream who took
which start, what each path came to and the find; the summary sets the group's
steps beside one worker's and beside the steps a split made in advance would
take on the same task (worker i takes starts i, i + N, ...: no worker can stop
at the find, since none knows what the others found). ``--mode all`` follows
every path; ``--layout isolated`` runs the control where workers cannot read
each other; ``--roman`` runs the first collaborator (Roman numerals).

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

SMOLLM2_DOC = """The SmolLM2 collab demo: a Hogwild group of 2 workers of the embedded SmolLM2-135M-Instruct.

By default the workers collaborate (the ``collab`` protocol, math template):
they are told they are a team, every step starts with its writer's name, and
each reads the prompt, the finished steps of everybody (the shared history)
and the step each co-worker is writing, all from one shared KV cache. Their
texts are shown as they grow; then the steps in the order they joined the
history, the tokens per worker, the final answer (a worker's, or the
finisher's when the budget ran out) and the time taken. ``--markdown`` also
writes that record to a file. ``--protocol raw`` runs the checkable core
instead: no names, no headers, the contiguous layout. The model is too small
to split the work or to get the arithmetic right: the run shows the machinery.
"""

DEFAULT_PROMPTS = {
    "collab": "A shop sells pens at 3 dollars each and notebooks at 5 dollars each. "
              "Sam buys 4 pens and 2 notebooks. How many dollars does Sam pay?",
    "raw": "Give three ideas for a rainy Sunday afternoon, one per line.",
}


def announce_take(claimed: dict, step: int, worker: int, item) -> None:
    """Print a worker's claim of ``item`` the first time it makes it, naming the co-workers who took it before
    (``claimed``: item -> the names of its takers, kept by the board)."""
    takers = claimed.setdefault(item, [])
    if NAMES[worker] not in takers:
        takers.append(NAMES[worker])
        also = f"   (also taken by {', '.join(takers[:-1])})" if len(takers) > 1 else ""
        print(f"  step {step:4d}  {NAMES[worker]:<5}  takes {item}{also}")


class Board:
    """Each worker's text as it grows: redrawn in place on a terminal, appended chunks otherwise."""

    def __init__(self, num_workers: int) -> None:
        self.texts = [""] * num_workers
        self.shown = [0] * num_workers
        self.tty = sys.stdout.isatty()

    def update(self, index: int, text: str) -> None:
        self.texts[index] = text

    def draw(self, final: bool = False) -> None:
        if self.tty:
            sys.stdout.write("\x1b[H\x1b[J")
            for i, text in enumerate(self.texts):
                print(f"--- {NAMES[i]} (worker {i}) ---\n{text}\n")
            sys.stdout.flush()
            return
        for i, text in enumerate(self.texts):
            new = text[self.shown[i]:]
            if new and (final or len(new) >= 40):
                print(f"[{NAMES[i]}] ...{new!r}", flush=True)
                self.shown[i] = len(text)


def smollm2_demo(argv: list[str]) -> None:
    """The SmolLM2 collab demo (``--smollm2``): two workers of the embedded model on a word problem."""
    parser = argparse.ArgumentParser(prog="python -m vllm_hogwild.tools.demo --smollm2", description=SMOLLM2_DOC,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompt", default=None, help="the task (default: a small word problem; raw: a list)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=192, help="per worker")
    parser.add_argument("--protocol", default="collab", choices=["collab", "raw"])
    parser.add_argument("--task", default="math", choices=["math", "code", "general"], help="collab's template")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--markdown", default=None, help="also write the run's record to this file")
    parser.add_argument("--model", default=None, help="HF folder (default: the embedded SmolLM2-135M-Instruct)")
    args = parser.parse_args(argv)
    prompt_text = args.prompt or DEFAULT_PROMPTS[args.protocol]

    from vllm_hogwild.models.default import prepare

    model = args.model or str(prepare())
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    from vllm import LLM, SamplingParams

    from vllm_hogwild.core.protocol.collab import answer_of_texts, render_transcript, transcript
    from vllm_hogwild.core.protocol_text import DEFAULT_ANSWER_PATTERN

    t0 = time.perf_counter()
    llm = LLM(model=model, dtype="float32", enforce_eager=True, max_model_len=4096, seed=args.seed,
              additional_config={"hogwild": {"max_workers": max(8, args.workers)}})
    t_start = time.perf_counter() - t0
    tokenizer = llm.get_tokenizer()
    hogwild = ({"protocol": "collab", "task": args.task} if args.protocol == "collab"
               else {"layout": "contiguous", "protocol": "raw"})
    params = SamplingParams(n=args.workers, temperature=0.7, top_p=0.95, seed=args.seed,
                            max_tokens=args.max_tokens, extra_args={"hogwild": hogwild})
    engine = llm.llm_engine
    board = Board(args.workers)
    t1 = time.perf_counter()
    # Chat through vLLM's own chat path (the collab preamble becomes a system message).
    llm.enqueue_chat([{"role": "user", "content": prompt_text}], params, use_tqdm=False)
    token_ids: list[list[int]] = [[] for _ in range(args.workers)]
    prompt_len = 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            prompt_len = len(out.prompt_token_ids or ()) or prompt_len
            for completion in out.outputs:
                board.update(completion.index, completion.text)
                token_ids[completion.index] = list(completion.token_ids)
        board.draw()
    t_gen = time.perf_counter() - t1
    board.draw(final=True)
    num_tokens = [len(t) for t in token_ids]
    lines = [f"# A Hogwild group: {args.workers} workers, one shared KV cache, protocol `{args.protocol}`", "",
             f"- model: `{model}`", f"- task: {prompt_text}",
             f"- sampling: temperature 0.7, top_p 0.95, seed {args.seed}, max_tokens {args.max_tokens} per worker",
             f"- prompt tokens (preamble and section headers included): {prompt_len}"]
    if args.protocol == "collab":
        pieces = [[tokenizer.decode([t], skip_special_tokens=True) for t in ids] for ids in token_ids]
        steps = transcript(pieces)
        found = answer_of_texts(board.texts, DEFAULT_ANSWER_PATTERN[args.task])
        promoted = sum(1 for s in steps if s.joined_at < len(token_ids[s.worker]))
        lines += [f"- steps: {len(steps)} in the shared history at the end, {promoted} of them promoted while"
                  " their writer went on (the rest: each worker's last step, joined when it stopped)",
                  "- tokens per worker: " + ", ".join(f"{NAMES[w]} {n}" for w, n in enumerate(num_tokens)),
                  f"- final answer: {found.text!r} (written by {found.name}, source: {found.source})" if found
                  else "- final answer: none (no worker wrote one and the finisher did not close it)",
                  "", "## The shared history, in the order the steps joined it", "", "```text",
                  render_transcript(steps).rstrip(), "```"]
    else:
        lines += ["- tokens per worker: " + ", ".join(f"{NAMES[w]} {n}" for w, n in enumerate(num_tokens)), ""]
        lines += [f"## {NAMES[i]} (worker {i})\n\n```text\n{text.strip()}\n```\n" for i, text in enumerate(board.texts)]
    total = sum(num_tokens)
    lines += ["", f"{total} tokens from {args.workers} workers in {t_gen:.2f} s ({total / t_gen:.1f} tokens/s, "
              f"{max(num_tokens)} lock-step decode steps); engine start-up {t_start:.1f} s"]
    record = "\n".join(lines)
    print("\n" + record)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(record + "\n")



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


def links_demo(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m vllm_hogwild.tools.demo", description=__doc__,
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
        return smollm2_demo([a for a in argv if a != "--smollm2"])
    if "--roman" not in argv:
        return links_demo(argv)
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
