"""The SmolLM2 collab demo (``python -m vllm_hogwild.tools.demo --smollm2``): the embedded general model as a
Hogwild group, its texts drawn as they grow (:mod:`vllm_hogwild.tools.demo` runs the trained collaborators)."""

from __future__ import annotations

import argparse
import os
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
