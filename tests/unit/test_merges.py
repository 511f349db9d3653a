"""The merges task (vllm_hogwild/tasks/merges.py): generator, prompt, checker with references, the lock-step runs
of every baseline and their costs. Pure Python, no model."""

from __future__ import annotations

import random
import statistics

import pytest

from vllm_hogwild.tasks import links as L
from vllm_hogwild.tasks import merges as M
from vllm_hogwild.tasks import merges_policy as P

TASKS = {mode: M.make_tasks(64, 0, mode) for mode in M.MODES}  # the benchmark's tasks (seed 0)


def test_the_generator_is_seeded_and_its_prompt_reads_back() -> None:
    for mode in M.MODES:
        task = M.make_task(18, 5, mode)
        assert task == M.make_task(18, 5, mode) != M.make_task(18, 6, mode)
        assert M.task_of_prompt(task.prompt()) == task
        assert bool(task.answer) == (mode == "find")
        assert all(task.paths[i][-1] == L.GOAL for i in task.answer)
    assert M.make_tasks(3, 1) == M.make_tasks(3, 1)
    assert all(len(M.make_task(M.MAX_ITEMS, s).paths) == M.MAX_ITEMS for s in range(20))
    task = M.make_task(18, 7, "find")
    assert f"\nFind: {len(task.answer)} to Z.\nPaths:" in task.prompt()


def test_merges_are_common_and_share_most_of_a_merging_path() -> None:
    for mode in M.MODES:
        stats = M.merge_stats(TASKS[mode])
        assert stats["merging_share"] >= 0.4, stats  # at least 40% of the starts run into another path
        assert stats["shared_suffix_share"] >= 0.5, stats  # and share at least half of their links, on average
    # where paths meet is not in the prompt's order: the links are shuffled
    task = TASKS["all"][0]
    assert task.links != task.links_in_order and sorted(map(str, task.links)) == sorted(map(str, task.links_in_order))


def _merging(task: M.MergesTask) -> tuple[int, int, int] | None:
    """(a start, a later start whose path runs into its path, the position of the node they meet at), where no
    third path passes that node."""
    for j, path in enumerate(task.paths):
        for i in range(j):
            meet = next((k for k, node in enumerate(path[1:-1], 1) if node in task.paths[i][1:-1]), None)
            if meet is not None and sum(path[meet] in p for p in task.paths) == 2:
                return i, j, meet
    return None


def test_a_reference_is_expanded_and_scored_exactly() -> None:
    task = next(t for s in range(100) if _merging(t := M.make_task(8, s)))
    i, j, k = _merging(task)
    full = {x: M.entry_for(task, x) for x in range(len(task.paths))}
    ref = M.entry_for(task, j, k)
    others = "".join(full[x] for x in range(len(task.paths)) if x not in (i, j))
    score = M.check(task, [full[i] + others, ref])
    assert score.correct and len(score.references) == 1
    r = score.references[0]
    assert (r.worker, r.index, r.node, r.from_worker, r.from_index) == (1, j, task.paths[j][k], 0, i)
    assert r.skipped == len(task.paths[j]) - 1 - k
    # the node the reference ends at must have been followed past by another entry
    assert not M.check(task, [others, ref]).correct
    # two entries that both end at the node they meet at leave the rest unwritten: both wrong
    node = task.paths[j][k]
    pos = task.paths[i].index(node)
    both = M.check(task, [others + M.entry_for(task, i, pos), ref])
    assert not both.correct and set(both.wrong) == {i, j}
    # a reference after a wrong prefix, or at the wrong node, is wrong
    wrong = list(task.paths[j][:k + 1])
    wrong[0] = task.paths[i][0]
    assert j in M.check(task, [full[i] + others, M.entry(j, wrong, M.REFERENCE)]).wrong
    # a reference into an entry that is itself wrong after the node is wrong too
    bent = list(task.paths[i])
    bent[-1] = next(t for t in L.TERMINALS if t not in {p[-1] for p in task.paths})
    score = M.check(task, [M.entry(i, bent) + others, ref])
    assert set(score.wrong) == {i, j}


def test_the_checker_in_find_mode_counts_every_start_that_reaches_the_goal() -> None:
    task = next(t for t in TASKS["find"] if len(t.answer) >= 2)
    answer = "".join(M.entry_for(task, x) for x in task.answer)
    assert M.check(task, [answer]).correct
    assert M.check(task, [answer]).found == task.answer
    assert not M.check(task, ["".join(M.entry_for(task, x) for x in task.answer[1:])]).correct  # one missing
    other = next(x for x in range(len(task.paths)) if x not in task.answer)
    stopped = f"\n{L.SLOTS[other]}: {task.paths[other][0]}"  # a worker the group's end cut off: not an error
    assert M.check(task, [answer, stopped]).correct
    ended = M.entry(task.answer[0], task.paths[task.answer[0]])  # the goal reached, written with ";"
    assert not M.check(task, [ended + "".join(M.entry_for(task, x) for x in task.answer[1:])]).correct


def test_a_client_reads_the_finds_from_the_texts_alone() -> None:
    """What a cancelling client counts: an entry ended by ``!``, or a reference whose rest (through the texts,
    references followed) ends in one; not a reference into an entry the group's end cut off, nor a ``;``."""
    task = M.MergesTask(((10, 11, 12, "Z"), (20, 21, 11, 12, "Z"), (30, 21, 11, 12, "Z"), (40, 41, "A")),
                        tuple(range(8)), "find")
    whole, cut = M.entry_for(task, 0), M.entry(0, (10, 11, 12))[:-1]  # the last: unfinished, cut off
    by_ref, chained = M.entry(1, (20, 21, 11), M.REFERENCE), M.entry(2, (30, 21), M.REFERENCE)
    assert M.written_finds([whole + M.entry_for(task, 3), by_ref]) == {0, 1}
    assert M.written_finds([whole, by_ref, chained], 4) == {0, 1, 2}  # 2's rest is 1's, whose rest is 0's
    assert M.written_finds([cut, by_ref]) == set()  # the source cut off: nothing found yet
    assert M.written_finds([M.entry(0, task.paths[0], L.PATH_END), by_ref]) == set()  # ";" says not the goal
    assert M.check(task, [whole, by_ref, chained]).correct
    # a finished source is read before one the cancel cut off, whatever the worker order
    score = M.check(task, [cut, whole, by_ref, chained])
    assert score.correct and {r.from_worker for r in score.references} == {1, 2}
    assert M.written_finds([cut, whole, by_ref, chained]) == {0, 1, 2}
    assert M.written_finds([whole + M.entry(3, (40, 41, "Z"), L.FOUND)]) == {0, 3}  # what it says, right or not
    assert M.find_done(task, [whole, by_ref, chained]) and not M.find_done(task, [whole, by_ref])
    assert not M.find_done(M.MergesTask(task.paths[3:], (0, 1), "all"), [M.entry_for(task, 3)])  # all: never
    # a letter no start has, finished or cut off by the cancel: malformed, never an error
    late = M.entry(7, (40, 41, "Z"), L.FOUND)
    assert M.written_finds([whole, late[:-1]], 4) == {0} == M.written_finds([whole + late], 4)
    assert M.check(task, [whole, by_ref, chained, late[:-1]]).malformed == len(late) - 2


def test_sampled_workers_free_in_one_step_may_take_the_same_start() -> None:
    """The computed sampled policy draws a claim without knowing what the others free in the same step draw
    (as sampled workers do); the ideal claim-as-you-go policy never collides."""
    task = M.make_task(4, 2)
    dup = [M.check(task, P.run(task, 2, "sample", "shared", True, True, random.Random(s)).texts).duplicated_items
           for s in range(20)]
    assert any(dup) and not all(dup)
    assert M.check(task, P.run(task, 2).texts).duplicated_items == 0


@pytest.mark.parametrize("mode", M.MODES)
def test_every_baseline_writes_a_right_answer_in_the_steps_it_reports(mode: str) -> None:
    for task in TASKS[mode][:24]:
        for n in (1, 2, 4, 8):
            for name, how in P.BASELINES.items():
                run = P.run(task, n, *how)
                score = M.check(task, run.texts)
                assert score.correct, (name, n, score)
                assert run.steps <= max(map(len, run.tokens)) + 1
                if not how[2]:  # no reuse: no reference
                    assert not score.references
            sampled = P.run(task, n, "sample", "shared", True, True, random.Random(n))
            assert M.check(task, sampled.texts).correct


def test_one_worker_costs_what_it_writes() -> None:
    task = TASKS["all"][3]
    run = P.run(task, 1)
    score = M.check(task, run.texts)
    # a whole entry: its claim, its path and its end; a reference: its claim and its nodes (the last one fused
    # with the reference, one token)
    written = sum(len(task.paths[e.index]) + 2 if e.end != M.REFERENCE else len(e.nodes) + 1 for e in score.entries)
    assert score.references and written < sum(task.costs())
    assert run.steps == written + 1  # its tokens and its end of sequence
    nothing = P.run(task, 1, reuse=False)
    assert nothing.steps == sum(task.costs()) + 1 > run.steps  # one worker reuses its own paths


def test_the_costs_simulated_before_any_training() -> None:
    """The ideal reuse policy takes at most 0.7x the round-robin split's steps at N = 4 (all mode), the split
    reusing its own share's paths; in find mode the split with cancel is the baseline."""
    def mean(mode, n, name):
        return statistics.mean(P.baseline_steps(t, n, name) for t in TASKS[mode])

    assert mean("all", 4, "ideal reuse policy") <= 0.7 * mean("all", 4, "round-robin split")
    assert mean("all", 4, "split + cancel") == mean("all", 4, "round-robin split")
    for n in (4, 8):
        assert mean("find", n, "split + cancel") < mean("find", n, "round-robin split")
        assert mean("find", n, "ideal reuse policy") < 0.8 * mean("find", n, "split + cancel")
    # the isolated control: every worker reads only its own lane, so each does every start
    isolated = statistics.mean(P.run(t, 4, "sample", "own", True, False, random.Random(0)).steps for t in TASKS["all"])
    assert isolated >= 0.95 * mean("all", 1, "ideal reuse policy")


@pytest.mark.parametrize("call, field", [
    (lambda: M.make_task(0, 1), "num_items"),
    (lambda: M.make_task(3, 1, "some"), "mode"),
    (lambda: M.make_task(True, 1), "num_items"),
    (lambda: M.make_tasks(2, 1, min_items=5, max_items=4), "max_items"),
    (lambda: M.MergesTask(((1, 2, "A"),), (0, 1), "find"), "paths"),  # find: some path reaches Z
    (lambda: M.MergesTask(((1, 2, "Z"),), (0, 1)), "paths"),  # all mode: nobody's goal
    (lambda: M.MergesTask(((1, 2, "A"), (3, 2, "B")), (0, 1, 2)), "paths"),  # 2 has two links out
    (lambda: M.MergesTask(((1, "A"), (2, "A")), (0, 1)), "paths"),  # a terminal with two links in
    (lambda: M.MergesTask(((1, 2, "A"), (2, "B")), (0, 1, 2)), "paths"),  # a start on another path
    (lambda: M.MergesTask(((1, 2, "A"),), (0, 0)), "link_order"),
    (lambda: M.task_of_prompt("Links:\n1>A\nStarts: a=1,\nFind: 2 to Z.\nPaths:"), "prompt"),
    (lambda: M.task_of_prompt(17), "prompt"),
    (lambda: M.check(M.make_task(3, 1), "text"), "texts"),
    (lambda: M.check(M.make_task(3, 1), [3]), "texts"),
    (lambda: M.check("task", ["x"]), "task"),
    (lambda: M.written_finds("text"), "texts"),
    (lambda: M.written_finds(["x"], 0), "count"),
    (lambda: M.entry(0, (1, "A"), "?"), "end"),
    (lambda: M.entry_for(M.make_task(3, 1), 0, 0), "upto"),
    (lambda: P.run(M.make_task(3, 1), 0), "num_workers"),
    (lambda: P.run(M.make_task(3, 1), 2, "greedy"), "assign"),
    (lambda: P.run(M.make_task(3, 1), 2, "sample"), "rng"),
    (lambda: P.baseline_steps(M.make_task(3, 1), 2, "oracle"), "name"),
])
def test_bad_arguments_name_the_field(call, field: str) -> None:
    with pytest.raises(ValueError, match=rf"^{field}"):
        call()


def test_malformed_text_is_counted_not_raised() -> None:
    task = M.make_task(4, 2)
    right = "".join(M.entry_for(task, x) for x in range(4))
    score = M.check(task, [right + "\nzz 12 ==", "\ne: 5="])  # junk, and a letter no start has
    assert not score.correct and score.malformed > 0
    hostile = "\na:" + " 1" * 5000 + "="  # long, and refers to nothing: wrong, in time linear in its length
    assert not M.check(task, [hostile]).correct
