"""Which segment-attention path runs, per platform and VLLM_HOGWILD_ATTENTION (pure)."""

from __future__ import annotations

import pytest

from vllm_hogwild.attention.paths import resolve
from vllm_hogwild.core.errors import HogwildOptionError


def _resolve(platform, requested, op=True, triton=True, interpreting=False):
    return resolve(platform, requested, cpu_op_loads=lambda: op, triton_imports=lambda: triton,
                   interpreting=interpreting)


@pytest.mark.parametrize("platform,requested,op,triton,interpreting,expected", [
    ("cpu", None, True, True, False, "cpu-op"),
    ("cpu", None, False, True, False, "torch"),  # no compiler: the PyTorch path, with a warning
    ("cpu", "torch", True, True, False, "torch"),
    ("cpu", "cpu-op", True, False, False, "cpu-op"),
    ("cpu", "triton", True, True, True, "triton"),  # the CUDA flow under Triton's interpreter
    ("cuda", None, False, True, False, "triton"),
    ("cuda", None, False, False, False, "torch"),
    ("cuda", "torch", False, True, False, "torch"),
    ("cuda", "triton", False, True, False, "triton"),
])
def test_paths_that_can_run(platform, requested, op, triton, interpreting, expected) -> None:
    assert _resolve(platform, requested, op, triton, interpreting) == expected


@pytest.mark.parametrize("platform,requested,op,triton,interpreting,message", [
    ("cpu", "cpu-op", False, True, False, "could not be built"),
    ("cpu", "triton", True, True, False, "TRITON_INTERPRET=1"),
    ("cpu", "triton", True, False, True, "TRITON_INTERPRET=1"),
    ("cuda", "cpu-op", True, True, False, "CPU only"),
    ("cuda", "triton", True, False, False, "not installed"),
    ("cpu", "flash", True, True, False, "unknown path"),
])
def test_an_explicit_path_that_cannot_run_is_refused_naming_the_variable(platform, requested, op, triton,
                                                                         interpreting, message) -> None:
    with pytest.raises(HogwildOptionError, match=message) as info:
        _resolve(platform, requested, op, triton, interpreting)
    assert info.value.parameter == "VLLM_HOGWILD_ATTENTION"


def test_platforms_without_a_hogwild_worker_are_refused() -> None:
    with pytest.raises(HogwildOptionError) as info:
        _resolve("tpu", None)
    assert info.value.parameter == "additional_config.hogwild"
