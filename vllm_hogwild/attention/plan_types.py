"""A step's attention plan, as every path of :mod:`vllm_hogwild.attention.segment_attention` carries it: which
path runs it (:class:`PlanMode`) and that path's payload. Types only; the planners are
:mod:`~vllm_hogwild.attention.segment_attention` and, for the compiled op, :mod:`~vllm_hogwild.attention.cpu_plan`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import torch

from vllm_hogwild.core.views.rope import RopeSpec


class PlanMode(Enum):
    """Which path runs a plan; each names the payload it carries."""

    BUCKETS = "buckets"  # PyTorch block buckets (any rows, any cache)
    DENSE_DECODE = "dense-decode"  # PyTorch batched decode (single-token rows, small views)
    CPU_OP = "cpu-op"  # the compiled CPU op (single-token rows, vLLM's CPU cache)
    TRITON = "triton"  # the Triton kernel over block buckets (any rows, any cache)


@dataclass
class Bucket:
    block_ids: torch.Tensor  # [U] physical block ids, each once
    reader_pair: torch.Tensor  # [U, R] index into the rotated-query pairs (P = padding)
    reader_token: torch.Tensor  # [U, R] query token of each reader (T = padding)
    key_lo: torch.Tensor  # [U, R] first visible offset within the block
    key_hi: torch.Tensor  # [U, R] one past the last visible offset
    # TRITON: blocks [chunk_starts[c], chunk_starts[c + 1]) form chunk c, blocks with the same readers (the
    # same row of reader_pair), which one program reads in turn for them (None: the PyTorch paths)
    chunk_starts: torch.Tensor | None = None  # [C + 1]


@dataclass
class DecodeBatch:
    """Single-token rows, batched by the lanes they read (G batches, padded).

    Every row of a batch scores all of the batch's gathered keys once per
    segment (K pairs), with an additive mask keeping each pair to its
    segment; one softmax per row over all its pairs and keys. Few large ops
    instead of many small ones: decode rows of one Hogwild group read the same
    few lanes, so the extra masked scores are cheap.
    """

    block_ids: torch.Tensor  # [G, U] physical blocks (padding: block 0, masked)
    pair_index: torch.Tensor  # [G, R, K] into the rotated pairs (P = padding)
    bias: torch.Tensor  # [G, R, K, U * block_size] 0 where the pair sees the key, -inf elsewhere
    row_select: torch.Tensor  # [T_out] flat (g * R + r) of the real rows
    row_token: torch.Tensor  # [T_out] their query tokens


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
    """Per-step tensors shared by every layer. P: (token, segment) pairs.

    ``mode`` says which payload is set: ``buckets`` (``BUCKETS``, ``TRITON``),
    ``decode`` (``DENSE_DECODE``) or ``csr`` (``CPU_OP``).
    """

    mode: PlanMode

    num_tokens: int  # T: rows of the query tensor this plan may touch
    out_tokens: torch.Tensor  # [T_out] query tokens that get an output
    pair_token: torch.Tensor  # [P] query token of each pair
    pair_cos: torch.Tensor  # [P, rotary_dim / 2]
    pair_sin: torch.Tensor  # [P, rotary_dim / 2]
    buckets: list[Bucket]
    rope: RopeSpec
    decode: DecodeBatch | None = None  # DENSE_DECODE
    csr: DecodeCSR | None = None  # CPU_OP
