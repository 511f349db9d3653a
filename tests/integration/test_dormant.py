"""Installed but not switched on, the plugin changes nothing in vLLM."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.integration.conftest import make_llm, scheduler_of, shutdown

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

PROMPTS = [[101 + i for i in range(37)], [5000 + 3 * i for i in range(70)]]
# Plain requests as users send them: greedy and seeded sampling, n = 1 and n = 3, with logprobs.
PLAIN_CASES = [
    (0, dict(temperature=0.0, max_tokens=24, logprobs=2)),
    (1, dict(temperature=1.0, seed=7, max_tokens=24, logprobs=2)),
    (0, dict(n=3, temperature=0.8, top_p=0.9, seed=11, max_tokens=20, logprobs=1)),
    (1, dict(n=3, temperature=1.0, top_k=40, seed=12, max_tokens=20, logprobs=0)),
]

STOCK_SCRIPT = """
import json, sys
from tests.integration.conftest import make_llm, scheduler_of
from tests.integration.test_dormant import PLAIN_CASES, PROMPTS, plain_outputs, run_plain_cases
from vllm import SamplingParams
def main():
    llm = make_llm(sys.argv[1])
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS],
                        SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, logprobs=0), use_tqdm=False)
    print("RESULT" + json.dumps({"scheduler": type(scheduler_of(llm)).__module__,
        "outputs": plain_outputs(outs), "cases": plain_outputs(run_plain_cases(llm))}))
if __name__ == "__main__":
    main()
"""


def plain_outputs(outs) -> list:
    """Every completion's tokens and each sampled token's logprob."""
    return [[list(c.token_ids), [c.logprobs[i][t].logprob for i, t in enumerate(c.token_ids)]]
            for o in outs for c in o.outputs]


def run_plain_cases(llm, extra_prompts=(), extra_params=()):
    """PLAIN_CASES in one generate call, after any extra requests (e.g. Hogwild groups) in the same batch."""
    from vllm import SamplingParams

    prompts = [*extra_prompts, *({"prompt_token_ids": PROMPTS[i]} for i, _ in PLAIN_CASES)]
    params = [*extra_params, *(SamplingParams(ignore_eos=True, **kw) for _, kw in PLAIN_CASES)]
    return llm.generate(prompts, params, use_tqdm=False)[len(extra_prompts):]


@pytest.fixture(scope="module")
def llm(tiny_model):
    engine = make_llm(tiny_model)
    yield engine
    shutdown(engine)


@pytest.fixture(scope="module")
def stock(tiny_model) -> dict:
    """Stock vLLM: same install, the plugin kept out by vLLM's own allow-list (in its own process)."""
    env = {**os.environ, "VLLM_PLUGINS": "none"}
    # A hang guard: under 50 s on 2 cores in a whole suite's run; 600 s is 12 times that.
    proc = subprocess.run([sys.executable, "-c", STOCK_SCRIPT, str(tiny_model)],
                          env=env, capture_output=True, text=True, timeout=600, cwd=os.getcwd())
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")]
    assert line, proc.stderr[-3000:]
    return json.loads(line[-1][len("RESULT"):])


def test_outputs_identical_to_stock_vllm(llm, stock) -> None:
    from vllm import SamplingParams

    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS],
                        SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, logprobs=0), use_tqdm=False)
    assert stock["outputs"] == plain_outputs(outs)  # bit for bit: tokens and logprobs
    assert stock["scheduler"] == type(scheduler_of(llm)).__module__ == "vllm.v1.core.sched.scheduler"
    assert stock["cases"] == plain_outputs(run_plain_cases(llm))


def test_hogwild_request_without_the_switch_is_refused(llm) -> None:
    from vllm import SamplingParams

    from vllm_hogwild import plugin

    assert plugin.is_registered()  # installed and loaded, yet dormant
    bad = SamplingParams(n=2, temperature=1.0, max_tokens=4, extra_args={"hogwild": {}})
    with pytest.raises(ValueError, match="hogwild: Hogwild is not switched on"):
        llm.generate([{"prompt_token_ids": PROMPTS[0]}], bad, use_tqdm=False)
    ok = llm.generate([{"prompt_token_ids": PROMPTS[0]}], SamplingParams(max_tokens=4), use_tqdm=False)
    assert len(ok[0].outputs[0].token_ids) == 4


def test_a_hogwild_engine_after_a_stock_engine_in_one_process(llm, tiny_model, stock) -> None:
    """vLLM caches its attention backend per process; the Hogwild engine must still get its own.

    Its plain requests, run in the same batches as Hogwild groups, equal stock vLLM's (an engine
    without the plugin): same tokens, logprobs within 1e-4.
    """
    from transformers import AutoModelForCausalLM
    import torch

    from tests.hogwild_oracle import DenseHogwild
    from tests.integration.test_offline import hogwild_params, prompt_ids, sampled_logprobs

    assert type(scheduler_of(llm)).__module__ == "vllm.v1.core.sched.scheduler"  # the stock engine lives on
    hogwild = make_llm(tiny_model, additional_config={"hogwild": {}})
    try:
        (out,) = hogwild.generate([{"prompt_token_ids": PROMPTS[0]}], hogwild_params(2, 16, seed=4), use_tqdm=False)
        groups = [{"prompt_token_ids": prompt_ids(50, seed=60 + i)} for i in range(2)]
        beside = run_plain_cases(hogwild, groups, [hogwild_params(2, 24, seed=60), hogwild_params(3, 16, seed=61)])
        assert scheduler_of(hogwild).table.stats.ended[-1].num_workers in (2, 3)  # the groups ran in those batches
    finally:
        shutdown(hogwild)
    ours = plain_outputs(beside)
    assert [t for t, _ in ours] == [t for t, _ in stock["cases"]]
    err = max(abs(a - b) for (_, la), (_, lb) in zip(ours, stock["cases"]) for a, b in zip(la, lb))
    assert err <= 1e-4, f"plain requests beside groups vs stock vLLM: max |logprob diff| = {err:.2e}"
    tokens = [list(c.token_ids) for c in out.outputs]
    oracle = DenseHogwild(AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32))
    expected = oracle.logprobs(PROMPTS[0], tokens)
    got = [sampled_logprobs(c) for c in out.outputs]
    assert max(abs(a - b) for g, e in zip(got, expected) for a, b in zip(g, e)) <= 1e-4
