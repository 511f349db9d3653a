"""The installed package as vLLM sees it: entry point, dormant plugin, CPU cache layout probe."""

from __future__ import annotations

from importlib.metadata import entry_points

import pytest
import torch

pytestmark = pytest.mark.vllm


def test_entry_point_loads_and_register_is_idempotent() -> None:
    (ep,) = [e for e in entry_points(group="vllm.general_plugins") if e.name == "hogwild"]
    assert ep.value == "vllm_hogwild.plugin:register"
    register = ep.load()
    register()
    register()
    from vllm_hogwild import plugin

    assert plugin.is_registered()


def test_vllm_loads_the_plugin() -> None:
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    from vllm_hogwild import plugin

    assert plugin.is_registered()


def test_vllm_pinned_to_the_supported_minor() -> None:
    import vllm

    assert vllm.__version__.startswith("0.32."), vllm.__version__


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("block_size", [32, 128])
def test_cpu_layout_probe_matches_the_kernel(dtype: torch.dtype, block_size: int) -> None:
    """The probe's answer reads back what vLLM's own writer stored, through our reader. On a CPU with AMX, vLLM
    packs a bfloat16 cache for AMX tiles: the probe refuses it, naming the settings that avoid it."""
    from vllm import _custom_ops as ops
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    from vllm_hogwild.runner.cpu_layout import UnknownCacheLayout, probe_k_transposed
    from vllm_hogwild.attention.kv_layout import CpuPagedKV

    head_dim, heads, num_blocks = 64, 3, 4
    isa = _get_attn_isa(dtype, block_size, head_dim)
    if isa == "amx":
        with pytest.raises(UnknownCacheLayout, match=r"^dtype bfloat16, block_size \d+: .*ISA 'amx'.*--dtype float32"):
            probe_k_transposed(isa, dtype, block_size, head_dim)
        return
    k_transposed = probe_k_transposed(isa, dtype, block_size, head_dim)
    cache = torch.zeros(num_blocks, heads, block_size, 2 * head_dim, dtype=dtype)
    key_cache, value_cache = cache.view(num_blocks, heads, 2 * block_size, head_dim).chunk(2, dim=2)
    slots = torch.randperm(num_blocks * block_size)[:50]
    key = torch.randn(50, heads, head_dim).to(dtype)
    value = torch.randn(50, heads, head_dim).to(dtype)
    ops.cpu_attn_reshape_and_cache(key, value, key_cache, value_cache, slots, isa)
    k_t, v = CpuPagedKV(cache, k_transposed).gather(slots // block_size)
    rows = torch.arange(50)
    offsets = slots % block_size
    assert torch.equal(k_t[rows, :, :, offsets], key)
    assert torch.equal(v[rows, :, offsets, :], value)
