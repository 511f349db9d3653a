"""Exact replay (pure): views rebuilt from a group's step log equal the views recorded live, token by token."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from tests.unit.table_engine import FakeEngine
from vllm_hogwild.core.groups.group import Worker
from vllm_hogwild.core.groups.all_kinds import new_group
from vllm_hogwild.core.views.registry import BatchRow, GroupViews
from vllm_hogwild.core.options import RequestOptions, RequestSpec
from vllm_hogwild.core.replay.step_log import PROMPT, Replay
from vllm_hogwild.core.views.spans import Segment

P = 6


def norm(segments, bs: int = 4):
    """Segments as attention reads them: the blocks up to each one's end (tables grow as lanes do)."""
    return tuple((tuple(s.block_ids[: -(-s.end // bs)]), s.start, s.end, s.delta) for s in segments)


def own(table, p):
    return (Segment(tuple(table), 0, p + 1, 0),)


def per_token(segments, p, table):
    """A row's segments as the query at position ``p`` reads them (causal within its own span)."""
    if segments is None:
        return own(table, p)
    *rest, last = segments
    return (*rest, Segment(last.block_ids, last.start, p + 1, last.delta))


def record_live(live: dict, registry, engine, wire) -> None:
    """Apply the step's wire as a worker process does; record the view of every position a decode row feeds."""
    segments = registry.apply(wire, lambda lanes: [r for r in engine.rows if r.request_id in lanes],
                              engine.block_ids).rows
    for row in engine.rows:
        w = int(row.request_id.partition("_")[0])
        if row.num_computed >= P:  # a decode row (a prefill chunk reads its own lane)
            for p in range(row.num_computed, row.num_computed + row.num_scheduled):
                live[(w, p)] = per_token(segments.get(row.request_id), p, engine.block_ids(row.request_id))


def rebuilt(group_id, shape, history, starts, log, targets, tables, fork=None):
    """Every position of every lane, re-fed with the view of the step it was produced under."""
    replay = Replay(log, list(targets))
    views = GroupViews(shape, history=list(history), paragraph_starts=list(starts), fork=fork)
    lanes = [(w, 0, k) for w, k in enumerate(targets)]
    by_id = dict(zip(shape.request_ids, tables))
    out = views.replay(replay.wire(group_id, lanes), by_id.get)
    return {w: out.get(w) or tuple(own(tables[w], p) for p in range(k)) for w, k in enumerate(targets)}


@pytest.mark.parametrize("layout,protocol", [("contiguous", "raw"), ("isolated", "raw"), ("combined", "raw"),
                                             ("interleaved", "raw"), ("combined", "named")])
@pytest.mark.parametrize("seed", range(4))
def test_views_rebuilt_from_the_log_equal_the_live_ones(layout: str, protocol: str, seed: int) -> None:
    """Through the group table, with paragraphs joining the history, prefixes the engine forces, workers that
    stop early and workers left out of a step by vLLM's token budget."""
    rng = random.Random(seed)
    n = rng.randint(2, 4)
    engine = FakeEngine(prompt_len=P)
    options = {"layout": layout, "protocol": protocol}
    if layout in ("combined", "interleaved"):
        options["step_end"] = "[.!?]"
    requests = engine.add_group("g", n, 40, **options)
    group = engine.table.groups["g"]
    scripts = {r.request_id: "".join(rng.choice(["a", "b ", ".", "!", "cd"]) for _ in range(7)) for r in requests}
    scripts[requests[0].request_id] += "\0"  # worker 0 stops early
    live: dict[tuple[int, int], tuple] = {}
    from vllm_hogwild.core.views.registry import ViewRegistry

    registry = ViewRegistry()
    for _ in range(70):
        engine.skip = {r.request_id for r in requests if rng.random() < 0.08}
        wire = engine.step(lambda r, k: ord(scripts[r.request_id][k % len(scripts[r.request_id])]))
        if "g" not in engine.table.groups:
            break
        record_live(live, registry, engine, wire)
    assert group.log.num_steps >= 10 and len(live) >= 20
    targets = [w.length() for w in group.workers]
    tables = [engine.block_ids(r.request_id) for r in requests]
    tracker = group.tracker
    got = rebuilt("g", registry.groups["g"].shape, tracker.history if tracker else [],
                  tracker.paragraph_starts if tracker else [P] * n, group.log, targets, tables)
    for (w, p), expected in live.items():
        assert norm(got[w][p]) == norm(expected), (w, p)
    if layout == "isolated":
        assert all(got[w][p] == own(tables[w], p) for (w, p) in live)


@pytest.mark.parametrize("layout", ["contiguous", "combined"])
@pytest.mark.parametrize("seed", range(4))
def test_views_of_accepted_drafts_are_those_of_the_step_that_verified_them(layout: str, seed: int) -> None:
    """Speculative decoding: each step a lane feeds its last token and its drafts; the accepted ones keep the
    view of that step (co-workers at their accepted lengths), the rejected ones are fed again later."""
    rng = random.Random(seed)
    n, bs = 3, 4
    options = {"layout": layout, **({"step_end": "!"} if layout == "combined" else {})}
    group = new_group("g", RequestSpec(RequestOptions(**options), n), 100, P, 0.0, 0.0, encode=lambda t: [])
    for w in range(n):
        group.workers[w] = Worker(group, w, f"{w}_g", SimpleNamespace(request_id=f"{w}_g"))
    tables = [tuple(range(100 * w, 100 * w + 40)) for w in range(n)]
    shape = group.shape(tables)
    views = GroupViews(shape)
    lens = [P] * n  # tokens with K/V; the last sampled token (position lens[w]) is fed next
    live = {}
    for _ in range(25):
        decoding = [w for w in range(n) if rng.random() < 0.85] or [0]
        drafts = [rng.randint(0, 3) if w in decoding else 0 for w in range(n)]
        lane_lens = [lens[w] + (1 if w in decoding else 0) for w in range(n)]
        step = group.step(lane_lens, decoding, drafts, exact=True)
        rows = [(w, BatchRow(f"{w}_g", lens[w], 1 + drafts[w], drafts[w])) for w in decoding]
        segments = views.decode(rows, lane_lens, step, lambda request_id: None)
        for w in decoding:
            for p in range(lens[w], lens[w] + 1 + drafts[w]):
                live[(w, p)] = per_token(segments.get(w), p, tables[w])
            accepted = rng.randint(0, drafts[w])
            if group.tracker is not None:
                for i in range(1 + accepted):
                    group.tracker.on_sampled(w, lens[w] + i, rng.choice(["x", "!", "y"]))
            lens[w] += 1 + accepted
    got = rebuilt("g", shape, views.history, views.paragraph_starts, group.log, lens, tables)
    checked = 0
    for (w, p), expected in live.items():
        if p < lens[w]:  # positions past the lane's end were rejected drafts never fed again
            assert norm(got[w][p]) == norm(expected), (w, p)
            checked += 1
    assert checked >= 40


def _logged_group(seed: int, n: int = 3, steps: int = 30):
    """A contiguous group decoding in lock-step, with some workers sitting some steps out."""
    rng = random.Random(seed)
    group = new_group("g", RequestSpec(RequestOptions(), n), 100, P, 0.0, 0.0, encode=lambda t: [])
    lens = [P] * n
    for _ in range(steps):
        decoding = [w for w in range(n) if rng.random() < 0.8] or [1]
        for w in decoding:
            lens[w] += 1
        group.step(list(lens), decoding)
    return group, lens


@pytest.mark.parametrize("seed", range(5))
def test_replay_in_lock_step_by_past_steps_writes_every_view_whole(seed: int) -> None:
    """Chunks cover the same past steps in every lane; whatever vLLM's budget cuts, what is kept after the
    rollback only ever read co-worker tokens already written, and the replay always finishes."""
    rng = random.Random(100 + seed)
    group, targets = _logged_group(seed)
    replay = Replay(group.log, targets)
    computed = [rng.choice([0, 4]) for _ in targets]  # the prompt's full blocks may be a prefix-cache hit
    written: dict[tuple[int, int], int] = {}  # (lane, position) -> the engine step that wrote it
    for engine_step in range(200):
        if replay.done(computed):
            break
        ends = replay.chunk_ends(computed, budget=rng.choice([3, 8, 40]))
        got = [c + max(0, min(e - c, rng.choice([e - c, e - c, rng.randint(0, e - c)]))) for c, e in
               zip(computed, ends)]  # vLLM may cut a chunk short
        for w, (c, g) in enumerate(zip(computed, got)):
            for p in range(c, g):
                written[(w, p)] = engine_step
        computed = replay.valid(got)
        for w, (g, c) in enumerate(zip(got, computed)):
            for p in range(c, g):
                del written[(w, p)]  # rolled back
        for (w, p), when in written.items():  # every kept token read co-workers written by its engine step
            t = replay.step_of(w, p)
            if t == PROMPT:
                continue
            lens = replay.view_step(t).lane_lens
            for o in range(len(targets)):
                if o != w:
                    assert all(written.get((o, q), 10 ** 9) <= when for q in range(P, lens[o])), (w, p, o)
    assert replay.done(computed) and engine_step < 150


def test_chunks_take_whole_past_steps_and_respect_the_budget() -> None:
    group, targets = _logged_group(7, steps=40)
    replay = Replay(group.log, targets)
    computed = [P] * len(targets)
    ends = replay.chunk_ends(computed, budget=12)
    assert sum(e - c for e, c in zip(ends, computed)) <= 12
    # Every lane stops at the same past step: all it re-feeds is older than what any lane leaves for later.
    last_taken = max(replay.step_of(w, e - 1) for w, e in enumerate(ends) if e > computed[w])
    first_left = min(replay.step_of(w, e) for w, e in enumerate(ends) if e < targets[w])
    assert last_taken < first_left
    assert replay.chunk_ends(computed, budget=10 ** 6) == targets


FJ_GOAL = "Split.\n<Parallel>\n<Goal>\n<Outline>\n1: a</Outline>\n<Outline>\n2: b</Outline>\n</Goal>"
FJ_SUB = "<Parallel>\n<Goal>\n<Outline>\n1.1: x</Outline>\n<Outline>\n1.2: y</Outline>\n</Goal>"
FJ_SCRIPTS = {  # each lane's text at its output index (the tokens the engine forces are these characters too)
    0: FJ_GOAL + "<Conclusion>\nso\n<Goal>\n<Outline>\n7: c</Outline>\n</Goal><Conclusion>\n" + "w" * 300,
    1: "\n<Path>\n1: " + FJ_SUB + "<Conclusion>\nmore</Path>",
    2: "\n<Path>\n2: " + "b" * 60 + "</Path>",
    3: "\n<Path>\n1.1: xx</Path>",
    4: "\n<Path>\n1.2: yyyyyyy</Path>",
    5: "\n<Path>\n7: c</Path>",
}


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("branches", ["isolated", "hogwild"])
def test_fork_join_views_rebuilt_from_the_log_equal_the_live_ones(seed: int, branches: str) -> None:
    """A fork/join request (a fork of the trunk, a nested fork in its first branch, a second fork of the trunk
    after its join; hogwild branches do not nest) through the group table, lanes left out of steps by vLLM's
    token budget: every re-fed token's view, from the log and the forks as they are at the end, equals the
    view it was produced under (a view reads only text before its reader, where forks no longer change)."""
    from vllm_hogwild.core.views.registry import ViewRegistry

    rng = random.Random(seed)
    n = 6
    engine = FakeEngine(prompt_len=P)
    requests = engine.add_group("g", n, 400, protocol="multiverse", branches=branches)
    group = engine.table.groups["g"]
    registry, live = ViewRegistry(), {}
    for _ in range(400):
        engine.skip = {r.request_id for r in requests if rng.random() < 0.1}
        wire = engine.step(lambda r, k: ord(FJ_SCRIPTS[int(r.request_id[0])][r.num_output_tokens]))
        if "g" not in engine.table.groups:
            break
        record_live(live, registry, engine, wire)
        targets = [w.length() for w in group.workers]
        tables = [engine.block_ids(r.request_id) for r in requests]
        shape = registry.groups["g"].shape
    forks = group.driver.lanes.state.forks
    assert [f.parent for f in forks] == ([0, 1, 0] if branches == "isolated" else [0, 0])
    got = rebuilt("g", shape, [], [P] * n, group.log, targets, tables, registry.groups["g"].fork)
    checked = 0
    for (w, p), expected in live.items():
        if p < targets[w]:
            assert norm(got[w][p]) == norm(expected), (w, p)
            checked += expected != own(tables[w], p)
    assert checked >= 100, "views that read other lanes were compared"
