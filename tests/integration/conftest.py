from __future__ import annotations

import gc
import os
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.integration.tiny_model import build_tiny_llama

BLOCK_SIZE = 32


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    return build_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


def make_llm(model: Path | str, **kwargs):
    from vllm import LLM

    args = dict(model=str(model), dtype="float32", enforce_eager=True, max_model_len=2048,
                block_size=BLOCK_SIZE, seed=0)
    args.update(kwargs)
    return LLM(**args)


def shutdown(llm) -> None:
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()


@contextmanager
def plain_replay():
    """A control: engines started inside re-feed each lane of a resumed group as a plain prefill of itself."""
    from vllm_hogwild.runner.runner_hook import PLAIN_REPLAY_ENV

    os.environ[PLAIN_REPLAY_ENV] = "1"  # read by the worker process as it starts
    try:
        yield
    finally:
        del os.environ[PLAIN_REPLAY_ENV]


def scheduler_of(llm):
    """The engine core's scheduler (in-process engine core, see tests/conftest.py)."""
    return llm.llm_engine.engine_core.engine_core.scheduler
