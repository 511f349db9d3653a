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

STOCK_SCRIPT = """
import json, sys
from tests.integration.conftest import make_llm, scheduler_of
from vllm import SamplingParams
def main():
    llm = make_llm(sys.argv[1])
    outs = llm.generate([{"prompt_token_ids": p} for p in json.loads(sys.argv[2])],
                        SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, logprobs=0), use_tqdm=False)
    print("RESULT" + json.dumps({"scheduler": type(scheduler_of(llm)).__module__,
        "outputs": [[list(c.token_ids), [c.logprobs[i][t].logprob for i, t in enumerate(c.token_ids)]]
                    for o in outs for c in o.outputs]}))
if __name__ == "__main__":
    main()
"""


@pytest.fixture(scope="module")
def llm(tiny_model):
    engine = make_llm(tiny_model)
    yield engine
    shutdown(engine)


def test_outputs_identical_to_stock_vllm(llm, tiny_model) -> None:
    from vllm import SamplingParams

    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS],
                        SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, logprobs=0), use_tqdm=False)
    ours = [[list(c.token_ids), [c.logprobs[i][t].logprob for i, t in enumerate(c.token_ids)]]
            for o in outs for c in o.outputs]
    # Stock vLLM: same install, the plugin kept out by vLLM's own allow-list.
    env = {**os.environ, "VLLM_PLUGINS": "none"}
    proc = subprocess.run([sys.executable, "-c", STOCK_SCRIPT, str(tiny_model), json.dumps(PROMPTS)],
                          env=env, capture_output=True, text=True, timeout=600, cwd=os.getcwd())
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")]
    assert line, proc.stderr[-3000:]
    stock = json.loads(line[-1][len("RESULT"):])
    assert stock["outputs"] == ours  # bit for bit: tokens and logprobs
    assert stock["scheduler"] == type(scheduler_of(llm)).__module__ == "vllm.v1.core.sched.scheduler"


def test_hogwild_request_without_the_switch_is_refused(llm) -> None:
    from vllm import SamplingParams

    from vllm_hogwild import plugin

    assert plugin.is_registered()  # installed and loaded, yet dormant
    bad = SamplingParams(n=2, temperature=1.0, max_tokens=4, extra_args={"hogwild": {}})
    with pytest.raises(ValueError, match="hogwild: Hogwild is not switched on"):
        llm.generate([{"prompt_token_ids": PROMPTS[0]}], bad, use_tqdm=False)
    ok = llm.generate([{"prompt_token_ids": PROMPTS[0]}], SamplingParams(max_tokens=4), use_tqdm=False)
    assert len(ok[0].outputs[0].token_ids) == 4


def test_a_hogwild_engine_after_a_stock_engine_in_one_process(llm, tiny_model) -> None:
    """vLLM caches its attention backend per process; the Hogwild engine must still get its own."""
    from transformers import AutoModelForCausalLM
    import torch

    from tests.hogwild_oracle import DenseHogwild
    from tests.integration.test_offline import hogwild_params, sampled_logprobs

    assert type(scheduler_of(llm)).__module__ == "vllm.v1.core.sched.scheduler"  # the stock engine lives on
    hogwild = make_llm(tiny_model, additional_config={"hogwild": {}})
    try:
        (out,) = hogwild.generate([{"prompt_token_ids": PROMPTS[0]}], hogwild_params(2, 16, seed=4), use_tqdm=False)
    finally:
        shutdown(hogwild)
    tokens = [list(c.token_ids) for c in out.outputs]
    oracle = DenseHogwild(AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32))
    expected = oracle.logprobs(PROMPTS[0], tokens)
    got = [sampled_logprobs(c) for c in out.outputs]
    assert max(abs(a - b) for g, e in zip(got, expected) for a, b in zip(g, e)) <= 1e-4
