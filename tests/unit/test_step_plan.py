"""The item plan's incremental side: the lane table a step updates by what changed, and plans kept from step to step
(the torch path here, in this process; the Triton kernels on the same buffers: tests/graph_replay_check.py)."""

from __future__ import annotations

from array import array

import pytest
import torch

from tests import graph_replay_check as replay
from vllm_hogwild.attention import segment_attention as sa
from vllm_hogwild.attention.lane_table import LaneTable, LaneTableFull
from vllm_hogwild.attention.step_plan import PlanCapacityError, StepPlanner


def sync(table: LaneTable, tables, slots, gens):
    return table.sync(tables, array("q", slots), array("q", gens))


def test_a_step_uploads_only_new_lanes_and_new_blocks() -> None:
    lanes = LaneTable()
    a, b = [5, 6, 7], [5, 6, 9, 10]  # b shares a's first two blocks (a shared prompt)
    rows, lens = sync(lanes, [a, b], [0, 1], [1, 2])
    assert rows.tolist() == [0, 1] and lens.tolist() == [3, 4] and lanes.num_uploaded == 7
    assert lanes.blocks[1, :4].tolist() == b
    assert int(lanes.canon[1]) == 0 and int(lanes.split[1]) == 2 and int(lanes.split[0]) == 2
    sync(lanes, [a, b], [0, 1], [1, 2])
    assert lanes.num_uploaded == 7  # nothing changed, nothing sent
    b.append(11)
    version = lanes.version
    sync(lanes, [a, b], [0, 1], [1, 2])
    assert lanes.num_uploaded == 8 and lanes.blocks[1, 4] == 11 and lanes.version == version  # one new block


def test_a_reused_slot_holds_the_new_lane_and_its_readers_are_re_pointed() -> None:
    lanes = LaneTable()
    sync(lanes, [[1, 2, 3], [1, 2, 4], [1, 2, 5]], [0, 1, 2], [1, 2, 3])
    assert [int(lanes.canon[r]) for r in (0, 1, 2)] == [0, 0, 0]
    sync(lanes, [[7, 8], [1, 2, 4], [1, 2, 5]], [0, 1, 2], [9, 2, 3])  # slot 0: another lane (generation 9)
    assert lanes.blocks[0, :2].tolist() == [7, 8]
    assert int(lanes.canon[1]) == 1 and int(lanes.canon[2]) == 1 and int(lanes.split[2]) == 2  # row 1 holds it now
    assert int(lanes.canon[0]) == 0 and int(lanes.split[0]) == 0


def test_a_frozen_table_refuses_to_grow_naming_its_room() -> None:
    lanes = LaneTable(num_slots=2, max_blocks=4)
    lanes.frozen = True
    with pytest.raises(LaneTableFull, match="2 slots of 4 blocks"):
        sync(lanes, [[1, 2, 3, 4, 5]], [0], [1])
    planner = StepPlanner(16, replay.rope())
    planner.reserve(rows=2, pairs=4, items=4, slots=2, max_blocks=4)
    planner.freeze(replay.HQ, replay.D)
    world = replay.World(seed=3)
    world.admit("X", 3, 20, 3)
    columns, tokens, _ = world.rows()
    with pytest.raises(PlanCapacityError):
        planner.plan(columns, tokens)


def test_plans_kept_from_step_to_step_equal_the_oracle_on_the_torch_path() -> None:
    """The replay check's decode steps (groups that come and go, a finished worker, a growing history) on one
    planner, the torch path: every step's plan from the last one's shape or from scratch, equal to the oracle;
    most steps keep their shape, and only new blocks are uploaded."""
    spec = replay.rope()
    world = replay.World(seed=1)
    planner = StepPlanner(replay.BS, spec, "cpu", num_kv_heads=replay.H)
    world.admit("A", 3, 21, 3)
    world.admit("D", 2, 19, 4, layout="combined")
    gen = torch.Generator().manual_seed(2)
    kept = uploads_after_first = 0
    for step in range(24):
        if step == 5:
            d = world.groups["D"]
            end = len(d.lanes[1].keys[0])
            d.history.append(replay.Span(1, d.paragraph_starts[1], end))
            d.paragraph_starts[1] = end
        if step == 9:
            world.admit("B", 2, 33, 2)
        if step == 15:
            world.leave("A")
        world.decode()
        columns, tokens, views = world.rows()
        before = planner.num_rebuilt
        plan = sa.plan_columns(columns, tokens, replay.BS, spec, sa.PlanMode.TORCH, planner=planner)
        kept += planner.num_rebuilt == before
        if step == 0:
            uploads_after_first = planner.lanes.num_uploaded
        query = torch.randn(len(tokens), replay.HQ, replay.D, generator=gen)
        out = sa.run(plan, query, world.kv[0])
        assert replay.rel_err(out, replay.oracle(views, query, 0, spec.inv_freq.double())) <= 1e-5, step
    assert kept >= 18
    assert planner.lanes.num_uploaded - uploads_after_first <= 40  # new blocks and B's lanes, not whole tables
