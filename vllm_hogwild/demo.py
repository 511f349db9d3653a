"""The main job: a Hogwild group of 2 workers on the embedded default model.

    python -m vllm_hogwild.demo [--workers N] [--prompt TEXT] [--max-tokens N]

Both workers decode in lock-step over one shared KV cache (raw protocol,
contiguous layout: each reads the prompt, the other's tokens and its own).
Their texts are shown as they grow, then the time taken.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

DEFAULT_PROMPT = "Give three ideas for a rainy Sunday afternoon, one per line."
NAMES = ("Alice", "Bob", "Carol", "Dave", "Eve", "Frank", "Grace", "Heidi")


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompt", default=DEFAULT_PROMPT)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=96, help="per worker")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default=None, help="HF folder (default: the embedded SmolLM2-135M-Instruct)")
    args = parser.parse_args()

    from vllm_hogwild.default_model import prepare

    model = args.model or str(prepare())
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    from vllm import LLM, SamplingParams

    t0 = time.perf_counter()
    llm = LLM(model=model, dtype="float32", enforce_eager=True, max_model_len=4096, seed=args.seed,
              additional_config={"hogwild": {"max_workers": max(8, args.workers)}})
    t_start = time.perf_counter() - t0
    tokenizer = llm.get_tokenizer()
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": args.prompt}],
                                           add_generation_prompt=True, tokenize=False)
    params = SamplingParams(n=args.workers, temperature=0.7, top_p=0.95, seed=args.seed,
                            max_tokens=args.max_tokens,
                            extra_args={"hogwild": {"layout": "contiguous", "protocol": "raw"}})
    engine = llm.llm_engine
    board = Board(args.workers)
    t1 = time.perf_counter()
    engine.add_request("hogwild-demo", {"prompt": prompt}, params)
    num_tokens = [0] * args.workers
    while engine.has_unfinished_requests():
        for out in engine.step():
            for completion in out.outputs:
                board.update(completion.index, completion.text)
                num_tokens[completion.index] = len(completion.token_ids)
        board.draw()
    t_gen = time.perf_counter() - t1
    board.draw(final=True)
    print(f"\n=== Hogwild group: {args.workers} workers, one shared KV cache, raw protocol ===")
    print("(raw protocol: each worker reads the others' tokens as they are, with no names or headers;"
          " a 135M model mostly echoes them)")
    print(f"model: {model}\nprompt: {args.prompt}\n")
    for i, text in enumerate(board.texts):
        print(f"--- {NAMES[i]} (worker {i}, {num_tokens[i]} tokens) ---\n{text.strip()}\n")
    total = sum(num_tokens)
    print(f"{total} tokens from {args.workers} workers in {t_gen:.2f} s "
          f"({total / t_gen:.1f} tokens/s, {max(num_tokens)} lock-step decode steps); "
          f"engine start-up {t_start:.1f} s")


if __name__ == "__main__":
    main()
