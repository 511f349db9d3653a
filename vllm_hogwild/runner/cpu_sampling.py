"""Two fixes to vLLM 0.32's rejection sampler on the CPU, installed by a Hogwild worker with speculative decoding.

Without Triton, vLLM runs the rejection sampler's Triton kernels through CPU
fallbacks it registers with its kernel dispatcher
(``CpuPlatform.register_triton_kernel_overrides``). Two of them fail:

- **expand.** ``vllm/utils/cpu_triton_utils.py:_expand_kernel_impl`` hands the
  C++ op an int64 *copy* of its output (``_ensure_int64`` copies any tensor that
  is not int64) and of its input. The op fills the copy; the caller's tensor
  stays as ``new_empty`` left it. ``expand_batch_to_tokens`` uses the kernel
  for the float32 per-token temperature and for top-k and top-p, so every
  draft was judged, and every recovered token drawn, at garbage temperatures
  (values such as ``1e-36`` or ``9e9``): drafts were almost never accepted
  under random sampling, and the text it drew was noise. Greedy requests and
  logprobs (computed from the raw logits) were unaffected. :func:`expand`
  writes the caller's tensor, in its dtype.
- **top-k over no rows.** In a step whose requests verify no drafts, the
  target logits have no rows, and ``topk_topp_sampler.apply_top_k_only``
  takes ``k.max()`` of an empty tensor (``RuntimeError``: the engine dies).
  :func:`apply_top_k_only` returns the empty logits as they are.

:func:`install` probes each bug first and replaces only what is broken, so a
vLLM that has fixed one keeps its own. ``patches/11-cpu-rejection-sampler.patch``
is the upstream fix of both.
"""

from __future__ import annotations

import functools
import logging

import torch

from vllm_hogwild.core.log import get_logger

logger = get_logger(__name__)

EXPAND_KERNEL = "vllm.v1.sample.rejection_sampler.expand_kernel"


def expand(output: torch.Tensor, input_val: torch.Tensor, cu_num_tokens: torch.Tensor, replace_from, replace_to,
           MAX_NUM_TOKENS=None) -> None:  # noqa: N803  (the Triton kernel's parameter name)
    """``output[cu[i-1]:cu[i]] = input[i]`` (``replace_to`` where ``input[i] == replace_from``), in place.

    The Triton kernel's contract (``rejection_sampler.expand_kernel``); positions
    past ``cu[-1]`` are left alone, as the kernel leaves them."""
    if input_val.numel() == 0:
        return
    values = torch.where(input_val == replace_from, torch.as_tensor(replace_to, dtype=input_val.dtype), input_val)
    cu = cu_num_tokens.to(torch.long)
    counts = torch.diff(cu, prepend=cu.new_zeros(1))
    output[: int(cu[-1])] = torch.repeat_interleave(values, counts).to(output.dtype)


def _expand_is_broken(impl) -> bool:
    """Whether vLLM's fallback leaves a float output unwritten (or wrong, or fails)."""
    output = torch.full((3,), -1.0)
    try:
        impl(output, torch.tensor([0.25, 0.0]), torch.tensor([2, 3], dtype=torch.int32), 0.0, 1.0)
    except Exception:  # noqa: BLE001  (a fallback that cannot run is as broken as one that writes nothing)
        return True
    return not torch.equal(output, torch.tensor([0.25, 0.25, 1.0]))


def _top_k_fails_on_no_rows(fn) -> bool:
    try:
        fn(torch.empty(0, 4), torch.empty(0, dtype=torch.int32))
    except RuntimeError:
        return True
    return False


def install() -> list[str]:
    """Replace what is broken in this process's CPU rejection sampler; the names of what was replaced."""
    from vllm.triton_utils import HAS_TRITON

    if HAS_TRITON:  # vLLM registers no CPU fallbacks then: the Triton kernels run
        return []
    from vllm.triton_utils import dispatcher
    from vllm.v1.sample import rejection_sampler
    from vllm.v1.sample.ops import topk_topp_sampler

    replaced = []
    registered = getattr(rejection_sampler.expand_kernel, "func", None)
    if registered is not None and registered is not expand and _expand_is_broken(registered):
        quiet = logging.getLogger(dispatcher.__name__)
        level = quiet.level
        quiet.setLevel(logging.ERROR)  # its "already registered. Overwriting." is this replacement
        try:
            dispatcher.register_kernels({EXPAND_KERNEL: expand})
        finally:
            quiet.setLevel(level)
        replaced.append(EXPAND_KERNEL)
    original = topk_topp_sampler.apply_top_k_only
    if getattr(original, "_hogwild_original", None) is None and _top_k_fails_on_no_rows(original):
        topk_topp_sampler.apply_top_k_only = _guard_no_rows(original)
        replaced.append(f"{topk_topp_sampler.__name__}.apply_top_k_only")
    if replaced:
        logger.info("Hogwild: fixed vLLM's CPU rejection sampler (%s; the upstream fix is "
                    "patches/11-cpu-rejection-sampler.patch in the source tree)", ", ".join(replaced))
    return replaced


def _guard_no_rows(original):
    @functools.wraps(original)
    def apply_top_k_only(logits: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        if logits.shape[0] == 0:
            return logits
        return original(logits, k)

    apply_top_k_only._hogwild_original = original  # type: ignore[attr-defined]
    return apply_top_k_only
