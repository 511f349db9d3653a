"""A group from the scheduler's side to the worker processes' (pure): the wire, the views built from it and the
batch, the step log, the counters."""

from __future__ import annotations

import pickle
import random
from types import SimpleNamespace

import pytest

from tests.unit.table_engine import FakeEngine
from vllm_hogwild.core.groups.group import Group, Worker
from vllm_hogwild.core.groups.all_kinds import new_group
from vllm_hogwild.core.views.registry import BatchRow, GroupViews, ViewRegistry
from vllm_hogwild.core.options import RequestOptions, RequestSpec
from vllm_hogwild.core.views.spans import Separators, Span, build_views, segments_of
from vllm_hogwild.core.wire import GroupStep, StepWire, lengths_array

P = 5  # prompt length


def encode(text: str) -> list[int]:
    return [ord(c) for c in text]


def make_group(n: int, **options) -> Group:
    group = new_group("g", RequestSpec(RequestOptions(**options), n), max_tokens=64, prompt_len=P,
                         arrival=0.0, arrival_time=0.0, encode=encode)
    for w in range(n):
        group.workers[w] = Worker(group, w, f"{w}_g", request=SimpleNamespace(request_id=f"{w}_g"))
    return group


def blocks(n: int, bs: int = 4, budget: int = 64) -> list[tuple[int, ...]]:
    return [tuple(range(100 * w, 100 * w + -(-(P + budget) // bs))) for w in range(n)]


def rows(lens_before, scheduled, drafts=None):
    """The batch as a worker process sees it: lane w computed ``lens_before[w]`` tokens, feeds ``scheduled[w]``."""
    return [(w, BatchRow(f"{w}_g", c, n, (drafts or {}).get(w, 0)))
            for w, (c, n) in enumerate(zip(lens_before, scheduled)) if n]


def no_table(request_id):
    return None


def test_plain_views_go_native() -> None:
    for group in (make_group(1), make_group(3, layout="isolated")):
        views = GroupViews(group.shape(blocks(group.num_workers)))
        n = group.num_workers
        assert views.decode(rows([P + 2] * n, [1] * n), [P + 3] * n, None, no_table) == {}


def test_contiguous_segments_read_every_lane_with_view_deltas() -> None:
    group = make_group(3)
    table = blocks(3)
    segs = GroupViews(group.shape(table)).decode(rows([P + 1] * 3, [1] * 3), [P + 2] * 3, None, no_table)
    assert sorted(segs) == [0, 1, 2]
    # Worker 1 reads [prompt of lane 1][lane 0 gen][lane 2 gen][lane 1 gen]; its query sits at view pos 10.
    s = segs[1]
    assert [(seg.block_ids, seg.start, seg.end) for seg in s] == [
        (table[1], 0, 5), (table[0], 5, 7), (table[2], 5, 7), (table[1], 5, 7)]
    # delta = (view_pos(q) - stored_pos(q)) - (v - s): query stored at 6, viewed at 10.
    assert [seg.delta for seg in s] == [4 - 0, 4 - (5 - 5), 4 - (7 - 5), 0 + 4 - 4]


def test_views_follow_the_engines_own_block_lists() -> None:
    """A lane's block table is the engine's own list, which grows in place as the lane takes KV on demand."""
    group = make_group(2)
    live = {"0_g": [7], "1_g": [9]}
    views = GroupViews(group.shape([(7,), (9,)]))
    assert views.block_ids(live.get) == [(7,), (9,)]
    live["0_g"].append(8)  # lane 0 was given a block
    assert views.block_ids(live.get) == [(7, 8), (9,)]


@pytest.mark.parametrize("layout", ["contiguous", "combined", "interleaved"])
def test_coworker_reads_from_the_log_equal_a_count_step_by_step(layout: str) -> None:
    """The log keeps runs of lock-step steps; the reads computed from it in closed form equal counting each step."""
    rng = random.Random(layout)
    engine = FakeEngine(prompt_len=P)
    requests = engine.add_group("g", 3, 60, layout=layout, **({} if layout == "contiguous" else {"step_end": "!"}))
    group = engine.table.groups["g"]
    expected = [0] * 3
    scripts = {r.request_id: rng.choice(["ab!", "xyzw!", "q!"]) for r in requests}
    for k in range(80):
        if not engine.table:
            break
        engine.skip = {r.request_id for r in requests if rng.random() < 0.1}
        engine.step(lambda r, step: ord(scripts[r.request_id][step % len(scripts[r.request_id])]))
        if group.prefilled and engine.rows:
            _count_step(group, engine, expected, layout)
    assert group.coworker_reads() == expected


def _count_step(group, engine, reads, layout) -> None:
    """What the scheduler used to count every step: co-worker tokens in each decoding worker's view."""
    decoding = [int(r.request_id[0]) for r in engine.rows if r.num_computed >= P]
    lens = [w.length() for w in group.workers]
    if layout == "contiguous":
        total = sum(n - P for n in lens)
        for w in decoding:
            reads[w] += total - (lens[w] - P)
        return
    by_lane = [0] * 3
    for span in group.tracker.history:
        by_lane[span.lane] += span.num_tokens
    starts = group.tracker.paragraph_starts
    unfinished = [max(0, n - s) for n, s in zip(lens, starts)] if layout == "combined" else [0] * 3
    for w in decoding:
        if lens[w] > starts[w]:
            reads[w] += sum(by_lane) - by_lane[w] + sum(unfinished) - unfinished[w]


def test_prefill_saved_counts_the_prompt_once() -> None:
    group = make_group(3)
    group.counters.prefill_by_worker = [5, 1, 1]  # worker 0 computed the prompt, the others its last token
    assert group.counters.prefill_saved(P) == 2 * 5 - 2
    group.counters.prefill_by_worker = [5, 5, 5]  # nothing shared
    assert group.counters.prefill_saved(P) == 0


def test_combined_views_follow_the_paragraphs_the_scheduler_sends() -> None:
    group = make_group(2, layout="combined", step_end="!")
    assert group.tracker is not None and make_group(2).tracker is None
    group.tracker.on_sampled(0, P, "go!")  # worker 0's first paragraph is its first token
    group.tracker.on_sampled(1, P, "b")
    step = group.step([P + 2, P + 2], [0, 1])  # both fed their second token: worker 0's paragraph joins
    assert step.joined == ((0, 5, 6),)
    views = GroupViews(group.shape(blocks(2)))
    segs = views.decode(rows([P + 1, P + 1], [1, 1]), [P + 2, P + 2], step, no_table)
    # Worker 1 reads: prompt, the history (worker 0's paragraph), worker 0's live paragraph, its own text.
    assert [(s.start, s.end) for s in segs[1]] == [(0, 5), (5, 7), (5, 7)]
    assert views.history == [Span(0, 5, 6)] and views.paragraph_starts == [6, 5]
    assert group.step([P + 3, P + 3], [0, 1]) is None  # nothing joined: nothing to send


@pytest.mark.parametrize("layout", ["contiguous", "combined", "interleaved", "isolated"])
@pytest.mark.parametrize("seed", range(6))
def test_views_built_from_the_wire_equal_views_built_from_scratch(layout, seed) -> None:
    """The worker processes build each group's views from the lane lengths the scheduler sends every step, the
    joins it sends and the batch's decoding rows; those views equal views built from scratch (the scheduler's own counts, its tracker's history) step after step,
    with workers that stop early, sit out a step (vLLM's token budget) or write paragraphs; the wire pickles."""
    rng = random.Random(seed)
    n = rng.randint(2, 5)
    engine = FakeEngine(prompt_len=P)
    paragraphs = {"step_end": "[.!?]"} if layout in ("combined", "interleaved") else {}
    requests = engine.add_group("g", n, rng.randint(10, 40), layout=layout, **paragraphs)
    group = engine.table.groups["g"]
    scripts = {r.request_id: "".join(rng.choice(["a", "b ", ".", "!", "c"]) for _ in range(9))
               for r in requests}
    for r in requests[: n // 2]:
        scripts[r.request_id] += "\0"  # these stop early
    registry, checked = ViewRegistry(), 0
    for step in range(60):
        if not engine.table:
            break
        engine.skip = {r.request_id for r in requests if rng.random() < 0.1}
        wire = pickle.loads(pickle.dumps(engine.step(
            lambda r, k: ord(scripts[r.request_id][k % len(scripts[r.request_id])]))))
        got = registry.apply(wire, lambda lanes: [r for r in engine.rows if r.request_id in lanes],
                             engine.block_ids).rows
        decoding = [int(r.request_id.partition("_")[0]) for r in engine.rows if r.num_computed >= P]
        if "g" not in engine.table.groups:
            break  # it ended in this step: its last rests joined its history for the record
        if not group.prefilled or not decoding:
            assert got == {}
            continue
        lens = [w.length() for w in group.workers]
        kw = {}
        if group.tracker is not None:
            kw = dict(history=list(group.tracker.history), paragraph_starts=group.tracker.paragraph_starts,
                      separators=Separators())
        views = build_views(layout, P, lens, readers=decoding, **kw)
        tables = [tuple(engine.block_ids(r.request_id)) for r in requests]
        expected = {requests[w].request_id: segs for w, view in zip(decoding, views)
                    if (segs := segments_of(view, tables)) is not None}
        assert got == expected, (layout, seed, step)
        checked += 1
    assert checked >= 3
    registry.apply(StepWire(ended=("g",)))
    assert registry.groups == {} and registry.lanes == {}


@pytest.mark.parametrize("layout", ["contiguous", "combined"])
def test_drafts_extend_only_their_own_lane(layout: str) -> None:
    """Speculative decoding: a lane's drafts are read by its own rows only, after its accepted tokens;
    every co-worker reads the lane up to its accepted length, as if there were no drafts."""
    options = {"layout": layout, **({"step_end": "!"} if layout == "combined" else {})}
    group, plain = make_group(3, **options), make_group(3, **options)
    table = blocks(3)
    lens, drafts = [P + 4, P + 2, P + 3], [3, 0, 2]
    step = group.step(lens, [0, 1, 2], drafts, exact=True)
    assert step == GroupStep("g", (), (3, 0, 2))  # the lengths travel apart, every step (StepWire.lane_lens)
    before = [n - 1 for n in lens]
    with_drafts = GroupViews(group.shape(table)).decode(
        rows(before, [1 + d for d in drafts], dict(enumerate(drafts))), lens, step, no_table)
    without = GroupViews(plain.shape(table)).decode(rows(before, [1, 1, 1]), lens, None, no_table)
    for w in range(3):
        own = table[w]
        got, base = with_drafts[w], without[w]
        # the reader's own last segment runs on over its drafts; everything before it is unchanged
        assert [(s.block_ids, s.start) for s in got] == [(s.block_ids, s.start) for s in base]
        assert got[-1].block_ids == own and got[-1].end == base[-1].end + drafts[w]
        assert [(s.end, s.delta) for s in got[:-1]] == [(s.end, s.delta) for s in base[:-1]]
    assert plain.step(lens, [0, 1, 2]) is None  # no drafts, nothing joined: nothing on the wire


def test_a_decoding_row_needs_its_lanes_lengths_from_the_wire() -> None:
    """The worker processes keep no lane length: a group whose rows decode without lengths on the wire is an
    error, never views from a guess; lengths that do not match the groups' lanes are one too."""
    group = make_group(2)
    shape = group.shape(blocks(2))
    with pytest.raises(ValueError, match="decode but the wire has no lane lengths"):
        GroupViews(shape).decode(rows([P + 1] * 2, [1] * 2), None, None, no_table)
    with pytest.raises(ValueError, match="has 3 lane lengths for its 2 lanes"):
        GroupViews(shape).decode(rows([P + 1] * 2, [1] * 2), [P + 2] * 3, None, no_table)
    registry = ViewRegistry()
    batch = lambda lanes: [row for _, row in rows([P + 1] * 2, [1] * 2)]  # noqa: E731
    wire = StepWire(shapes=(shape,), length_groups=("g",), lane_lens=lengths_array([P + 2, P + 2, P + 2]))
    with pytest.raises(ValueError, match="3 lane lengths do not match its groups' 2 lanes"):
        registry.apply(wire, batch)
    wire = StepWire(length_groups=("g",), lane_lens=lengths_array([P + 2, P + 1]))
    assert set(registry.apply(wire, batch).rows) == {"0_g", "1_g"}
