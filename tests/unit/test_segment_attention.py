"""Segment attention (reference path) against the dense float64 oracle."""

from __future__ import annotations

import dataclasses
import itertools
import math
import random

import pytest
import torch
from transformers import LlamaConfig

from tests.oracle import dense_view_attention, hf_inv_freq
from vllm_hogwild.attention import segment_attention as sa
from vllm_hogwild.core.views.rope import RopeSpec
from tools.synthetic import KV_LAYOUTS, SyntheticGroup
from vllm_hogwild.core.views.spans import Separators, Span, build_views

ROPES = {
    "default": {"rope_type": "default", "rope_theta": 1e5},
    "linear": {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0},
    "llama3": {
        "rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 64,
    },
    "yarn": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0, "original_max_position_embeddings": 64},
}


@dataclasses.dataclass
class Case:
    num_workers: int = 2
    layout: str = "contiguous"
    kv_layout: str = "cpu_k_transposed"
    head_dim: int = 64
    num_kv_heads: int = 2
    gqa: int = 3
    block_size: int = 16
    prompt_len: int = 37
    max_gen: int = 20
    rope: str = "default"
    neox: bool = True
    partial_rotary: float = 1.0
    max_query_tokens: int = 1
    dtype: torch.dtype = torch.float32
    seed: int = 0
    quant: object = None  # kv_layout.KVQuant: an FP8 cache


def config_of(c: Case) -> LlamaConfig:
    params = dict(ROPES[c.rope])
    if c.partial_rotary != 1.0:
        params["partial_rotary_factor"] = c.partial_rotary
    return LlamaConfig(
        head_dim=c.head_dim, hidden_size=c.head_dim * c.num_kv_heads * c.gqa,
        num_attention_heads=c.num_kv_heads * c.gqa, num_key_value_heads=c.num_kv_heads,
        max_position_embeddings=4096, rope_parameters=params,
    )


def random_combined(rng: random.Random, prompt_len: int, gen_lens: list[int]) -> dict:
    """Finished steps of every worker in a random finishing order, plus separators on lane 0's prompt."""
    steps, paragraph_starts = [], []
    for w, n in enumerate(gen_lens):
        cuts = sorted(rng.sample(range(1, n), min(2, n - 1))) if n > 1 else []
        bounds = [0, *cuts]
        unfinished = rng.choice(bounds)  # steps before it are finished
        paragraph_starts.append(prompt_len + unfinished)
        ends = [*bounds[1:], n]
        steps += [Span(w, prompt_len + a, prompt_len + b) for a, b in zip(bounds, ends) if b <= unfinished]
    rng.shuffle(steps)
    seps = Separators()
    if prompt_len >= 12:
        seps = Separators(Span(0, 2, 5), Span(0, 5, 6), Span(0, 6, 9), Span(0, 9, 11))
    return {"history": steps, "paragraph_starts": paragraph_starts, "separators": seps}


def setup(c: Case):
    rng = random.Random(c.seed)
    gen_lens = [rng.randint(min(c.max_query_tokens, c.max_gen), c.max_gen) for _ in range(c.num_workers)]
    group = SyntheticGroup.build(
        c.prompt_len, gen_lens, c.num_kv_heads, c.head_dim, c.block_size, c.kv_layout, c.dtype, seed=c.seed,
        quant=c.quant,
    )
    kw = random_combined(rng, c.prompt_len, gen_lens) if c.layout in ("combined", "interleaved") else {}
    views = build_views(c.layout, c.prompt_len, group.lane_lens, **kw)
    n_q = [min(rng.randint(1, c.max_query_tokens), v.own.num_tokens) for v in views]
    rows = group.rows(views, n_q)
    gen = torch.Generator().manual_seed(c.seed + 1)
    query = torch.randn(sum(n_q), c.num_kv_heads * c.gqa, c.head_dim, generator=gen).to(c.dtype)
    return group, views, rows, query


def oracle(c: Case, group, views, rows, query) -> torch.Tensor:
    inv_freq, _ = hf_inv_freq(config_of(c))
    outs = []
    for view, row in zip(views, rows):
        k = torch.cat([group.keys[s.lane][s.start : s.end] for s in view.spans])
        v = torch.cat([group.values[s.lane][s.start : s.end] for s in view.spans])
        stored = torch.cat([torch.arange(s.start, s.end) for s in view.spans])
        view_pos = torch.cat([torch.arange(v, v + s.num_tokens) for v, s in zip(view.view_starts(), view.spans)])
        is_own = torch.zeros(view.num_tokens, dtype=torch.bool)
        is_own[view.num_tokens - view.own.num_tokens :] = True
        n = row.num_query_tokens
        q_pos = torch.arange(view.own.end - n, view.own.end)
        q_view = torch.tensor([view.view_pos(view.own.lane, int(p)) for p in q_pos])
        q = query[row.query_start : row.query_start + n].to(torch.float64)
        outs.append(dense_view_attention(
            q, q_pos, q_view, k, v, stored, view_pos, is_own, inv_freq, c.neox, 1 / math.sqrt(c.head_dim)
        ))
    return torch.cat(outs)


PATHS = ("torch", "compiled")  # compiled: each vector path the op has here, "compiled:avx2", ...


def compiled_paths() -> list[str]:
    from vllm_hogwild.attention import cpu_ops

    return [f"compiled:{isa}" for isa in cpu_ops.isas()]


def kind_of(path: str) -> sa.PlanMode:
    """``torch``: the item plan in PyTorch; ``compiled``: the CPU op."""
    return sa.PlanMode.TORCH if path == "torch" else sa.PlanMode.CPU_OP


def ours(c: Case, group, rows, query, path: str = "torch") -> torch.Tensor:
    """``path``: one of PATHS; ``compiled:ISA`` runs the op's vector path ISA (``compiled``: the default one)."""
    from vllm_hogwild.attention import cpu_ops

    spec = RopeSpec.from_hf_config(config_of(c), is_neox_style=c.neox)
    plan = sa.plan(rows, c.block_size, spec, kind_of(path.partition(":")[0]), num_tokens=query.shape[0])
    if not path.startswith("compiled"):
        return sa.run(plan, query, group.kv)
    cpu_ops.use(path.partition(":")[2] or None)
    try:
        return sa.run(plan, query, group.kv)
    finally:
        cpu_ops.use(None)


def paths_for(c: Case, rows) -> list[str]:
    """Every path that serves these rows: the compiled op takes rows of up to CPU_OP_MAX_ROW_TOKENS tokens (one
    row per token) on vLLM's CPU layout."""
    short = all(r.num_query_tokens <= sa.CPU_OP_MAX_ROW_TOKENS for r in rows)
    return ["torch"] + (compiled_paths() if short and c.kv_layout != "plain" else [])


def rel_err(a: torch.Tensor, ref: torch.Tensor) -> float:
    return ((a.to(torch.float64) - ref).abs().max() / ref.abs().max()).item()


def check(c: Case, tol: float | None = None) -> float:
    """Every path that serves the rows against the oracle."""
    group, views, rows, query = setup(c)
    ref = oracle(c, group, views, rows, query)
    tol = tol if tol is not None else (1e-5 if c.dtype == torch.float32 else 1e-2)
    errs = [rel_err(ours(c, group, rows, query, path), ref) for path in paths_for(c, rows)]
    assert max(errs) <= tol, f"{c}: relative errors {errs} > {tol:.0e}"
    return max(errs)


# Every worker count x layout x cache layout; the other axes rotate with the case index.
GRID = list(itertools.product([1, 2, 3, 4, 8], ["contiguous", "isolated", "combined", "interleaved"], KV_LAYOUTS))


@pytest.mark.parametrize("i", range(len(GRID)))
def test_oracle_grid(i: int) -> None:
    n, layout, kv_layout = GRID[i]
    check(Case(
        num_workers=n, layout=layout, kv_layout=kv_layout,
        head_dim=(64, 128)[i % 2], gqa=(1, 3, 4)[i % 3], num_kv_heads=(1, 2)[i // 3 % 2],
        block_size=(16, 32, 128)[i % 3], prompt_len=(37, 64, 128, 5)[i % 4],
        rope=list(ROPES)[i % 4], neox=bool(i // 4 % 2), partial_rotary=(1.0, 0.5)[i // 2 % 2],
        max_query_tokens=(1, 4)[i // 5 % 2], seed=i,
    ))


@pytest.mark.parametrize("rope", list(ROPES))
@pytest.mark.parametrize("neox", [True, False])
@pytest.mark.parametrize("partial_rotary", [1.0, 0.5])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_oracle_rope_kinds(rope: str, neox: bool, partial_rotary: float, head_dim: int) -> None:
    check(Case(num_workers=3, layout="combined", rope=rope, neox=neox,
               partial_rotary=partial_rotary, head_dim=head_dim, max_gen=60, seed=7))


@pytest.mark.parametrize("block_size", [16, 32, 128])
@pytest.mark.parametrize("prompt_len", [1, 31, 32, 33, 128, 300])
def test_oracle_block_boundaries(block_size: int, prompt_len: int) -> None:
    check(Case(num_workers=4, block_size=block_size, prompt_len=prompt_len, max_gen=40, seed=prompt_len))


@pytest.mark.parametrize("layout", ["contiguous", "combined"])
def test_oracle_multi_token_rows(layout: str) -> None:
    """Prefill-like rows: several query tokens, causal within the own segment."""
    check(Case(num_workers=3, layout=layout, max_query_tokens=12, max_gen=30, seed=3))


def test_verify_rows_run_on_the_compiled_op_as_one_row_per_token() -> None:
    """Speculative verify rows (1 + 4 tokens per worker) take the compiled op, exact against the oracle; token t
    of a row reads its own text up to itself."""
    c = Case(num_workers=4, layout="contiguous", max_query_tokens=5, max_gen=40, seed=13)
    group, views, rows, query = setup(c)
    assert any(r.num_query_tokens > 1 for r in rows)
    assert sa.mode_for("cpu-op", rows) is sa.PlanMode.CPU_OP
    split = sa.single_token_rows(rows, c.block_size)
    assert len(split) == sum(r.num_query_tokens for r in rows) and all(r.num_query_tokens == 1 for r in split)
    for row in rows:
        own = row.segments[-1]
        mine = [r for r in split if row.query_start <= r.query_start < row.query_start + row.num_query_tokens]
        assert [r.segments[-1].end for r in mine] == list(range(own.end - row.num_query_tokens + 1, own.end + 1))
        assert all(r.segments[:-1] == row.segments[:-1] for r in mine)
    ref = oracle(c, group, views, rows, query)
    for path in compiled_paths():
        assert rel_err(ours(c, group, rows, query, path), ref) <= 1e-5, path
    long = sa.QueryRow(0, sa.CPU_OP_MAX_ROW_TOKENS + 1, rows[0].segments)
    assert sa.mode_for("cpu-op", [long]) is sa.PlanMode.TORCH


@pytest.mark.parametrize("split", [0, 2, 4])
def test_rows_given_as_columns_plan_like_rows_given_as_segments(split: int) -> None:
    """A contiguous group's decoding rows as columns (what the worker builds at scale: no object per row or
    segment) run exact against the oracle on every path, alone (``split`` 0) or after rows given as objects (the
    compiled op plans both in one pass; the other paths take the columns as rows)."""
    from vllm_hogwild.core.views.spans import SegmentColumns

    c = Case(num_workers=5, layout="contiguous", max_gen=40, seed=21)
    group, views, rows, query = setup(c)
    ref = oracle(c, group, views, rows, query)
    columns = SegmentColumns()
    base = columns.add_tables([tuple(t) for t in group.block_tables])
    for w in range(split, c.num_workers):
        assert columns.add_contiguous(w, c.prompt_len, group.lane_lens, base)
        assert columns.segments(len(columns) - 1) == rows[w].segments
    tokens = [row.query_start for row in rows[split:]]
    spec = RopeSpec.from_hf_config(config_of(c), is_neox_style=c.neox)
    from vllm_hogwild.attention import cpu_ops

    for path in ("torch", "cpu-op"):
        plan = sa.plan_rows(path, rows[:split], c.block_size, spec, num_tokens=query.shape[0],
                            flat=(columns, tokens))
        assert (plan.mode is sa.PlanMode.CPU_OP) == (path == "cpu-op")
        for isa in (cpu_ops.isas() if path == "cpu-op" else [None]):
            cpu_ops.use(isa)
            try:
                assert rel_err(sa.run(plan, query, group.kv), ref) <= 1e-5, (path, isa)
            finally:
                cpu_ops.use(None)
    off = SegmentColumns()
    base = off.add_tables([tuple(t) for t in group.block_tables])
    for w in range(split, c.num_workers):
        off.add_contiguous(w, c.prompt_len, group.lane_lens, base)
    off.delta[0] += 1  # a control: one segment's rotation off by one
    plan = sa.plan_rows("cpu-op", rows[:split], c.block_size, spec, num_tokens=query.shape[0], flat=(off, tokens))
    assert rel_err(sa.run(plan, query, group.kv), ref) > 1e-3
    short = SegmentColumns()
    short.add_tables([tuple(t)[:1] for t in group.block_tables])  # tables that stop before the segments end
    short.add_contiguous(split, c.prompt_len, group.lane_lens, 0)
    with pytest.raises(ValueError, match="past its 1 blocks"):
        sa.plan_rows("cpu-op", [], c.block_size, spec, flat=(short, tokens[:1]))


def test_oracle_prefill_row_reads_only_prompt() -> None:
    """A whole prompt as one row (a worker's prefill): plain causal attention."""
    check(Case(num_workers=1, prompt_len=90, max_gen=0, max_query_tokens=90, seed=5))


@pytest.mark.parametrize("kv_layout", KV_LAYOUTS)
def test_oracle_bf16(kv_layout: str) -> None:
    check(Case(num_workers=4, kv_layout=kv_layout, dtype=torch.bfloat16, rope="yarn", max_gen=40))


def test_oracle_long_views() -> None:
    check(Case(num_workers=4, prompt_len=1500, max_gen=300, block_size=32, seed=11))


@pytest.mark.parametrize("gqa", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("kv_layout,block_size,head_dim,dtype", [
    ("cpu_k_transposed", 16, 64, torch.float32), ("cpu_k_transposed", 128, 80, torch.float32),
    ("cpu_k_transposed", 32, 64, torch.bfloat16), ("cpu_k_transposed", 128, 128, torch.bfloat16),
    ("cpu_k_transposed", 32, 64, torch.float16), ("cpu", 32, 64, torch.float32), ("cpu_k_transposed", 24, 64, torch.float32),
])
def test_compiled_op_tiled_and_generic_paths(gqa: int, kv_layout: str, block_size: int, head_dim: int,
                                             dtype: torch.dtype) -> None:
    """The op's register-tiled paths (K transposed, block size and head_dim multiples of 16, 1-4
    query heads per KV head, any cache dtype; each vector path the op has here: AVX-512 with the BF16 dot
    product, AVX-512, AVX2) and its
    generic loops (everything else here, and the ``generic`` path) against the oracle, with pieces that
    start and end mid-tile."""
    check(Case(num_workers=3, layout="combined", kv_layout=kv_layout, gqa=gqa, block_size=block_size,
               head_dim=head_dim, prompt_len=45, max_gen=50, dtype=dtype, seed=gqa))


def test_empty_segments_are_harmless() -> None:
    c = Case(num_workers=3, seed=4)
    group, views, rows, query = setup(c)
    padded = []
    for row in rows:
        seg = row.segments[0]
        empty = sa.Segment(seg.block_ids, 3, 3, 999)
        padded.append(dataclasses.replace(row, segments=(empty, *row.segments[:-1], empty, row.segments[-1])))
    ref = oracle(c, group, views, rows, query)
    for path in PATHS:
        assert rel_err(ours(c, group, padded, query, path), ref) <= 1e-5


@pytest.mark.parametrize("layout", ["contiguous", "combined"])
def test_oracle_detects_a_delta_off_by_one(layout: str) -> None:
    """The comparison can fail: one segment's delta moved by one position is caught."""
    c = Case(num_workers=2, layout=layout, max_gen=30, seed=2)
    group, views, rows, query = setup(c)
    ref = oracle(c, group, views, rows, query)
    for path in PATHS:
        assert rel_err(ours(c, group, rows, query, path), ref) <= 1e-5
    row = rows[0]
    assert len(row.segments) > 1
    seg = row.segments[0]
    bad = dataclasses.replace(row, segments=(dataclasses.replace(seg, delta=seg.delta + 1), *row.segments[1:]))
    for path in PATHS:
        assert rel_err(ours(c, group, [bad, *rows[1:]], query, path), ref) > 1e-3


def test_oracle_detects_a_wrong_block() -> None:
    c = Case(num_workers=2, seed=9)
    group, views, rows, query = setup(c)
    ref = oracle(c, group, views, rows, query)
    seg = rows[0].segments[0]
    table = list(seg.block_ids)
    used = {b for t in group.block_tables for b in t}
    table[0] = min(set(range(len(used) + 3)) - used)  # a spare block full of noise
    bad = dataclasses.replace(rows[0], segments=(dataclasses.replace(seg, block_ids=tuple(table)), *rows[0].segments[1:]))
    for path in PATHS:
        assert rel_err(ours(c, group, [bad, *rows[1:]], query, path), ref) > 1e-3


def test_untouched_rows_keep_their_output() -> None:
    c = Case(num_workers=2, seed=1)
    group, views, rows, query = setup(c)
    spec = RopeSpec.from_hf_config(config_of(c))
    extra = torch.randn(3, *query.shape[1:])
    q = torch.cat([query, extra])
    for path in PATHS:
        out = torch.full_like(q, 7.0)
        plan = sa.plan(rows, c.block_size, spec, kind_of(path), num_tokens=q.shape[0])
        sa.run(plan, q, group.kv, out=out)
        assert torch.equal(out[query.shape[0]:], torch.full_like(extra, 7.0))


def test_row_outside_its_segment_is_refused() -> None:
    seg = sa.Segment((0,), 0, 2, 0)
    spec = RopeSpec.from_hf_config(config_of(Case()))
    with pytest.raises(ValueError, match="last segment"):
        sa.plan([sa.QueryRow(0, 3, (seg,))], 16, spec)
    with pytest.raises(ValueError, match="past its"):
        sa.plan([sa.QueryRow(0, 1, (sa.Segment((0,), 0, 20, 0),))], 16, spec)


def test_the_op_has_the_vector_paths_this_cpu_reports(monkeypatch) -> None:
    """Built for the CPU it runs on: AVX-512 where the CPU reports avx512f (with the BF16 dot product where it
    reports avx512_bf16 too), AVX2 on any x86 with AVX2 and FMA; the widest runs by default, VLLM_HOGWILD_CPU_ISA chooses another, and one the build lacks is refused."""
    from vllm_hogwild.attention import cpu_ops
    from vllm_hogwild.core.errors import HogwildOptionError

    flags = set(open("/proc/cpuinfo").read().split())
    wants = (("avx512_bf16", {"avx512f", "avx512bw", "avx512_bf16"}), ("avx512", {"avx512f"}), ("avx2", {"avx2"}))
    expected = [isa for isa, needs in wants if needs <= flags] + ["generic"]
    assert cpu_ops.isas() == expected
    assert cpu_ops.choose() == expected[0]
    assert cpu_ops.choose("generic") == "generic"
    monkeypatch.setenv(cpu_ops.ISA_ENV, "avx2")
    assert cpu_ops.choose() == "avx2"
    monkeypatch.setenv(cpu_ops.ISA_ENV, "sse9")
    with pytest.raises(HogwildOptionError, match=cpu_ops.ISA_ENV):
        cpu_ops.choose()
