"""The switch: ``additional_config["hogwild"]`` turns an engine into a Hogwild engine, or it stays stock.

With the switch, :func:`create_engine_config` refuses models and settings
Hogwild cannot serve (naming them), selects Hogwild's scheduler, worker and
logits processor through vLLM's own knobs, decides the attention path
(:mod:`vllm_hogwild.attention.paths`) and the metrics channel for every process
of the engine, and turns async scheduling off with speculative decoding. Without it, vLLM runs as if the
plugin were not installed. A model Hogwild cannot serve (no RoPE, ...) is
served as stock vLLM and its Hogwild requests are refused, naming the reason.
"""

from __future__ import annotations

from vllm_hogwild.attention.kv_layout import FP8_DTYPES
from vllm_hogwild.attention.paths import resolve_here
from vllm_hogwild.core.options import RUNTIME_KEY, HogwildOptionError
from vllm_hogwild.core.stats_channel import new_address
from vllm_hogwild.core.log import get_logger

logger = get_logger(__name__)

SCHEDULER_CLS = "vllm_hogwild.scheduler.scheduler.HogwildScheduler"
CPU_WORKER_CLS = "vllm_hogwild.runner.worker.HogwildCPUWorker"
CUDA_WORKER_CLS = "vllm_hogwild.runner.worker_cuda.HogwildGPUWorker"
DEFAULT_SCHEDULER_CLS = (None, "vllm.v1.core.sched.scheduler.Scheduler")


def select_classes(engine_args, platform=None) -> None:
    """Set vLLM's own knobs for Hogwild: scheduler and worker classes, the attention backend and path.

    ``platform``: vLLM's ``current_platform`` (a stand-in in tests).
    """
    if platform is None:
        from vllm.platforms import current_platform as platform

    if engine_args.scheduler_cls not in DEFAULT_SCHEDULER_CLS and engine_args.scheduler_cls != SCHEDULER_CLS:
        raise HogwildOptionError("scheduler_cls", "Hogwild brings its own scheduler; leave scheduler_cls unset")
    if engine_args.worker_cls not in ("auto", CPU_WORKER_CLS, CUDA_WORKER_CLS):
        raise HogwildOptionError("worker_cls", "Hogwild brings its own worker; leave worker_cls unset")
    if platform.is_cpu():
        engine_args.worker_cls = CPU_WORKER_CLS
        path = resolve_here("cpu")
    elif platform.is_cuda():
        engine_args.worker_cls = CUDA_WORKER_CLS
        _select_flash_attention(engine_args)
        # Whichever model runner vLLM chooses (select_runner). CUDA graphs stay on: on the Triton path the
        # Hogwild builders support full graphs for decode batches (their plan lives in buffers a graph captures),
        # on the torch path piecewise graphs only (docs/architecture.md, "CUDA graphs").
        path = resolve_here("cuda")
    else:
        raise HogwildOptionError("additional_config.hogwild",
                                 f"no Hogwild worker for platform {platform.device_name!r} yet")
    engine_args.scheduler_cls = SCHEDULER_CLS
    # Async scheduling stays as vLLM would have it: the scheduler becomes HogwildAsyncScheduler, whose groups sit
    # out the steps scheduled before their last output is in (docs/architecture.md). Not with speculative
    # decoding: the table cuts accepted runs where text is forced, beside the placeholders vLLM counts; unchecked.
    if engine_args.speculative_config:
        if engine_args.async_scheduling:
            raise HogwildOptionError("async_scheduling", "Hogwild runs speculative decoding without async "
                                     "scheduling (docs/architecture.md); leave it unset or turn it off")
        engine_args.async_scheduling = False
    # Decisions every process of this engine follows: the attention path (and the CPU op's vector path),
    # the metrics channel.
    runtime = {"attention": path, "stats": new_address()}
    if path == "cpu-op":  # which of the op's vector paths (VLLM_HOGWILD_CPU_ISA, else the widest)
        from vllm_hogwild.attention.cpu_ops import choose

        runtime["isa"] = choose()
    engine_args.additional_config = {**engine_args.additional_config, RUNTIME_KEY: runtime}


# The logits processor that forces the tokens the engine forces, per model runner (runner/v1.py, runner/v2.py).
LOGITS_PROCESSORS = {"v1": "vllm_hogwild.runner.v1:V1ForcedTokens", "v2": "vllm_hogwild.runner.v2:V2ForcedTokens"}


def select_runner(config) -> str:
    """Once vLLM has built the engine's config: the model runner it chose (``"v1"`` or ``"v2"``; the switch
    forces neither), recorded for every process of the engine, and the logits processor of that runner's
    interface added for the tokens the engine forces."""
    runner = "v2" if getattr(config, "use_v2_model_runner", True) else "v1"  # (vLLM 0.34 has V2 only)
    config.additional_config[RUNTIME_KEY]["runner"] = runner
    processors = list(config.model_config.logits_processors or [])
    # vLLM's V1 runner takes no custom logits processor with speculative decoding: its adapter forces tokens in
    # the sampler then (runner/v1.py). V2's rejection sampler runs custom processors itself.
    if runner == "v2" or not config.speculative_config:
        for other in LOGITS_PROCESSORS.values():
            if other in processors:
                processors.remove(other)
        config.model_config.logits_processors = [*processors, LOGITS_PROCESSORS[runner]]
    return runner


def _select_flash_attention(engine_args) -> None:
    """CUDA: Hogwild drives vLLM's FlashAttention backend; choose it unless the user chose another."""
    chosen = engine_args.attention_backend or getattr(engine_args.attention_config, "backend", None)
    name = getattr(chosen, "name", chosen)
    if name is None:
        engine_args.attention_backend = "FLASH_ATTN"  # vLLM would pick FlashInfer first on Blackwell GPUs
    elif str(name).upper() != "FLASH_ATTN":
        raise HogwildOptionError(
            "attention_backend", f"{name} has no Hogwild implementation; on CUDA Hogwild runs on FLASH_ATTN "
            "(leave --attention-backend unset or set it to FLASH_ATTN)")


def check_model(model_config) -> None:
    """Refuse models whose attention Hogwild cannot re-position (raises naming the field)."""
    from vllm_hogwild.core.views.rope import RopeSpec

    hf = model_config.hf_text_config
    RopeSpec.from_hf_config(hf)  # no RoPE, MRoPE, LongRoPE, ...: raises naming the field
    if model_config.get_sliding_window() is not None or getattr(hf, "layer_types", None) and any(
        t != "full_attention" for t in hf.layer_types
    ):
        raise HogwildOptionError("sliding_window", "models with sliding-window or non-attention layers are not supported")


# Proposers whose drafts depend on the lane's own tokens only (an EAGLE head or MTP would read the target's
# hidden states of rows that read co-workers; not built, so refused).
SPECULATIVE_METHODS = ("ngram", "draft_model")


def check_engine(config, platform=None) -> None:
    """Refuse engine settings Hogwild cannot run with (raises naming the flag)."""
    if platform is None:
        from vllm.platforms import current_platform as platform

    cache_dtype = config.cache_config.cache_dtype
    if cache_dtype not in ("auto", None, *FP8_DTYPES):
        raise HogwildOptionError("kv_cache_dtype", f"{cache_dtype!r}: Hogwild reads an unquantized cache ('auto') or "
                                 f"an FP8 one ({', '.join(repr(k) for k in FP8_DTYPES)})")
    import torch

    if platform.is_cuda() and config.model_config.dtype not in (torch.float16, torch.bfloat16):
        raise HogwildOptionError(
            "dtype", f"{config.model_config.dtype} on CUDA: FlashAttention, which Hogwild drives there, takes "
            "float16 or bfloat16 (use --dtype bfloat16); float32 runs on the CPU")
    spec = config.speculative_config
    if spec is not None and spec.method not in SPECULATIVE_METHODS:
        raise HogwildOptionError(
            "speculative_config", f"method {spec.method!r} is not supported with Hogwild; it runs with "
            f"{' or '.join(SPECULATIVE_METHODS)} (docs/user_guide.md, speculative decoding)")
