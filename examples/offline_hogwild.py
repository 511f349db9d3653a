"""Offline Hogwild: N workers answer one prompt over one shared KV cache.

    .venv/bin/python examples/offline_hogwild.py [--workers 4] [--layout contiguous|isolated]

Uses the embedded default model (SmolLM2-135M-Instruct); pass --model for another
RoPE decoder. Prints each worker's text and what the group held.
"""

from __future__ import annotations

import argparse


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--layout", default="contiguous", choices=["contiguous", "isolated"])
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--model", default=None)
    args = parser.parse_args()

    from vllm import LLM, SamplingParams

    from vllm_hogwild.models.default import prepare

    llm = LLM(model=args.model or str(prepare()), dtype="float32", enforce_eager=True, max_model_len=4096,
              additional_config={"hogwild": {"max_workers": 8}})
    prompt = llm.get_tokenizer().apply_chat_template(
        [{"role": "user", "content": "List some fruits and some vegetables."}], add_generation_prompt=True, tokenize=False)
    params = SamplingParams(n=args.workers, temperature=0.8, seed=0, max_tokens=args.max_tokens,
                            extra_args={"hogwild": {"layout": args.layout, "protocol": "raw"}})
    result = llm.generate(prompt, params)[0]
    for i, worker in enumerate(result.outputs):
        print(f"--- worker {i} ({len(worker.token_ids)} tokens) ---\n{worker.text.strip()}\n")


if __name__ == "__main__":
    main()
