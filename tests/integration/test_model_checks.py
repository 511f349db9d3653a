"""Models Hogwild cannot serve run as stock vLLM; their Hogwild requests are refused, naming the reason."""

from __future__ import annotations

import pytest

from tests.integration.conftest import make_llm
from tests.integration.tiny_model import build_tiny_gpt2

pytestmark = pytest.mark.vllm


def test_model_without_rope_serves_plain_requests_and_refuses_hogwild(tmp_path) -> None:
    from vllm import SamplingParams

    from tests.integration.conftest import scheduler_of, shutdown

    llm = make_llm(build_tiny_gpt2(tmp_path), additional_config={"hogwild": {}})
    try:
        assert type(scheduler_of(llm)).__module__ == "vllm.v1.core.sched.scheduler"  # stock engine
        bad = SamplingParams(n=2, temperature=1.0, max_tokens=4, extra_args={"hogwild_layout": "contiguous"})
        with pytest.raises(ValueError, match="^hogwild_layout: .*rope_type: model type 'gpt2' has no rotary"):
            llm.generate([{"prompt_token_ids": [1, 2, 3]}], bad, use_tqdm=False)
        ok = llm.generate([{"prompt_token_ids": [1, 2, 3]}], SamplingParams(max_tokens=4), use_tqdm=False)
        assert len(ok[0].outputs[0].token_ids) == 4
    finally:
        shutdown(llm)


def test_unknown_engine_option_is_refused(tiny_model) -> None:
    with pytest.raises(ValueError, match="additional_config.hogwild.max_wrkers"):
        make_llm(tiny_model, additional_config={"hogwild": {"max_wrkers": 4}})
