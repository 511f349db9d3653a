"""Models Hogwild cannot serve are refused when the engine is configured, naming the field."""

from __future__ import annotations

import pytest

from tests.integration.conftest import make_llm

pytestmark = pytest.mark.vllm


def _tiny_gpt2(folder):
    import shutil

    from transformers import GPT2Config, GPT2LMHeadModel

    from tests.integration.tiny_model import TOKENIZER_FILES
    from vllm_hogwild.default_model import prepare

    GPT2LMHeadModel(GPT2Config(vocab_size=49152, n_embd=64, n_layer=1, n_head=2, n_positions=4096)).save_pretrained(folder)
    for name in TOKENIZER_FILES:
        if (prepare(verbose=False) / name).exists():
            shutil.copy(prepare(verbose=False) / name, folder / name)
    return folder


def test_model_without_rope_is_refused(tmp_path) -> None:
    with pytest.raises(ValueError, match="rope_type: model type 'gpt2' has no rotary"):
        make_llm(_tiny_gpt2(tmp_path), additional_config={"hogwild": {}})


def test_unknown_engine_option_is_refused(tiny_model) -> None:
    with pytest.raises(ValueError, match="additional_config.hogwild.max_wrkers"):
        make_llm(tiny_model, additional_config={"hogwild": {"max_wrkers": 4}})
