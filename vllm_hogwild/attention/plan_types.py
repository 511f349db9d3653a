"""A step's attention plan, as every path of :mod:`vllm_hogwild.attention.segment_attention` carries it: which
path runs it (:class:`PlanMode`) and that path's payload. Types only; the planners are
:mod:`~vllm_hogwild.attention.step_plan` (the torch and Triton paths) and :mod:`~vllm_hogwild.attention.cpu_plan`
(the compiled CPU op), both from the step's columns.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

import torch

from vllm_hogwild.core.views.rope import RopeSpec

if TYPE_CHECKING:
    from vllm_hogwild.attention.step_plan import ItemPlan


class PlanMode(Enum):
    """Which path runs a plan; each names the payload it carries."""

    TORCH = "torch"  # the item plan run in PyTorch (any rows, any cache, any device)
    TRITON = "triton"  # the item plan run by the Triton kernels (any rows, any cache)
    CPU_OP = "cpu-op"  # the compiled CPU op (rows of up to 16 tokens, vLLM's CPU cache)


@dataclass
class DecodeCSR:
    """Single-token rows as compressed lists, for the compiled CPU op: rows -> pairs -> pieces."""

    row_token: torch.Tensor  # [R]
    row_pair_ptr: torch.Tensor  # [R + 1] each row's pairs (one per segment)
    pair_piece_ptr: torch.Tensor  # [P + 1] each pair's pieces (one per block it touches)
    piece_block: torch.Tensor  # [Q] physical block
    piece_lo: torch.Tensor  # [Q] first offset read in the block
    piece_hi: torch.Tensor  # [Q] one past the last


@dataclass
class SegmentAttentionPlan:
    """Per-step tensors shared by every layer.

    ``mode`` says which payload is set: ``items`` (``TORCH``, ``TRITON``: the step's pairs and items in
    buffers that persist from step to step) or ``csr`` (``CPU_OP``, with the pairs' tokens and rotations).
    """

    mode: PlanMode
    num_tokens: int  # T: rows of the query tensor this plan may touch
    rope: RopeSpec
    items: "ItemPlan | None" = None  # TORCH, TRITON
    csr: DecodeCSR | None = None  # CPU_OP
    out_tokens: torch.Tensor | None = None  # CPU_OP: [T_out] query tokens that get an output
    pair_token: torch.Tensor | None = None  # CPU_OP: [P] query token of each pair
    pair_cos: torch.Tensor | None = None  # CPU_OP: [P, rotary_dim / 2]
    pair_sin: torch.Tensor | None = None
