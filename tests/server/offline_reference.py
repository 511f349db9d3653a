"""The offline results the server must reproduce: ``python -m tests.server.offline_reference MODEL CASES OUT``.

Runs in its own process with the server's environment, so both use the same
engine-process layout and thread count. CASES is a JSON list of
``{"route": "completions" | "chat", "prompt" | "messages", "n", "seed",
"temperature", "top_p", "top_k", "max_tokens", "extra_args"}``; OUT gets, for
each case, ``{"texts": [...], "num_tokens": [...], "prompt_tokens": int}``
(worker order).
"""

from __future__ import annotations

import json
import sys


def main(model: str, cases_path: str, out_path: str) -> None:
    from vllm import LLM, SamplingParams

    llm = LLM(model=model, dtype="float32", max_model_len=2048, enforce_eager=True,
              additional_config={"hogwild": {"max_workers": 4}})
    results = []
    for case in json.load(open(cases_path)):
        params = SamplingParams(
            n=case["n"], seed=case["seed"], temperature=case["temperature"], top_p=case["top_p"],
            top_k=case["top_k"], max_tokens=case["max_tokens"], extra_args=case.get("extra_args"),
        )
        if case["route"] == "chat":
            (out,) = llm.chat(case["messages"], params, use_tqdm=False)
        else:
            (out,) = llm.generate([case["prompt"]], params, use_tqdm=False)
        outputs = sorted(out.outputs, key=lambda o: o.index)
        results.append({
            "texts": [o.text for o in outputs],
            "num_tokens": [len(o.token_ids) for o in outputs],
            "prompt_tokens": len(out.prompt_token_ids),
        })
    json.dump(results, open(out_path, "w"))


if __name__ == "__main__":
    main(*sys.argv[1:4])
