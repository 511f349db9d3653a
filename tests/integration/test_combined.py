"""The combined and interleaved layouts on a real vLLM engine against the dense oracle.

Steps end where the configured ``step_end`` pattern matches the worker's text;
on the tiny random model a frequent pattern (a token with an "e") makes many
steps, so the shared history changes nearly every step. The step ends the
oracle uses are found here from the output tokens, independently of the
plugin's tracker.
"""

from __future__ import annotations

import re

import pytest
import torch

from tests.hogwild_oracle import DenseHogwild
from tests.integration.conftest import make_llm, scheduler_of, shutdown
from tests.integration.test_offline import hogwild_params, prompt_ids, sampled_logprobs

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

STEP_END = "e"
CASES = [("combined", 2, 45), ("combined", 3, 64), ("interleaved", 3, 45)]


def step_ends(tokenizer, tokens: list[int]) -> list[int]:
    """Token i ends a step iff the pattern matches text that token i completes, since the last end."""
    ends, since = [], ""
    for i, t in enumerate(tokens):
        before, since = since, since + tokenizer.decode([t])
        if any(m.end() > len(before) for m in re.finditer(STEP_END, since)):
            ends.append(i)
            since = ""
    return ends


@pytest.fixture(scope="module")
def runs(tiny_model):
    llm = make_llm(tiny_model, additional_config={"hogwild": {"max_workers": 4}})
    try:
        prompts = [{"prompt_token_ids": prompt_ids(p, seed=500 + i)} for i, (_, _, p) in enumerate(CASES)]
        params = []
        for i, (layout, n, _) in enumerate(CASES):
            sp = hogwild_params(n, 40, seed=50 + i, layout=layout)
            sp.extra_args["hogwild"]["step_end"] = STEP_END
            params.append(sp)
        outputs = llm.generate(prompts, params, use_tqdm=False)
        assert scheduler_of(llm).stats.num_member_preemptions == 0
        tokenizer = llm.get_tokenizer()
        yield [(p["prompt_token_ids"], out) for p, out in zip(prompts, outputs)], tokenizer
    finally:
        shutdown(llm)


@pytest.fixture(scope="module")
def oracle(tiny_model):
    from transformers import AutoModelForCausalLM

    return DenseHogwild(AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32))


@pytest.mark.parametrize("case", range(len(CASES)))
def test_step_layouts_match_the_dense_oracle(runs, oracle, case: int) -> None:
    results, tokenizer = runs
    layout, n, _ = CASES[case]
    prompt, out = results[case]
    tokens = [list(c.token_ids) for c in out.outputs]
    ends = [step_ends(tokenizer, t) for t in tokens]
    assert all(len(e) >= 5 for e in ends), "the pattern should cut many steps"
    expected = oracle.logprobs(prompt, tokens, layout=layout, step_ends=ends)
    got = [sampled_logprobs(c) for c in out.outputs]
    err = max(abs(a - b) for g, e in zip(got, expected) for a, b in zip(g, e))
    assert err <= 1e-4, f"max |logprob - oracle| = {err:.2e}"
    # The oracle can tell: the same tokens scored with another layout disagree.
    other = "contiguous" if layout == "combined" else "combined"
    wrong = oracle.logprobs(prompt, tokens, layout=other, step_ends=ends)
    assert max(abs(a - b) for g, e in zip(got, wrong) for a, b in zip(g, e)) > 1e-3
