"""The engine a user gets by default (torch.compile, no enforce_eager) runs Hogwild groups exactly too.

vLLM's attention is an opaque op inside the compiled graph, so the plugin's
metadata builder and segment-attention rows run as in eager mode; this checks
it against the dense oracle on the tiny model.
"""

from __future__ import annotations

import pytest
import torch

from tests.hogwild_oracle import DenseHogwild
from tests.integration.conftest import make_llm, shutdown
from tests.integration.test_offline import hogwild_params, prompt_ids, sampled_logprobs

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_compiled_engine_matches_dense_oracle(tiny_model) -> None:
    from transformers import AutoModelForCausalLM

    llm = make_llm(tiny_model, enforce_eager=False, additional_config={"hogwild": {}})
    try:
        assert not llm.llm_engine.vllm_config.model_config.enforce_eager
        cases = [(2, 45), (3, 64)]
        prompts = [{"prompt_token_ids": prompt_ids(p, seed=7 + i)} for i, (_, p) in enumerate(cases)]
        outputs = llm.generate(prompts, [hogwild_params(n, 32, seed=70 + i) for i, (n, _) in enumerate(cases)],
                               use_tqdm=False)
    finally:
        shutdown(llm)
    oracle = DenseHogwild(AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32))
    for prompt, out in zip(prompts, outputs):
        tokens = [list(c.token_ids) for c in out.outputs]
        expected = oracle.logprobs(prompt["prompt_token_ids"], tokens)
        got = [sampled_logprobs(c) for c in out.outputs]
        err = max(abs(a - b) for g, e in zip(got, expected) for a, b in zip(g, e))
        assert err <= 1e-4, f"max |logprob - oracle| = {err:.2e}"
