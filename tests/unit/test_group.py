"""A group from the scheduler's side to the workers' (pure): the wire, the incremental views, the counters."""

from __future__ import annotations

import pickle
import random

import pytest

from vllm_hogwild.core.group import Group, Worker
from vllm_hogwild.core.group_views import GroupViews, ViewRegistry
from vllm_hogwild.core.options import RequestOptions, RequestSpec
from vllm_hogwild.core.views import Separators, Span, build_views, segments_of
from vllm_hogwild.core.wire import StepWire

P = 5  # prompt length


def encode(text: str) -> list[int]:
    return [ord(c) for c in text]


def make_group(n: int, **options) -> Group:
    group = Group.create("g", RequestSpec(RequestOptions(**options), n), max_tokens=64, prompt_len=P,
                         arrival=0.0, arrival_time=0.0, encode=encode)
    for w in range(n):
        group.workers[w] = Worker(group, w, f"{w}_g", request=None)
    return group


def blocks(n: int, bs: int = 4, budget: int = 64) -> list[tuple[int, ...]]:
    return [tuple(range(100 * w, 100 * w + -(-(P + budget) // bs))) for w in range(n)]


def test_plain_views_go_native() -> None:
    for group in (make_group(1), make_group(3, layout="isolated")):
        views = GroupViews(group.shape(blocks(group.num_workers)))
        lens = [P + 3] * group.num_workers
        assert views.apply(group.step(lens, list(range(group.num_workers)))) == {}


def test_contiguous_segments_read_every_lane_with_view_deltas() -> None:
    group = make_group(3)
    table = blocks(3)
    segs = GroupViews(group.shape(table)).apply(group.step([P + 2] * 3, [0, 1, 2]))
    assert sorted(segs) == [0, 1, 2]
    # Worker 1 reads [prompt of lane 1][lane 0 gen][lane 2 gen][lane 1 gen]; its query sits at view pos 10.
    s = segs[1]
    assert [(seg.block_ids, seg.start, seg.end) for seg in s] == [
        (table[1], 0, 5), (table[0], 5, 7), (table[2], 5, 7), (table[1], 5, 7)]
    # delta = (view_pos(q) - stored_pos(q)) - (v - s): query stored at 6, viewed at 10.
    assert [seg.delta for seg in s] == [4 - 0, 4 - (5 - 5), 4 - (7 - 5), 0 + 4 - 4]


def test_coworker_reads_and_prefill_saved_are_counted_per_worker() -> None:
    group = make_group(3)
    group.step([P + 3, P + 1, P + 4], [0, 1, 2])
    assert group.counters.coworker_reads == [1 + 4, 3 + 4, 3 + 1]  # the prompt is nobody's
    group.step([P + 4, P + 2, P + 4], [1])  # only worker 1 decodes this step
    assert group.counters.coworker_reads == [5, 7 + 8, 4]
    iso = make_group(2, layout="isolated")
    iso.step([P + 3, P + 3], [0, 1])
    assert iso.counters.coworker_reads == [0, 0]
    group.counters.prefill_by_worker = [5, 1, 1]  # worker 0 computed the prompt, the others its last token
    assert group.counters.prefill_saved(P) == 2 * 5 - 2
    group.counters.prefill_by_worker = [5, 5, 5]  # nothing shared
    assert group.counters.prefill_saved(P) == 0


def test_combined_views_follow_the_steps_the_scheduler_sends() -> None:
    group = make_group(2, layout="combined", step_end="!")
    assert group.tracker is not None and make_group(2).tracker is None
    group.tracker.on_sampled(0, P, "go!")  # worker 0's first step is its first token
    group.tracker.on_sampled(1, P, "b")
    step = group.step([P + 2, P + 2], [0, 1])  # both fed their second token: worker 0's step joins
    assert step.joined == ((0, 5, 6),)
    views = GroupViews(group.shape(blocks(2)))
    segs = views.apply(step)
    # Worker 1 reads: prompt, the history (worker 0's step), worker 0's live step, its own text.
    assert [(s.start, s.end) for s in segs[1]] == [(0, 5), (5, 7), (5, 7)]
    assert views.history == [Span(0, 5, 6)] and views.paragraph_starts == [6, 5]


@pytest.mark.parametrize("layout", ["contiguous", "combined", "interleaved", "isolated"])
@pytest.mark.parametrize("seed", range(6))
def test_incremental_views_equal_views_built_from_scratch(layout, seed) -> None:
    """The workers keep views from step to step out of the wire; built from the whole history each step
    instead (as the scheduler did before), they are the same segments, step after step, and the wire
    pickles (it crosses processes)."""
    rng = random.Random(seed)
    n = rng.randint(2, 5)
    group = make_group(n, layout=layout, step_end="[.!?]")
    table = blocks(n, budget=200)
    registry, history = ViewRegistry(), []
    lens = [P] * n
    sent = False
    for k in range(40):
        decoding = [w for w in range(n) if rng.random() < 0.9] or [0]
        for w in decoding:  # each sampled token: text that may end a step
            if group.tracker is not None:
                group.tracker.on_sampled(w, lens[w], rng.choice(["a", "b ", ".", "!", "c"]))
            lens[w] += 1
        step = group.step(lens, decoding)
        shapes = () if sent else (group.shape(table),)
        sent = True
        wire = pickle.loads(pickle.dumps(StepWire(shapes, (step,))))
        got = registry.apply(wire).rows
        # From scratch: the tracker's whole history and step starts, every view rebuilt.
        kw = {}
        if group.tracker is not None:
            kw = dict(history=list(group.tracker.history), paragraph_starts=group.tracker.paragraph_starts,
                      separators=Separators())
        views = build_views(layout, P, lens, readers=decoding, **kw)
        expected = {group.request_ids[w]: segs for w, view in zip(decoding, views)
                    if (segs := segments_of(view, table)) is not None}
        assert got == expected, (layout, seed, k)
    registry.apply(StepWire(ended=("g",)))
    assert registry.groups == {}


@pytest.mark.parametrize("layout", ["contiguous", "combined"])
def test_drafts_extend_only_their_own_lane(layout: str) -> None:
    """Speculative decoding: a lane's drafts are read by its own rows only, after its accepted tokens;
    every co-worker reads the lane up to its accepted length, as if there were no drafts."""
    options = {"layout": layout, **({"step_end": "!"} if layout == "combined" else {})}
    group, plain = make_group(3, **options), make_group(3, **options)
    table = blocks(3)
    lens, drafts = [P + 4, P + 2, P + 3], [3, 0, 2]
    step = group.step(lens, [0, 1, 2], drafts)
    assert step.drafts == (3, 0, 2) and step.lane_lens == tuple(lens)
    with_drafts = GroupViews(group.shape(table)).apply(step)
    without = GroupViews(plain.shape(table)).apply(plain.step(lens, [0, 1, 2]))
    for w in range(3):
        own = table[w]
        got, base = with_drafts[w], without[w]
        # the reader's own last segment runs on over its drafts; everything before it is unchanged
        assert [(s.block_ids, s.start) for s in got] == [(s.block_ids, s.start) for s in base]
        assert got[-1].block_ids == own and got[-1].end == base[-1].end + drafts[w]
        assert [(s.end, s.delta) for s in got[:-1]] == [(s.end, s.delta) for s in base[:-1]]
    assert plain.step(lens, [0, 1, 2]).drafts == ()  # no drafts, nothing on the wire
