"""A group's whole life through the group table (pure), with tests/unit/table_engine.py standing in for vLLM."""

from __future__ import annotations

import pytest

from tests.unit.table_engine import EOS, FakeEngine
from vllm_hogwild.core.groups.group import Phase
from vllm_hogwild.core.protocol_text import FINISHER_SUFFIX

P = 10


def test_workers_arriving_out_of_order_are_set_aside_until_the_group_is_complete() -> None:
    engine = FakeEngine(prompt_len=P)
    table = engine.table
    engine.add("2_g", {}, 3, 8)
    engine.add("0_g", {}, 3, 8)
    assert table.num_aside == 2 and table.groups["g"].phase is Phase.GATHERING
    assert engine.step(lambda r, k: 7).steps == () and not engine.running  # nothing runs while it gathers
    engine.add("1_g", {}, 3, 8)
    assert table.groups["g"].phase is Phase.WAITING
    engine.step(lambda r, k: 7)
    # Admitted whole, in worker order; every worker prefilled and sampled in the same step.
    assert [r.request_id for r in engine.running] == ["0_g", "1_g", "2_g"]
    assert table.num_aside == 0 and table.groups["g"].phase is Phase.ADMITTED
    assert [r.num_output_tokens for r in engine.running] == [1, 1, 1]


def test_a_worker_that_stops_early_keeps_its_lane_until_the_group_ends() -> None:
    engine = FakeEngine(prompt_len=P)
    a, b = engine.add_group("g", 2, 20)
    texts = engine.run({a.request_id: "x", b.request_id: "yyy\0"}, 40)
    assert texts == {a.request_id: "x" * 20, b.request_id: "yyy"}
    assert engine.freed == [b.request_id, a.request_id]  # b's blocks only once a, the last, finished
    assert not engine.table and not engine.table.workers
    engine.add_group("next", 2, 4)
    assert engine.step(lambda r, k: 7).ended == ("g",)  # the next step's wire: the worker processes forget it
    (end,) = engine.table.stats.ended
    assert end.output_lens == [20, 4] and end.lane_lens == [P + 19, P + 3]


def test_parked_lane_stays_in_every_view_until_the_end() -> None:
    engine = FakeEngine(prompt_len=P)
    a, b = engine.add_group("g", 2, 10)
    log = engine.table.groups["g"].log
    engine.run({a.request_id: "x", b.request_id: "y\0"}, 10)
    # b stopped after 2 tokens: its lane holds P + 1 (its end of sequence is never fed) in every later step
    first, after = log.runs
    assert (first.decoding, first.lens, first.length) == ((0, 1), (P + 1, P + 1), 1)
    assert (after.decoding, after.lens, after.length) == ((0,), (P + 2, P + 1), 8)
    assert log.num_steps == 9 and [w.steps for w in engine.wires] == [()] * len(engine.wires)  # no join, no draft
    # every step that decodes sends the group's lane lengths (lock-step too): the worker processes keep none
    sent = [(w.length_groups, tuple(w.lane_lens)) for w in engine.wires if w.length_groups]
    assert sent == [(("g",), (P + 1, P + 1))] + [(("g",), (P + 2 + k, P + 1)) for k in range(8)]


def test_an_answer_stops_the_whole_group_one_token_later() -> None:
    engine = FakeEngine(prompt_len=P)
    requests = engine.add_group("g", 3, 100, answer_pattern=r"A(\d)")
    texts = engine.run(dict(zip([r.request_id for r in requests], ["xxxxxxxx", "yyyyyA7yyy", "zzzzz"])), 40)
    assert [len(texts[r.request_id]) for r in requests] == [7, 7, 7]
    assert all(r.output_token_ids[-1] == EOS for r in requests)
    assert not engine.table


def test_the_finisher_reads_the_whole_transcript_and_the_others_end() -> None:
    engine = FakeEngine(prompt_len=P)
    requests = engine.add_group("g", 3, 120, protocol="collab", step_end="!", finisher=6)
    group = engine.table.groups["g"]
    texts = engine.run(dict(zip([r.request_id for r in requests], ["abcdefghij!", "cde!", "fghi!"])), 200)
    suffix = FINISHER_SUFFIX["math"]
    assert group.driver.finisher == 0
    start = texts[requests[0].request_id].index(suffix)
    assert texts[requests[0].request_id][start + len(suffix):].startswith("$" * 6)  # greedy tokens after the suffix
    assert [len(texts[r.request_id]) for r in requests[1:]] == [start, start]
    # when the finisher starts, every other worker's rest joins the history it reads
    joined_lanes = {span.lane for span in group.tracker.history}
    assert joined_lanes == {0, 1, 2}


@pytest.mark.parametrize("admitted", [False, True])
def test_an_abort_frees_everything_admitted_or_not(admitted: bool) -> None:
    engine = FakeEngine(prompt_len=P)
    if admitted:
        requests = engine.add_group("g", 3, 50)
        engine.run({r.request_id: "x" for r in requests}, 5)
    else:
        engine.add("1_g", {}, 3, 50)  # still gathering
    engine.abort("g")
    assert not engine.table and not engine.table.workers and engine.table.num_aside == 0
    assert not engine.parked and not engine.running


def test_reserve_admits_a_group_for_its_whole_budget_and_a_later_group_does_not_overtake_it() -> None:
    engine = FakeEngine(prompt_len=P, block_size=4, num_blocks=20, kv="reserve")
    big = engine.add_group("big", 2, 30)  # 2 shared + 2 x 8 = 18 blocks
    small = engine.add_group("small", 2, 2)
    engine.step(lambda r, k: 7)
    assert [r.request_id for r in engine.running] == [r.request_id for r in big]  # small waits behind big
    assert engine.table.groups["small"].phase is Phase.WAITING and all(r.status == "aside" for r in small)
    assert engine.table.first_allocation("0_small") is None  # queued workers reserve; held ones do not


def test_on_demand_admits_a_group_when_its_prompts_and_first_tokens_fit() -> None:
    engine = FakeEngine(prompt_len=P, block_size=4, num_blocks=20)
    big = engine.add_group("big", 2, 30)  # 2 shared + 2 x 1: its first tokens
    small = engine.add_group("small", 2, 2)
    engine.step(lambda r, k: 7)
    assert [r.request_id for r in engine.running] == [r.request_id for r in big + small]
    assert engine.table.first_allocation("0_big") is None  # nothing reserved


def test_lock_step_sits_out_a_worker_whose_prefill_finished_first() -> None:
    engine = FakeEngine(prompt_len=P, chunk=4)
    a, b = engine.add_group("g", 2, 5)
    b.num_computed_tokens = 8  # its prompt's first blocks were a prefix-cache hit: it finishes its prefill first
    engine.step(lambda r, k: 7)  # b: 2 tokens, done, samples; a: 4 of 10
    assert (a.num_output_tokens, b.num_output_tokens) == (0, 1)
    engine.step(lambda r, k: 7)  # a: 4 more; b is ahead and sits out
    assert b.num_computed_tokens == P and (a.num_output_tokens, b.num_output_tokens) == (0, 1)
    engine.step(lambda r, k: 7)  # a finishes its prefill; b still waits for it
    assert (a.num_output_tokens, b.num_output_tokens) == (1, 1)
    engine.step(lambda r, k: 7)  # from here they decode together (steady from the next step on)
    engine.step(lambda r, k: 7)
    engine.table._steady.sync()  # (a steady group's log catches up when asked, or when it leaves)
    (run,) = engine.table.groups["g"].log.runs
    assert (run.decoding, run.lens, run.length) == ((0, 1), (P + 1, P + 1), 2)


def test_an_accepted_run_is_cut_where_the_engine_must_place_text() -> None:
    """Speculative decoding: after each token of an accepted run the table says whether the engine must
    force the next one (a paragraph ended and its prefix is queued); the scheduler cuts the run there."""
    engine = FakeEngine(prompt_len=P)
    a, b = engine.add_group("g", 2, 100, layout="combined", protocol="named", step_end="!")
    engine.run({a.request_id: "x", b.request_id: "y"}, 30)  # both wrote their first prefix and some text
    table = engine.table
    worker = table.accept(a.request_id)
    run = [ord(c) for c in "ab!cd"]

    def accept(token: int) -> bool:  # what vLLM's own output update does to the request, for one token
        a.output_token_ids.append(token)
        return False

    accepted, stopped = table.accept_run(worker, run, accept)  # the loop the scheduler runs
    assert (accepted, stopped) == (3, False)  # "ab!" ends a paragraph: the next token is the next prefix's, forced by the engine
    assert table.groups["g"].driver.queues[0]  # queued


@pytest.mark.parametrize("seed", range(4))
def test_steady_groups_advanced_together_send_and_log_what_each_kind_would(seed: int) -> None:
    """Groups in steady lock-step are advanced by the table in one pass, without asking their kind. Against
    the same engine where no group is ever steady: every step's lane lengths, every log and every text agree,
    across groups whose workers stop at different steps, steps whose token budget leaves a worker out, and a
    collab group (reads text: never steady) beside raw ones."""
    import random

    def drive(steady: bool) -> tuple[list[dict], dict, dict, int]:
        rng = random.Random(seed)
        engine = FakeEngine(prompt_len=P, chunk=6)
        table = engine.table
        if not steady:
            table._steady.add = lambda group_id, log: None  # no group ever becomes steady
        groups = {f"g{k}": engine.add_group(f"g{k}", rng.choice([2, 3, 4]), rng.randint(4, 30)) for k in range(4)}
        groups["c"] = engine.add_group("c", 2, 25, protocol="collab", step_end="!")
        objects = dict(table.groups)  # (a group leaves the table when it ends)
        scripts = {r.request_id: "".join(rng.choice("xyz!") for _ in range(7)) + ("\0" if rng.random() < .3 else "")
                   for requests in groups.values() for r in requests}
        sent, most_steady = [], 0
        for k in range(40):
            live = [r.request_id for r in engine.running]
            engine.skip = {r for r in live if rng.random() < 0.05}
            wire = engine.step(lambda request, step: ord(scripts[request.request_id][step % len(
                scripts[request.request_id])]))
            sent.append(dict(wire.lengths(lambda g: len(groups[g]))))
            most_steady = max(most_steady, len(table._steady))
        table._steady.sync()  # (the logs of groups still steady catch up)
        logs = {g: [(r.first, r.decoding, r.lens, r.length) for r in group.log.runs] for g, group in objects.items()}
        texts = {r.request_id: list(r.output_token_ids) for requests in groups.values() for r in requests}
        return [{g: tuple(v) for g, v in s.items()} for s in sent], logs, texts, most_steady

    sent, logs, texts, most_steady = drive(True)
    control = drive(False)
    assert most_steady >= 2 and control[3] == 0  # the fast path ran (and the control never took it)
    assert (sent, logs, texts) == control[:3]


def test_a_worker_that_stops_beside_one_left_out_does_not_leave_the_group_in_lock_step() -> None:
    """A worker stops in the step vLLM's token budget leaves another out: as many workers are live next step
    as decoded in the last one, but not the same ones. The step that follows is logged as what it is, not as
    one more step of the last run (a replay would re-feed the wrong lanes' views)."""
    engine = FakeEngine(prompt_len=P)
    a, b, c = engine.add_group("g", 3, 20)
    log = engine.table.groups["g"].log
    scripts = {a.request_id: "x", b.request_id: "y", c.request_id: "zz\0"}  # c samples its end at step 2
    sample = lambda r, k: ord(scripts[r.request_id][k % len(scripts[r.request_id])])  # noqa: E731
    engine.step(sample)  # prefill, first tokens
    engine.step(sample)
    engine.skip = {b.request_id}
    engine.step(sample)  # b left out; c stops
    engine.skip = set()
    wire = engine.step(sample)  # 2 live, and the last run decoded 2 (a, c); b catches up, a sits out
    assert [r.decoding for r in log.runs] == [(0, 1, 2), (0, 2), (1,)]
    assert tuple(wire.lane_lens) == (P + 2, P + 2, P + 2)  # a and c wrote 2 tokens; b its second now
    engine.step(sample)
    engine.step(sample)  # in lock-step again (steady from here)
    engine.table._steady.sync()  # (a steady group's log catches up when asked, or when it leaves)
    assert [(r.decoding, r.length) for r in log.runs][2:] == [((1,), 1), ((0, 1), 2)]


def test_a_group_whose_workers_await_their_outputs_is_not_in_lock_step() -> None:
    """vLLM's async scheduling: a step scheduled while a group's last outputs are out holds its workers (the
    scheduler tells the table). The group does not decode in it: nothing logged, its lanes' lengths unsent,
    and it is not advanced as a steady group; the step after, it goes on in lock-step."""
    engine = FakeEngine(prompt_len=P)
    requests = engine.add_group("g", 3, 30)
    log = engine.table.groups["g"].log
    for _ in range(4):
        engine.step(lambda r, k: 7)
    assert "g" in engine.table._steady
    engine.table._steady.sync()  # (a steady group's log catches up when asked, or when it leaves)
    assert [(r.decoding, r.length) for r in log.runs] == [((0, 1, 2), 3)]
    engine.awaiting = {r.request_id for r in requests}
    wire = engine.step(lambda r, k: 7)
    assert wire.length_groups == () and log.num_steps == 3 and "g" not in engine.table._steady
    engine.awaiting = set()
    wire = engine.step(lambda r, k: 7)
    assert tuple(wire.lane_lens) == (P + 4,) * 3 and [(r.decoding, r.length) for r in log.runs] == [((0, 1, 2), 4)]


def test_steady_lengths_stay_exact_past_32_bits_of_engine_steps() -> None:
    """The steady groups' tick grows for the engine's life: past 2**31 steps a group's lengths are still its
    log's (against StepLog.advance, the one-group rule), and its log catches up exactly when it leaves."""
    from vllm_hogwild.core.replay.step_log import StepLog
    from vllm_hogwild.core.replay.steady import SteadyGroups

    steady, log, twin = SteadyGroups(), StepLog(3, P), StepLog(3, P)
    steady._tick = 2**31 - 2
    for each in (log, twin):
        each.record([P + 1, P + 1, P], [0, 1])  # lane 2 sits the run out: it does not grow
    steady.add("g", log)
    for _ in range(4):
        ids, lens = steady.advance()
        assert ids == ("g",) and lens.tolist() == twin.advance()
    steady.drop("g")
    assert [(r.lens, r.length) for r in log.runs] == [(r.lens, r.length) for r in twin.runs]
    assert log.num_steps == twin.num_steps == 5


def test_an_end_record_is_built_when_first_read_from_what_the_group_left() -> None:
    engine = FakeEngine(prompt_len=P)
    a, b = engine.add_group("g", 2, 6, layout="contiguous")
    group = engine.table.groups["g"]
    engine.run({a.request_id: "x", b.request_id: "yy\0"}, 10)
    assert not engine.table.groups
    stats = engine.table.stats
    assert len(stats._pending) == 1 and not stats._ended  # not built in the step the group ended in
    expected = group.coworker_reads()  # the group object as it ended (the table no longer holds it)
    assert expected and all(expected)
    snap = stats.snapshot(0, 0, 0)
    assert [e["coworker_reads"] for e in snap["ended"]] == [expected] and not stats._pending
    assert stats.ended[-1].coworker_reads == expected


def test_only_kinds_that_send_lane_records_are_asked_for_them() -> None:
    engine = FakeEngine(prompt_len=P)
    engine.add_group("g", 2, 4)
    assert not engine.table.records_lanes  # a Hogwild group: vLLM's outputs carry all its clients need
    engine.add_group("f", 3, 4, protocol="multiverse", max_branches=2)
    assert engine.table.records_lanes
    engine.run({r: "x" for r in engine.requests}, 12)
    assert not engine.table and not engine.table.records_lanes  # both ended


def test_end_records_nobody_can_read_any_more_are_never_built() -> None:
    from vllm_hogwild.core.stats import GroupEnd, HogwildStats

    stats, counted = HogwildStats(), []
    for i in range(1500):
        stats.record(lambda i=i: counted.append(i) or GroupEnd(1, 1, [1], 1, 1, 0, [1], [i], None, 0.0,
                                                                group_id=str(i)))
    assert not counted and len(stats._pending) == 1024
    assert [e.coworker_reads for e in stats.ended] == [[i] for i in range(476, 1500)]
    assert counted == list(range(476, 1500))  # each once, only the ones still held
    assert [e["group_id"] for e in stats.snapshot(0, 0, 0)["ended"]] == [str(i) for i in range(476, 1500)]


def test_an_ended_group_is_freed_without_the_garbage_collector() -> None:
    """When a group ends, the table breaks the cycle between it and its workers: the group, its workers and what
    they hold are freed by reference counting at once, not left for the garbage collector's rare full pass
    (a server running many groups would otherwise gather them, with their engine requests, until one runs)."""
    import gc
    import weakref

    engine = FakeEngine(prompt_len=P)
    engine.add_group("g", 3, 4)
    group = weakref.ref(engine.table.groups["g"])
    workers = [weakref.ref(w) for w in engine.table.groups["g"].workers]
    gc.disable()
    try:
        while engine.table:
            engine.step(lambda r, k: 7)
        assert group() is None and all(w() is None for w in workers)
    finally:
        gc.enable()


def test_an_orphaned_replay_request_is_let_go_after_its_group_ended() -> None:
    """A group that ended while one of its lanes was being re-fed leaves that replay request an orphan, which the
    scheduler aborts; freeing it must not read the ended group (its workers no longer point at it)."""
    from types import SimpleNamespace

    from vllm_hogwild.core.groups.group import Worker
    from vllm_hogwild.core.groups.preempt import Replayer

    replayer = Replayer()
    request = SimpleNamespace(request_id="r-replay", is_finished=lambda: False)
    worker = Worker(group=None, index=0, request_id="r", request=SimpleNamespace(request_id="r"))
    replayer.replay_request(worker, request)
    assert replayer.prefix_hit_cap(worker, 16) is None
    assert replayer.replay_parked("r-replay", groups={}) is False  # not parked: its blocks go the plain way
    assert "r-replay" not in replayer.replays
