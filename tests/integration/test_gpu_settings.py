"""What the switch asks of vLLM on a GPU, checked on the CPU: no enforce_eager, full CUDA graphs kept (Triton path),
FlashAttention chosen, fp32 and foreign backends refused; and the start-up checks of every attention layer.

vLLM's CUDA platform cannot be imported from the CPU build, so these tests hand the switch a
stand-in platform object; everything else is vLLM's own code (its CompilationConfig resolves
the CUDA-graph mode exactly as the GPU model runner asks it to).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from vllm_hogwild.core.errors import HogwildOptionError

pytestmark = pytest.mark.vllm


class FakeCuda:
    device_name = "cuda"

    @staticmethod
    def is_cpu() -> bool:
        return False

    @staticmethod
    def is_cuda() -> bool:
        return True


def _engine_args(**kw):
    from vllm.engine.arg_utils import EngineArgs

    return EngineArgs(model="unused", additional_config={"hogwild": {}}, **kw)


def test_on_cuda_the_switch_keeps_graphs_and_chooses_flash_attention(monkeypatch) -> None:
    from vllm_hogwild import switch as hooks

    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    monkeypatch.delenv("VLLM_HOGWILD_ATTENTION", raising=False)
    args = _engine_args()
    hooks.select_classes(args, FakeCuda)
    assert args.enforce_eager is False  # torch.compile and CUDA graphs stay on, for every request
    assert args.worker_cls == hooks.CUDA_WORKER_CLS and args.scheduler_cls == hooks.SCHEDULER_CLS
    assert args.attention_backend == "FLASH_ATTN"  # not FlashInfer, which vLLM picks first on Blackwell
    assert args.async_scheduling is None  # vLLM decides, as without the plugin (on by default on CUDA)
    assert args.additional_config["hogwild_runtime"]["attention"] == "triton"
    import os

    assert os.environ["VLLM_USE_V2_MODEL_RUNNER"] == "1"  # the switch forces no runner: vLLM's choice stands


def _config(use_v2: bool | None, speculative: bool = False, processors=None) -> SimpleNamespace:
    config = SimpleNamespace(additional_config={"hogwild_runtime": {}}, speculative_config=object() if speculative
                             else None, model_config=SimpleNamespace(logits_processors=processors))
    if use_v2 is not None:  # vLLM 0.34 has no such property: V2 is its only runner
        config.use_v2_model_runner = use_v2
    return config


@pytest.mark.parametrize("use_v2, speculative, runner, processor", [
    (True, False, "v2", "vllm_hogwild.runner.v2:V2ForcedTokens"),
    (True, True, "v2", "vllm_hogwild.runner.v2:V2ForcedTokens"),  # V2's rejection sampler runs processors
    (None, False, "v2", "vllm_hogwild.runner.v2:V2ForcedTokens"),  # vLLM 0.34
    (False, False, "v1", "vllm_hogwild.runner.v1:V1ForcedTokens"),
    (False, True, "v1", None),  # V1 takes no custom processor with speculative decoding: its sampler forces
])
def test_the_switch_follows_the_runner_vllm_chose(use_v2, speculative, runner, processor) -> None:
    from vllm_hogwild import switch as hooks

    config = _config(use_v2, speculative, processors=["user.mod:Theirs"])
    assert hooks.select_runner(config) == runner
    assert config.additional_config["hogwild_runtime"]["runner"] == runner
    expected = ["user.mod:Theirs"] + ([processor] if processor else [])
    assert config.model_config.logits_processors == expected


def test_a_worker_refuses_a_runner_without_an_adapter_or_another_than_the_engines() -> None:
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner as V2Runner
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner as V1Runner

    from vllm_hogwild.runner import v1, v2
    from vllm_hogwild.runner.worker import adapter_for

    v1_runner, v2_runner = object.__new__(V1Runner), object.__new__(V2Runner)
    assert adapter_for(v1_runner, "v1") is v1 and adapter_for(v2_runner, "v2") is v2
    with pytest.raises(HogwildOptionError) as info:
        adapter_for(v1_runner, "v2")
    assert info.value.parameter == "VLLM_USE_V2_MODEL_RUNNER"
    with pytest.raises(HogwildOptionError) as info:
        adapter_for(object(), "v2")
    assert info.value.parameter == "model runner" and "builtins.object" in str(info.value)


@pytest.mark.parametrize("asked", [None, True, False])
def test_async_scheduling_stays_as_asked_and_is_refused_only_with_speculative_decoding(asked) -> None:
    from vllm_hogwild import switch as hooks

    args = _engine_args(async_scheduling=asked)
    hooks.select_classes(args, FakeCuda)
    assert args.async_scheduling is asked
    speculative = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 2}
    if asked:
        with pytest.raises(HogwildOptionError) as info:
            hooks.select_classes(_engine_args(async_scheduling=asked, speculative_config=speculative), FakeCuda)
        assert info.value.parameter == "async_scheduling"
    else:
        args = _engine_args(async_scheduling=asked, speculative_config=speculative)
        hooks.select_classes(args, FakeCuda)
        assert args.async_scheduling is False  # vLLM would turn it on for ngram: Hogwild keeps it off, said in docs


@pytest.mark.parametrize("backend", ["FLASHINFER", "TRITON_ATTN", "FLEX_ATTENTION"])
def test_on_cuda_another_backend_is_refused_naming_it(backend) -> None:
    from vllm_hogwild import switch as hooks

    with pytest.raises(HogwildOptionError, match=backend) as info:
        hooks.select_classes(_engine_args(attention_backend=backend), FakeCuda)
    assert info.value.parameter == "attention_backend"
    hooks.select_classes(_engine_args(attention_backend="FLASH_ATTN"), FakeCuda)  # the one that works


@pytest.mark.parametrize("dtype,refused", [(torch.float32, True), (torch.bfloat16, False), (torch.float16, False)])
def test_on_cuda_float32_is_refused_naming_dtype(dtype, refused) -> None:
    from vllm_hogwild import switch as hooks

    config = SimpleNamespace(cache_config=SimpleNamespace(cache_dtype="auto"), speculative_config=None,
                             model_config=SimpleNamespace(dtype=dtype))
    if refused:
        with pytest.raises(HogwildOptionError, match="bfloat16") as info:
            hooks.check_engine(config, FakeCuda)
        assert info.value.parameter == "dtype"
    else:
        hooks.check_engine(config, FakeCuda)


def _resolved_cudagraph_mode(path: str | None, native=None):
    """The CUDA-graph mode vLLM's GPU runner resolves with the Hogwild FlashAttention builder's support, on the
    attention path ``path`` (None: the switch off); ``native``: FlashAttention's own answer instead of this
    build's (FA2 answers UNIFORM_BATCH, FA3 ALWAYS)."""
    from vllm.config import CompilationConfig
    from vllm.config.compilation import CompilationMode, CUDAGraphMode

    from vllm_hogwild.runner.backend_cuda import HogwildFlashAttentionMetadataBuilder

    compilation = CompilationConfig(mode=CompilationMode.VLLM_COMPILE, cudagraph_mode=CUDAGraphMode.FULL_AND_PIECEWISE)
    compilation.set_splitting_ops_for_v1(all2all_backend="naive", data_parallel_size=1)  # as VllmConfig does
    additional = {"hogwild": {}, "hogwild_runtime": {"attention": path}} if path else {}
    vllm_config = SimpleNamespace(additional_config=additional)
    builder = HogwildFlashAttentionMetadataBuilder
    saved = builder._cudagraph_support
    if native is not None:
        builder._cudagraph_support = native
    try:
        support = builder.get_cudagraph_support(vllm_config, None)
    finally:
        builder._cudagraph_support = saved
    return support, compilation.resolve_cudagraph_mode_and_sizes(support, "FLASH_ATTN", max_num_reqs=16)


def test_the_triton_path_keeps_full_cuda_graphs_for_decode_batches_and_stock_keeps_its_own() -> None:
    """With Hogwild on the Triton path (CUDA's default) vLLM keeps its default FULL_AND_PIECEWISE: full graphs
    for uniform decode batches (plain requests' and Hogwild rows' alike), piecewise for the rest; FA3's ALWAYS is
    held to UNIFORM_BATCH (a prefill chunk or a re-fed row runs piecewise). The torch path (Triton missing)
    plans on the host every step: piecewise only. The switch off: FlashAttention's own answer."""
    from vllm.config.compilation import CUDAGraphMode
    from vllm.v1.attention.backend import AttentionCGSupport

    for native in (None, AttentionCGSupport.ALWAYS, AttentionCGSupport.UNIFORM_BATCH):
        support, mode = _resolved_cudagraph_mode("triton", native)
        assert support == AttentionCGSupport.UNIFORM_BATCH and mode == CUDAGraphMode.FULL_AND_PIECEWISE, native
    support, mode = _resolved_cudagraph_mode("triton", AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE)
    assert support == AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE  # never more than the platform's own
    support, mode = _resolved_cudagraph_mode("torch")
    assert support == AttentionCGSupport.NEVER and mode == CUDAGraphMode.PIECEWISE
    support, mode = _resolved_cudagraph_mode(None)  # the same class with the switch off: stock
    assert support == AttentionCGSupport.UNIFORM_BATCH and mode == CUDAGraphMode.FULL_AND_PIECEWISE


# -- the start-up checks, after the model and its KV cache exist --------------------------------------

def _impl(cls):
    return object.__new__(cls)  # the type is what is checked


def test_start_up_checks_refuse_what_hogwild_would_not_drive() -> None:
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackendImpl

    from vllm_hogwild.runner.backend import HogwildCPUAttentionImpl
    from vllm_hogwild.runner.backend_cuda import HogwildFlashAttentionImpl
    from vllm_hogwild.runner.worker import check_engine_layers

    ours = {"model.layers.0.self_attn.attn": _impl(HogwildCPUAttentionImpl),
            "model.layers.1.self_attn.attn": _impl(HogwildFlashAttentionImpl)}
    check_engine_layers(ours, 1, [32], 32)
    cases = [
        ({**ours, "model.layers.2.self_attn.attn": _impl(CPUAttentionBackendImpl)}, 1, [32], "attention_backend"),
        ({}, 1, [32], "attention_backend"),
        (ours, 2, [32, 32], "kv_cache_groups"),
        (ours, 1, [16], "block_size"),
    ]
    for impls, groups, kernel_blocks, field in cases:
        with pytest.raises(HogwildOptionError) as info:
            check_engine_layers(impls, groups, kernel_blocks, 32)
        assert info.value.parameter == field


@pytest.mark.parametrize("method,refused", [("ngram", False), ("draft_model", False), ("eagle", True),
                                            ("eagle3", True), ("mtp", True), ("medusa", True), ("suffix", True)])
def test_speculative_methods_other_than_ngram_and_draft_model_are_refused(method, refused) -> None:
    from vllm_hogwild import switch as hooks

    config = SimpleNamespace(cache_config=SimpleNamespace(cache_dtype="auto"),
                             speculative_config=SimpleNamespace(method=method),
                             model_config=SimpleNamespace(dtype=torch.bfloat16))
    if refused:
        with pytest.raises(HogwildOptionError, match=method) as info:
            hooks.check_engine(config, FakeCuda)
        assert info.value.parameter == "speculative_config"
    else:
        hooks.check_engine(config, FakeCuda)
