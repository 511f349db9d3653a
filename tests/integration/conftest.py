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
    from tests.conftest import TEST_VOCAB

    return build_tiny_llama(tmp_path_factory.mktemp("tiny-llama"), vocab_size=TEST_VOCAB)


def make_llm(model: Path | str, **kwargs):
    from vllm import LLM

    args = dict(model=str(model), dtype="float32", enforce_eager=True, max_model_len=2048,
                block_size=BLOCK_SIZE, seed=0)
    args.update(kwargs)
    llm = LLM(**args)
    check_runner(llm)
    return llm


# The model runner class each runner the tests ask for (VLLM_HOGWILD_TEST_RUNNER, tests/conftest.py) runs on the CPU.
RUNNER_CLASSES = {"v1": "vllm.v1.worker.cpu_model_runner.CPUModelRunner",
                  "v2": "vllm.v1.worker.cpu.model_runner.CPUModelRunner"}


def runner_class(llm) -> str:
    """The model runner class of the engine's worker process."""
    def name(worker) -> str:
        runner = worker.model_runner
        return f"{type(runner).__module__}.{type(runner).__qualname__}"

    return llm.collective_rpc(name)[0]


def check_runner(llm) -> None:
    """The engine runs the model runner the tests ask for: a test meant for V2 that ran V1 fails here."""
    from tests.conftest import TEST_RUNNER

    found = runner_class(llm)
    if found != RUNNER_CLASSES[TEST_RUNNER]:
        shutdown(llm)
        raise AssertionError(f"the tests ask for the {TEST_RUNNER.upper()} model runner; the engine runs {found}")


def shutdown(llm) -> None:
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()


@contextmanager
def plain_replay():
    """A control: engines started inside re-feed each lane of a resumed group as a plain prefill of itself."""
    from vllm_hogwild.runner.worker_core import PLAIN_REPLAY_ENV

    os.environ[PLAIN_REPLAY_ENV] = "1"  # read by the worker process as it starts
    try:
        yield
    finally:
        del os.environ[PLAIN_REPLAY_ENV]


def scheduler_of(llm):
    """The engine core's scheduler (in-process engine core, see tests/conftest.py)."""
    return llm.llm_engine.engine_core.engine_core.scheduler
