"""RoPE re-rotation (vllm_hogwild.core.views.rope) against transformers and against vLLM.

- Frequencies and attention factors are compared with transformers'
  ``ROPE_INIT_FUNCTIONS`` (through ``tests.oracle.hf_inv_freq``).
- The production check is composition with vLLM's own rotary embedding, which
  rotates q and k before they reach the KV cache: vLLM's rope at ``p`` followed
  by our rotation by ``delta`` must equal vLLM's rope at ``p + delta``. Those
  tests are marked ``vllm`` and import vLLM inside the test, so this module
  imports without it.
"""

from __future__ import annotations

import contextlib
import math

import pytest
import torch
from transformers import GPT2Config, GPTJConfig, LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from tests.oracle import hf_inv_freq, rotate_by
from vllm_hogwild.core.views.rope import SUPPORTED_ROPE_TYPES, RopeSpec, rotate

ROPES = {
    "default": {"rope_type": "default", "rope_theta": 1e5},
    "linear": {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0},
    "llama3": {
        "rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192,
    },
    "llama3-short": {  # every frequency band populated at head dim 64 and 128
        "rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 64,
    },
    "yarn": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0, "original_max_position_embeddings": 64},
    "yarn-betas": {
        "rope_type": "yarn", "rope_theta": 5e5, "factor": 8.0, "original_max_position_embeddings": 128,
        "beta_fast": 16, "beta_slow": 2,
    },
    "yarn-attention-factor": {
        "rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0, "original_max_position_embeddings": 64,
        "attention_factor": 1.25,
    },
    # DeepSeek-style YaRN: mscale / mscale_all_dim (both given, as DeepSeek-V2/V3 configs do).
    "yarn-deepseek": {
        "rope_type": "yarn", "rope_theta": 1e4, "factor": 40.0, "original_max_position_embeddings": 64,
        "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 0.8,
    },
    "yarn-deepseek-v3": {
        "rope_type": "yarn", "rope_theta": 1e4, "factor": 40.0, "original_max_position_embeddings": 64,
        "mscale": 1.0, "mscale_all_dim": 1.0,
    },
}


def llama_config(params: dict, head_dim: int = 64, partial: float = 1.0) -> LlamaConfig:
    params = dict(params)
    if partial != 1.0:
        params["partial_rotary_factor"] = partial
    orig = params.get("original_max_position_embeddings", 1024)
    max_pos = int(orig * params.get("factor", 1.0)) if params["rope_type"] == "yarn" else 4096
    return LlamaConfig(
        head_dim=head_dim, hidden_size=head_dim * 4, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=max_pos, rope_parameters=params,
    )


@contextlib.contextmanager
def float32_is_float64():
    """Evaluate transformers' RoPE formulas in float64 (they spell float32 as torch.float/float32)."""
    saved = torch.float, torch.float32
    torch.float = torch.float32 = torch.float64
    try:
        yield
    finally:
        torch.float, torch.float32 = saved


def hf_inv_freq_f64(config: LlamaConfig) -> tuple[torch.Tensor, float]:
    rope_type = config.rope_parameters.get("rope_type", "default")
    if rope_type == "default":
        return hf_inv_freq(config)  # already float64 in the oracle
    with float32_is_float64():
        inv_freq, factor = ROPE_INIT_FUNCTIONS[rope_type](config, "cpu")
    assert inv_freq.dtype == torch.float64  # the formula really ran in float64
    return inv_freq, float(factor)


def max_rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    return ((a.to(torch.float64) - ref.to(torch.float64)).abs() / ref.to(torch.float64).abs()).max().item()


# ---------------------------------------------------------------- frequencies vs transformers


@pytest.mark.parametrize("rope", list(ROPES))
@pytest.mark.parametrize("partial", [1.0, 0.5])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_inv_freq_matches_transformers(rope: str, partial: float, head_dim: int) -> None:
    config = llama_config(ROPES[rope], head_dim, partial)
    spec = RopeSpec.from_hf_config(config)
    ref, ref_factor = hf_inv_freq_f64(config)
    assert spec.head_dim == head_dim
    assert spec.rotary_dim == int(head_dim * partial) == 2 * spec.inv_freq.numel()
    assert spec.is_neox_style
    assert spec.inv_freq.dtype == torch.float64
    assert max_rel(spec.inv_freq, ref) <= 1e-12
    # The oracle as the other tests use it (transformers' own float32 arithmetic).
    ref32, factor32 = hf_inv_freq(config)
    assert max_rel(spec.inv_freq, ref32) <= 1e-6
    assert spec.attention_factor == pytest.approx(ref_factor, rel=1e-12)
    assert spec.attention_factor == pytest.approx(factor32, rel=1e-12)


def test_inv_freq_reference_is_discriminating() -> None:
    """The comparison above can fail: frequencies of neighbouring kinds differ by far more than 1e-12."""
    base = RopeSpec.from_hf_config(llama_config(ROPES["yarn"])).inv_freq
    other = RopeSpec.from_hf_config(llama_config({**ROPES["yarn"], "factor": 4.5})).inv_freq
    assert max_rel(base, other) > 1e-3
    assert max_rel(
        RopeSpec.from_hf_config(llama_config(ROPES["llama3-short"])).inv_freq,
        RopeSpec.from_hf_config(llama_config(ROPES["default"] | {"rope_theta": 5e5})).inv_freq,
    ) > 1e-3


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ({}, 0.1 * math.log(4.0) + 1.0),
        ({"attention_factor": 1.25}, 1.25),
        ({"mscale": 1.0, "mscale_all_dim": 1.0}, 1.0),
        ({"mscale": 0.707, "mscale_all_dim": 0.707}, 1.0),
        ({"mscale": 1.0, "mscale_all_dim": 0.8}, (0.1 * math.log(4.0) + 1.0) / (0.08 * math.log(4.0) + 1.0)),
        ({"factor": 1.0}, 1.0),
    ],
)
def test_yarn_attention_factor(extra: dict, expected: float) -> None:
    config = llama_config({**ROPES["yarn"], **extra})
    spec = RopeSpec.from_hf_config(config)
    assert spec.attention_factor == pytest.approx(expected, rel=1e-12)
    assert spec.attention_factor == pytest.approx(hf_inv_freq(config)[1], rel=1e-12)


@pytest.mark.parametrize("extra", [{"mscale": 0.707}, {"mscale_all_dim": 1.0}])
def test_yarn_attention_factor_with_one_mscale_key(extra: dict) -> None:
    config = llama_config({**ROPES["yarn"], **extra})
    assert RopeSpec.from_hf_config(config).attention_factor == pytest.approx(hf_inv_freq(config)[1], rel=1e-12)


@pytest.mark.parametrize("head_dim", [64, 128])
def test_yarn_truncate_false(head_dim: int) -> None:
    config = llama_config({**ROPES["yarn"], "truncate": False}, head_dim)
    ref, _ = hf_inv_freq_f64(config)
    assert max_rel(RopeSpec.from_hf_config(config).inv_freq, ref) <= 1e-12


# ---------------------------------------------------------------- composition with vLLM's rotary embedding

VLLM_ROPES = ["default", "linear", "llama3-short", "llama3", "yarn", "yarn-betas", "yarn-attention-factor",
              "yarn-deepseek"]


def _vllm_rope(params: dict, head_dim: int, neox: bool, max_position: int):
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.rotary_embedding import get_rope

    with set_current_vllm_config(VllmConfig()):
        return get_rope(head_dim, max_position, is_neox_style=neox, rope_parameters=dict(params),
                        dtype=torch.float32)


def _positions_and_deltas(max_pos: int, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    p = torch.randint(0, max_pos, (n,), generator=gen)
    target = torch.randint(0, max_pos, (n,), generator=gen)
    p[:4] = torch.tensor([0, max_pos - 1, 5, max_pos - 1])
    target[:4] = torch.tensor([max_pos - 1, 0, 5, max_pos - 2])  # + max, - max, zero, -1
    return p, target - p


def _check_composition(params: dict, head_dim: int, partial: float, neox: bool, method: str,
                       max_pos: int = 256, tol: float = 2e-5) -> None:
    params = dict(params)
    if partial != 1.0:
        params["partial_rotary_factor"] = partial
    rope = _vllm_rope(params, head_dim, neox, max_pos)
    assert rope.cos_sin_cache.shape[0] >= max_pos
    spec = RopeSpec.from_hf_config(llama_config(params, head_dim), is_neox_style=neox)
    assert spec.rotary_dim == rope.rotary_dim
    forward = {"native": rope.forward_native, "cpu": rope.forward_cpu}[method]

    n, hq, hkv = 64, 4, 2
    p, delta = _positions_and_deltas(max_pos, n, seed=head_dim + int(partial * 10) + neox)
    assert (delta < 0).any() and (delta > 0).any() and (p + delta >= 0).all()
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(n, hq * head_dim, generator=gen)
    k = torch.randn(n, hkv * head_dim, generator=gen)

    q_p, k_p = forward(p, q.clone(), k.clone())  # the CPU build has both; a missing op or method is a failure
    q_pd, k_pd = forward(p + delta, q.clone(), k.clone())

    cos, sin = spec.cos_sin(delta)
    for x_p, x_pd, h in ((q_p, q_pd, hq), (k_p, k_pd, hkv)):
        moved = rotate(x_p.view(n, h, head_dim), cos, sin, spec)
        ref = x_pd.view(n, h, head_dim)
        err = ((moved - ref).abs().max() / ref.abs().max()).item()
        assert err <= tol, f"composition error {err:.2e}"
        # YaRN's mscale is carried by vLLM's cos/sin: applied once at p, never again.
        assert moved.norm() == pytest.approx(x_p.norm().item(), rel=1e-5)
    if hasattr(rope, "mscale"):
        assert spec.attention_factor == pytest.approx(rope.mscale, rel=1e-6)


@pytest.mark.vllm
@pytest.mark.parametrize("rope", VLLM_ROPES)
@pytest.mark.parametrize("head_dim", [64, 128])
def test_composes_with_vllm_rope_neox(rope: str, head_dim: int) -> None:
    _check_composition(ROPES[rope], head_dim, 1.0, neox=True, method="native")


@pytest.mark.vllm
@pytest.mark.parametrize("rope", ["default", "linear", "llama3-short", "yarn"])
@pytest.mark.parametrize("neox", [True, False])
def test_composes_with_vllm_rope_partial_and_gptj(rope: str, neox: bool) -> None:
    _check_composition(ROPES[rope], 128, 0.5, neox=neox, method="native")
    _check_composition(ROPES[rope], 64, 1.0, neox=neox, method="native")


@pytest.mark.vllm
@pytest.mark.parametrize("rope", ["default", "yarn"])
def test_composes_with_vllm_rope_cpu_kernel(rope: str) -> None:
    """The platform kernel (what CPU serving runs when the custom op is enabled)."""
    _check_composition(ROPES[rope], 64, 1.0, neox=True, method="cpu")


@pytest.mark.vllm
def test_composes_with_vllm_deepseek_yarn() -> None:
    """vLLM's DeepSeek models turn 'yarn' into 'deepseek_yarn': same frequencies, same mscale."""
    params = dict(ROPES["yarn-deepseek"])
    rope = _vllm_rope({**params, "rope_type": "deepseek_yarn"}, 64, True, 256)
    spec = RopeSpec.from_hf_config(llama_config(params, 64))
    assert spec.attention_factor == pytest.approx(rope.mscale, rel=1e-6)
    n = 32
    p, delta = _positions_and_deltas(256, n, seed=3)
    q = torch.randn(n, 2, 64, generator=torch.Generator().manual_seed(0))  # [T, H, D] for this class
    k = torch.randn(n, 1, 64, generator=torch.Generator().manual_seed(1))
    q_p, _ = rope.forward_native(p, q.clone(), k.clone())
    q_pd, _ = rope.forward_native(p + delta, q.clone(), k.clone())
    cos, sin = spec.cos_sin(delta)
    moved = rotate(q_p, cos, sin, spec)
    ref = q_pd
    assert ((moved - ref).abs().max() / ref.abs().max()).item() <= 2e-5


@pytest.mark.vllm
def test_composes_with_vllm_yarn_truncate_false() -> None:
    _check_composition({**ROPES["yarn"], "truncate": False}, 64, 1.0, neox=True, method="native")


@pytest.mark.vllm
def test_composition_check_is_discriminating() -> None:
    """Dividing the mscale out twice (or applying it again) would be caught."""
    params = ROPES["yarn"]
    rope = _vllm_rope(params, 64, True, 256)
    spec = RopeSpec.from_hf_config(llama_config(params, 64))
    assert rope.mscale > 1.1
    p = torch.tensor([10, 100])
    delta = torch.tensor([7, -50])
    q = torch.randn(2, 64, generator=torch.Generator().manual_seed(0))
    q_p, _ = rope.forward_native(p, q.clone(), q.clone())
    q_pd, _ = rope.forward_native(p + delta, q.clone(), q.clone())
    cos, sin = spec.cos_sin(delta)
    twice = rotate(q_p.view(2, 1, 64), cos * rope.mscale, sin * rope.mscale, spec)
    assert ((twice - q_pd.view(2, 1, 64)).abs().max() / q_pd.abs().max()).item() > 0.05
    off_by_one = rotate(q_p.view(2, 1, 64), *spec.cos_sin(delta + 1), spec)
    assert ((off_by_one - q_pd.view(2, 1, 64)).abs().max() / q_pd.abs().max()).item() > 1e-3


# ---------------------------------------------------------------- rotate()


def _spec(neox: bool = True, head_dim: int = 64, partial: float = 1.0, rope: str = "llama3-short") -> RopeSpec:
    return RopeSpec.from_hf_config(llama_config(ROPES[rope], head_dim, partial), is_neox_style=neox)


@pytest.mark.parametrize("neox", [True, False])
@pytest.mark.parametrize("partial", [1.0, 0.5])
def test_rotate_inverse_and_norm(neox: bool, partial: float) -> None:
    spec = _spec(neox, 128, partial)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(40, 3, 128, generator=gen, dtype=torch.float64)
    delta = torch.randint(-5000, 5000, (40,), generator=gen)
    cos, sin = spec.cos_sin(delta, torch.float64)
    y = rotate(x, cos, sin, spec)
    back = rotate(y, *spec.cos_sin(-delta, torch.float64), spec)
    torch.testing.assert_close(back, x, rtol=0, atol=1e-12)
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1), rtol=1e-13, atol=0)
    r = spec.rotary_dim
    assert torch.equal(y[..., r:], x[..., r:])  # dims past rotary_dim untouched, bit for bit
    assert not torch.allclose(y[..., :r], x[..., :r])
    # Rotating by a then by b is rotating by a + b.
    b = torch.randint(-5000, 5000, (40,), generator=gen)
    twice = rotate(y, *spec.cos_sin(b, torch.float64), spec)
    torch.testing.assert_close(twice, rotate(x, *spec.cos_sin(delta + b, torch.float64), spec), rtol=0, atol=1e-9)
    # Zero delta is the identity; the input is never modified.
    x_copy = x.clone()
    torch.testing.assert_close(rotate(x, *spec.cos_sin(torch.zeros(40, dtype=torch.long)), spec).double(), x)
    assert torch.equal(x, x_copy)


@pytest.mark.parametrize("partial", [1.0, 0.5])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_rotate_styles_match_oracle(partial: float, head_dim: int) -> None:
    gen = torch.Generator().manual_seed(head_dim)
    x = torch.randn(20, 2, head_dim, generator=gen, dtype=torch.float64)
    delta = torch.randint(-3000, 3000, (20,), generator=gen)
    outs = {}
    for neox in (True, False):
        spec = _spec(neox, head_dim, partial, rope="yarn")
        assert spec.is_neox_style is neox
        cos, sin = spec.cos_sin(delta, torch.float64)
        outs[neox] = rotate(x, cos, sin, spec)
        ref_inv_freq, _ = hf_inv_freq_f64(llama_config(ROPES["yarn"], head_dim, partial))
        torch.testing.assert_close(outs[neox], rotate_by(x, delta, ref_inv_freq, neox), rtol=0, atol=1e-9)
        # float32 cos/sin as the attention path uses them.
        cos32, sin32 = spec.cos_sin(delta)
        assert cos32.dtype == torch.float32 and cos32.shape == (20, spec.rotary_dim // 2)
        out32 = rotate(x.float(), cos32, sin32, spec)
        torch.testing.assert_close(out32.double(), outs[neox], rtol=0, atol=1e-5)
    assert (outs[True] - outs[False]).abs().max() > 0.1  # GPT-J and NeoX pair different dims


def test_cos_sin_is_a_pure_rotation_for_yarn() -> None:
    """cos^2 + sin^2 == 1: the attention factor is never multiplied in."""
    spec = _spec(rope="yarn")
    assert spec.attention_factor > 1.1
    cos, sin = spec.cos_sin(torch.arange(-300, 300), torch.float64)
    torch.testing.assert_close(cos**2 + sin**2, torch.ones_like(cos), rtol=0, atol=1e-14)


# ---------------------------------------------------------------- refusals


def _dict_config(**kw) -> dict:
    return {"model_type": "llama", "hidden_size": 512, "num_attention_heads": 8, **kw}


@pytest.mark.parametrize(
    "config",
    [
        GPT2Config().to_dict(),
        GPT2Config(),
        {"model_type": "bloom", "hidden_size": 512, "n_head": 8},
        {"model_type": "mpt", "d_model": 512, "n_heads": 8},
        {"model_type": "falcon", "hidden_size": 512, "num_attention_heads": 8, "alibi": True},
    ],
    ids=["gpt2-dict", "gpt2-object", "bloom", "mpt", "falcon-alibi"],
)
def test_no_rope_is_refused(config) -> None:
    with pytest.raises(ValueError, match="rope_type"):
        RopeSpec.from_hf_config(config)


LONGROPE = {
    "rope_type": "longrope", "rope_theta": 1e4, "short_factor": [1.0] * 32, "long_factor": [2.0] * 32,
    "original_max_position_embeddings": 64,
}


@pytest.mark.parametrize(
    ("params", "name"),
    [
        (LONGROPE, "longrope"),
        ({"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0}, "dynamic"),
        ({"rope_type": "mrope", "rope_theta": 1e4, "mrope_section": [8, 12, 12]}, "mrope"),
        ({"rope_type": "default", "rope_theta": 1e4, "mrope_section": [8, 12, 12]}, "mrope"),
        ({"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0, "mrope_section": [8, 12, 12],
          "original_max_position_embeddings": 64}, "mrope"),
        ({"rope_type": "proportional", "rope_theta": 1e4}, "proportional"),
        ({"rope_type": "ntk", "rope_theta": 1e4, "factor": 2.0}, "ntk"),
    ],
    ids=["longrope", "dynamic", "mrope", "mrope_section", "yarn-mrope_section", "proportional", "ntk"],
)
def test_unsupported_rope_types_are_refused(params: dict, name: str) -> None:
    with pytest.raises(ValueError, match="rope_type") as info:
        RopeSpec.from_hf_config(_dict_config(rope_parameters=params))
    assert name in str(info.value)
    # The older format names the type under rope_scaling ("type" or "rope_type").
    scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    with pytest.raises(ValueError, match=name):
        RopeSpec.from_hf_config(_dict_config(rope_theta=1e4, rope_scaling=scaling))
    if "rope_type" in scaling and name != "mrope":
        legacy = {("type" if k == "rope_type" else k): v for k, v in scaling.items()}
        with pytest.raises(ValueError, match=name):
            RopeSpec.from_hf_config(_dict_config(rope_theta=1e4, rope_scaling=legacy))


def test_longrope_config_object_is_refused() -> None:
    config = LlamaConfig(hidden_size=512, num_attention_heads=8, max_position_embeddings=256,
                         rope_parameters=dict(LONGROPE))
    with pytest.raises(ValueError, match="longrope"):
        RopeSpec.from_hf_config(config)


def test_per_layer_type_rope_is_refused() -> None:
    params = {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
              "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}
    with pytest.raises(ValueError, match="rope_type"):
        RopeSpec.from_hf_config(_dict_config(rope_parameters=params))


def test_supported_types() -> None:
    assert set(SUPPORTED_ROPE_TYPES) == {"default", "linear", "llama3", "yarn"}


# ---------------------------------------------------------------- config formats


def test_object_and_dict_agree() -> None:
    for name in ROPES:
        config = llama_config(ROPES[name], 64, 0.5)
        a, b = RopeSpec.from_hf_config(config), RopeSpec.from_hf_config(config.to_dict())
        assert (a.head_dim, a.rotary_dim, a.is_neox_style, a.attention_factor) == (
            b.head_dim, b.rotary_dim, b.is_neox_style, b.attention_factor)
        assert torch.equal(a.inv_freq, b.inv_freq)


def test_older_format_top_level_rope_theta_and_scaling() -> None:
    old = {"model_type": "llama", "hidden_size": 576, "num_attention_heads": 9, "rope_theta": 1e4,
           "rope_scaling": {"rope_type": "linear", "factor": 2.0}}
    spec = RopeSpec.from_hf_config(old)
    assert spec.head_dim == 64 and spec.rotary_dim == 64 and spec.is_neox_style
    expected = 1.0 / 1e4 ** (torch.arange(0, 64, 2, dtype=torch.float64) / 64) / 2.0
    assert max_rel(spec.inv_freq, expected) <= 1e-14
    # "type" (older still) instead of "rope_type".
    older = {**old, "rope_scaling": {"type": "linear", "factor": 2.0}}
    assert torch.equal(RopeSpec.from_hf_config(older).inv_freq, spec.inv_freq)
    # No scaling at all, and rope_scaling None.
    plain = RopeSpec.from_hf_config({**old, "rope_scaling": None})
    assert max_rel(plain.inv_freq, expected * 2.0) <= 1e-14
    # transformers converts the same keyword arguments into rope_parameters: same spec.
    config = LlamaConfig(hidden_size=576, num_attention_heads=9, rope_theta=1e4,
                         rope_scaling={"rope_type": "linear", "factor": 2.0})
    assert torch.equal(RopeSpec.from_hf_config(config).inv_freq, spec.inv_freq)
    ref, _ = hf_inv_freq_f64(config)
    assert max_rel(spec.inv_freq, ref) <= 1e-12


def test_head_dim_and_partial_rotary_sources() -> None:
    # Explicit head_dim wins over hidden_size / heads.
    spec = RopeSpec.from_hf_config(_dict_config(head_dim=128, rope_theta=1e4))
    assert spec.head_dim == 128 and spec.rotary_dim == 128
    # Top-level partial_rotary_factor (older configs), rotary_pct (GPT-NeoX), rotary_dim.
    assert RopeSpec.from_hf_config(_dict_config(rope_theta=1e4, partial_rotary_factor=0.5)).rotary_dim == 32
    assert RopeSpec.from_hf_config(
        {"model_type": "gpt_neox", "hidden_size": 512, "num_attention_heads": 8, "rotary_pct": 0.25,
         "rope_theta": 1e4}).rotary_dim == 16
    assert RopeSpec.from_hf_config(_dict_config(rope_theta=1e4, rotary_dim=16)).rotary_dim == 16
    with pytest.raises(ValueError, match="partial_rotary_factor"):
        RopeSpec.from_hf_config(_dict_config(rope_theta=1e4, partial_rotary_factor=0.3))


def test_style_follows_model_type_unless_given() -> None:
    assert RopeSpec.from_hf_config(_dict_config(rope_theta=1e4)).is_neox_style
    assert not RopeSpec.from_hf_config(_dict_config(rope_theta=1e4), is_neox_style=False).is_neox_style
    gptj_like = {"model_type": "gptj", "hidden_size": 512, "num_attention_heads": 8, "rotary_dim": 32,
                 "rope_theta": 1e4}
    spec = RopeSpec.from_hf_config(gptj_like)
    assert not spec.is_neox_style and spec.rotary_dim == 32 and spec.head_dim == 64


def test_stock_gptj_config() -> None:
    spec = RopeSpec.from_hf_config(GPTJConfig(n_embd=256, n_head=4, rotary_dim=32))
    assert not spec.is_neox_style and spec.head_dim == 64 and spec.rotary_dim == 32
    expected = 1.0 / 1e4 ** (torch.arange(0, 32, 2, dtype=torch.float64) / 32)
    assert max_rel(spec.inv_freq, expected) <= 1e-14
