"""The main job: one generation on the embedded default model.

    python -m vllm_hogwild.demo [--prompt TEXT] [--max-tokens N]

Until the vLLM integration lands this is a plain vLLM generation (it says
so); Hogwild groups replace it then.
"""

from __future__ import annotations

import argparse
import os
import time

DEFAULT_PROMPT = "List three facts about the Moon, one per line."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompt", default=DEFAULT_PROMPT)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--model", default=None, help="HF folder (default: the embedded SmolLM2-135M-Instruct)")
    args = parser.parse_args()

    from vllm_hogwild.default_model import prepare

    model = args.model or str(prepare())
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    from vllm import LLM, SamplingParams

    t0 = time.perf_counter()
    llm = LLM(model=model, dtype="float32", enforce_eager=True, max_model_len=4096, seed=0)
    t_load = time.perf_counter() - t0
    messages = [{"role": "user", "content": args.prompt}]
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    t1 = time.perf_counter()
    out = llm.chat(messages, params, use_tqdm=False)[0].outputs[0]
    t_gen = time.perf_counter() - t1
    print("\n=== plain vLLM generation (Hogwild groups arrive with the vLLM integration) ===")
    print(f"model: {model}")
    print(f"prompt: {args.prompt}\n")
    print(out.text.strip())
    n = len(out.token_ids)
    print(f"\n{n} tokens in {t_gen:.2f} s ({n / t_gen:.1f} tokens/s); engine start-up {t_load:.1f} s")


if __name__ == "__main__":
    main()
