"""Dense references for the tests, written from DESIGN.md's definitions.

Nothing here imports the plugin's attention or RoPE code: the oracle gets its
frequencies from ``transformers`` and rotates with complex numbers, so a
mistake in the plugin cannot cancel out in the comparison.
"""

from __future__ import annotations

import torch
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS


def hf_inv_freq(config: LlamaConfig) -> tuple[torch.Tensor, float]:
    """``(inv_freq [rotary_dim / 2] float64, attention_factor)`` as transformers computes them."""
    params = config.rope_parameters
    rope_type = params.get("rope_type", "default")
    if rope_type == "default":
        head_dim = config.head_dim
        dim = int(head_dim * params.get("partial_rotary_factor", 1.0))
        base = params["rope_theta"]
        return 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim), 1.0
    inv_freq, factor = ROPE_INIT_FUNCTIONS[rope_type](config, "cpu")
    return inv_freq.to(torch.float64), float(factor)


def rotate_by(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, neox: bool) -> torch.Tensor:
    """Rotate ``x [T, H, D]`` (float64) by ``positions [T]`` (any sign): each frequency pair as one complex number."""
    r = 2 * inv_freq.numel()
    x = x.to(torch.float64).clone()
    if neox:
        pairs = torch.complex(x[..., : r // 2], x[..., r // 2 : r])
    else:
        pairs = torch.complex(x[..., 0:r:2], x[..., 1:r:2])
    angle = positions.to(torch.float64)[:, None] * inv_freq[None, :]  # [T, r/2]
    turn = torch.polar(torch.ones_like(angle), angle)[:, None, :]  # [T, 1, r/2]
    pairs = pairs * turn
    if neox:
        x[..., : r // 2], x[..., r // 2 : r] = pairs.real, pairs.imag
    else:
        x[..., 0:r:2], x[..., 1:r:2] = pairs.real, pairs.imag
    return x


def dense_view_attention(
    q_stored: torch.Tensor,  # [n, Hq, D] float64, rotated at q_pos (stored positions)
    q_pos: torch.Tensor,  # [n] stored positions of the query tokens in the reader's lane
    q_view_pos: torch.Tensor,  # [n] their view positions
    k_stored: torch.Tensor,  # [L, Hkv, D] float64, the view's keys as stored (rotated at stored_pos)
    v: torch.Tensor,  # [L, Hkv, D]
    stored_pos: torch.Tensor,  # [L]
    view_pos: torch.Tensor,  # [L]
    is_own: torch.Tensor,  # [L] bool: key lies in the reader's own (last) span
    inv_freq: torch.Tensor,
    neox: bool,
    scale: float,
) -> torch.Tensor:
    """Materialize the view: re-rotate stored keys to view positions, softmax attention (float64)."""
    k_view = rotate_by(k_stored, view_pos - stored_pos, inv_freq, neox)
    q_view = rotate_by(q_stored, q_view_pos - q_pos, inv_freq, neox)
    n, hq, d = q_view.shape
    hkv = k_view.shape[1]
    g = hq // hkv
    k_rep = k_view.repeat_interleave(g, dim=1)  # [L, Hq, D]
    v_rep = v.to(torch.float64).repeat_interleave(g, dim=1)
    scores = torch.einsum("nhd,lhd->hnl", q_view, k_rep) * scale  # [Hq, n, L]
    visible = ~is_own[None, :] | (stored_pos[None, :] <= q_pos[:, None])  # [n, L]
    scores = scores.masked_fill(~visible[None], float("-inf"))
    return torch.einsum("hnl,lhd->nhd", scores.softmax(-1), v_rep)
