"""RoPE re-rotation of queries by integer position deltas.

The KV cache holds keys already rotated at their stored positions and the
attention backend receives queries already rotated at theirs. Moving a query by
``delta`` positions is one more rotation by ``delta * inv_freq``: rotations
compose, so only the frequencies matter here. Scaled RoPE kinds whose cos/sin
carry an attention factor (YaRN's ``mscale``) apply it to q and k once, at
their stored positions; the re-rotation is a pure rotation, so that factor is
divided out exactly once by never multiplying it in.

Frequencies follow vLLM's rotary embeddings (``vllm/model_executor/layers/
rotary_embedding``) for the kinds supported: ``default``, ``linear``,
``llama3`` and ``yarn`` (DeepSeek's YaRN shares its frequencies). No vLLM import.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import torch

from vllm_hogwild.core.errors import HogwildOptionError

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn")

# Model families whose rotary embedding rotates interleaved pairs (GPT-J style).
# Everything else in vLLM's Llama-like families is NeoX style (rotate halves).
INTERLEAVED_MODEL_TYPES = frozenset({"gptj", "codegen"})

@dataclass(frozen=True)
class RopeSpec:
    """What re-rotating a query needs: the frequencies and the pair layout.

    ``inv_freq``: shape ``[rotary_dim // 2]``, float64.
    ``attention_factor``: the factor the model's cos/sin carry (1 unless YaRN);
    kept for references and tests, never applied by :func:`rotate`.
    """

    head_dim: int
    rotary_dim: int
    is_neox_style: bool
    inv_freq: torch.Tensor
    attention_factor: float = 1.0

    @classmethod
    def from_hf_config(cls, config: Any, is_neox_style: bool | None = None) -> "RopeSpec":
        """Build from a ``transformers`` config object or its ``to_dict()``.

        Reads ``rope_parameters`` (transformers >= 5) or ``rope_theta`` plus
        ``rope_scaling`` (older), ``head_dim`` and ``partial_rotary_factor`` /
        ``rotary_dim`` / ``rotary_pct``. Raises ``ValueError`` naming the rope
        type for kinds this module cannot re-rotate exactly (a
        :class:`~vllm_hogwild.core.errors.HogwildOptionError`, a ``ValueError``).
        """
        cfg = config if isinstance(config, Mapping) else config.to_dict()
        model_type = cfg.get("model_type", "?")
        params = _rope_params(cfg)
        if params is None:
            raise HogwildOptionError(
                "rope_type", f"model type {model_type!r} has no rotary position "
                "embedding (RoPE); Hogwild needs RoPE to move queries between positions"
            )
        rope_type = params.get("rope_type", params.get("type", "default")) or "default"
        if "mrope_section" in params or rope_type in ("mrope", "mrope_interleaved"):
            rope_type = "mrope"
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise HogwildOptionError(
                "rope_type", f"{rope_type!r} (model type {model_type!r}) is not supported; "
                f"supported rope types: {', '.join(SUPPORTED_ROPE_TYPES)}"
            )
        head_dim = _head_dim(cfg)
        rotary_dim = _rotary_dim(cfg, head_dim)
        if is_neox_style is None:
            is_neox_style = model_type not in INTERLEAVED_MODEL_TYPES
        base = float(params["rope_theta"])
        inv_freq = _base_inv_freq(base, rotary_dim)
        factor = float(params.get("factor", 1.0))
        attention_factor = 1.0
        if rope_type == "linear":
            inv_freq = inv_freq / factor
        elif rope_type == "llama3":
            inv_freq = _llama3_inv_freq(inv_freq, params)
        elif rope_type == "yarn":
            inv_freq = _yarn_inv_freq(base, rotary_dim, params, cfg)
            attention_factor = _yarn_attention_factor(params)
        return cls(head_dim, rotary_dim, is_neox_style, inv_freq, attention_factor)

    def cos_sin(self, delta: torch.Tensor, dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin of ``delta * inv_freq``; ``delta``: ``[P]`` ints -> ``[P, rotary_dim // 2]`` each."""
        angle = delta.to(torch.float64)[:, None] * self.inv_freq.to(delta.device)[None, :]
        return angle.cos().to(dtype), angle.sin().to(dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, spec: RopeSpec) -> torch.Tensor:
    """Rotate vectors by per-row angles (a pure rotation, no attention factor).

    x: ``[P, H, head_dim]``; cos, sin: ``[P, rotary_dim // 2]`` -> ``[P, H, head_dim]``.
    Dimensions past ``rotary_dim`` pass through unchanged.
    """
    r = spec.rotary_dim
    cos, sin = cos[:, None, :], sin[:, None, :]  # [P, 1, r/2]
    out = x.clone()
    if spec.is_neox_style:
        x1, x2 = x[..., : r // 2], x[..., r // 2 : r]
        out[..., : r // 2] = x1 * cos - x2 * sin
        out[..., r // 2 : r] = x2 * cos + x1 * sin
    else:
        x1, x2 = x[..., 0:r:2], x[..., 1:r:2]
        out[..., 0:r:2] = x1 * cos - x2 * sin
        out[..., 1:r:2] = x2 * cos + x1 * sin
    return out


def _rope_params(cfg: Mapping[str, Any]) -> dict | None:
    params = cfg.get("rope_parameters")
    if isinstance(params, Mapping) and "rope_theta" not in params and params:
        # Per-layer-type parameters (e.g. {"full_attention": {...}}) mean
        # layers with different RoPE: not one spec.
        first = next(iter(params.values()))
        if isinstance(first, Mapping):
            raise HogwildOptionError(
                "rope_type", f"per-layer-type RoPE ({sorted(params)}) is not supported"
            )
    if isinstance(params, Mapping) and "rope_theta" in params:
        return dict(params)
    theta = cfg.get("rope_theta")
    if theta is None:
        if cfg.get("model_type") not in INTERLEAVED_MODEL_TYPES:
            return None
        theta = 10000.0  # GPT-J / CodeGen configs carry no base; vLLM uses 10000
    scaling = cfg.get("rope_scaling") or {}
    return {"rope_theta": theta, **scaling}


def _head_dim(cfg: Mapping[str, Any]) -> int:
    head_dim = cfg.get("head_dim")
    if head_dim:
        return int(head_dim)
    hidden = cfg.get("hidden_size") or cfg["n_embd"]
    heads = cfg.get("num_attention_heads") or cfg["n_head"]
    return int(hidden) // int(heads)


def _rotary_dim(cfg: Mapping[str, Any], head_dim: int) -> int:
    if cfg.get("rotary_dim"):
        return int(cfg["rotary_dim"])
    params = cfg.get("rope_parameters") or {}
    factor = params.get("partial_rotary_factor") or cfg.get("partial_rotary_factor")
    factor = factor or cfg.get("rotary_pct") or 1.0
    rotary_dim = int(head_dim * float(factor))
    if rotary_dim % 2 or not 0 < rotary_dim <= head_dim:
        raise HogwildOptionError("partial_rotary_factor", f"rotary dim {rotary_dim} of head dim {head_dim}")
    return rotary_dim


def _base_inv_freq(base: float, rotary_dim: int) -> torch.Tensor:
    exponent = torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim
    return 1.0 / (base**exponent)


def _llama3_inv_freq(inv_freq: torch.Tensor, p: Mapping[str, Any]) -> torch.Tensor:
    factor = float(p["factor"])
    low, high = float(p["low_freq_factor"]), float(p["high_freq_factor"])
    old_len = float(p["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv_freq
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    out = torch.where(wavelen > old_len / low, inv_freq / factor, smoothed)
    return torch.where(wavelen < old_len / high, inv_freq, out)


def _yarn_inv_freq(base: float, rotary_dim: int, p: Mapping[str, Any], cfg) -> torch.Tensor:
    factor = float(p["factor"])
    old_len = p.get("original_max_position_embeddings") or cfg["max_position_embeddings"]
    beta_fast, beta_slow = float(p.get("beta_fast", 32)), float(p.get("beta_slow", 1))

    def correction_dim(num_rotations: float) -> float:
        return rotary_dim * math.log(old_len / (num_rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if p.get("truncate", True):  # gpt-oss sets False: keep the range fractional
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, rotary_dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(rotary_dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    extrapolation = 1 - ramp  # 1: keep the original frequency, 0: interpolate
    pos_freqs = base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)
    return (1 / (factor * pos_freqs)) * (1 - extrapolation) + (1 / pos_freqs) * extrapolation


def _yarn_attention_factor(p: Mapping[str, Any]) -> float:
    if p.get("attention_factor") is not None:
        return float(p["attention_factor"])
    factor = float(p["factor"])

    def get_mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if p.get("mscale") and p.get("mscale_all_dim"):  # DeepSeek's YaRN
        return get_mscale(factor, float(p.get("mscale", 1))) / get_mscale(
            factor, float(p.get("mscale_all_dim", 0))
        )
    return get_mscale(factor)
