"""Fork/join protocols (Multiverse, NPR): the families' rules, and the join's view against the dense oracle."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch

from tests.unit.test_segment_attention import Case, oracle, ours, paths_for, rel_err
from vllm_hogwild.core.views.forks import ForkNode, ForkState, fork_view
from vllm_hogwild.core.forkjoin.families import FAMILIES, ForkTooWide, Watch, decide, parts_of
from vllm_hogwild.core.views.spans import Span, View
from tools.synthetic import SyntheticGroup

MULTIVERSE = FAMILIES["multiverse"]
NPR = FAMILIES["npr"]

GOAL_MV = ("Let me split this.\n<Parallel>\n<Goal>\n<Outline>\n1: count the even cases</Outline>\n"
           "<Outline>\n2: count the odd cases</Outline>\n<Outline>\n3.1: check n = 0</Outline>\n</Goal>")
GOAL_NPR = "<guideline>\n<plan> 1: factor it</plan>\n<plan> 2: try small n</plan>\n</guideline>"


def test_parts_are_the_goals_numbered_entries_in_order() -> None:
    assert parts_of(MULTIVERSE, GOAL_MV) == ("1", "2", "3.1")
    assert parts_of(NPR, GOAL_NPR) == ("1", "2")
    earlier = "<Goal>\n<Outline>\n7: an earlier goal</Outline>\n</Goal> then "  # only the last goal counts
    assert parts_of(MULTIVERSE, earlier + GOAL_MV) == ("1", "2", "3.1")


def test_each_family_places_its_own_headers() -> None:
    fork = decide(MULTIVERSE, GOAL_MV, depth=0, budget_left=500, max_branches=8)
    assert fork.numbers == ("1", "2", "3.1")
    assert fork.headers == ("\n<Path>\n1:", "\n<Path>\n2:", "\n<Path>\n3.1:")
    fork = decide(NPR, GOAL_NPR, depth=0, budget_left=2000, max_branches=8)
    assert fork.headers == ("\n<step>\n1:", "\n<step>\n2:")
    assert (MULTIVERSE.join_header, NPR.join_header) == ("<Conclusion>\n", "<takeaway>\n")


def test_the_families_rules_decide_when_no_fork_starts_and_say_why() -> None:
    from vllm_hogwild.core.forkjoin.families import NoFork

    def reason(*args, **kwargs) -> str:
        out = decide(*args, **kwargs)
        assert isinstance(out, NoFork), out
        return out.reason

    # NPR: no nesting, a fork needs 1,024 tokens left, and 0 or more than 5 plans go on without forking.
    assert reason(NPR, GOAL_NPR, depth=1, budget_left=5000, max_branches=8) == "nested 1 deep: npr forks at most 1 deep"
    assert reason(NPR, GOAL_NPR, depth=0, budget_left=1023, max_branches=8) == (
        "1023 tokens of budget left: npr forks with at least 1024 left")
    assert "no part" in reason(NPR, "<guideline>\nno plans here\n</guideline>", depth=0, budget_left=5000,
                               max_branches=8)
    six = "<guideline>" + "".join(f"<plan> {i}: part</plan>" for i in range(1, 7)) + "</guideline>"
    assert reason(NPR, six, depth=0, budget_left=5000, max_branches=8).startswith(
        "a goal of 6 parts: npr forks into at most 5")
    # Multiverse: nesting up to 5 deep, no fork within 30 tokens of the budget's end.
    assert decide(MULTIVERSE, GOAL_MV, depth=4, budget_left=30, max_branches=8).num_branches == 3
    assert reason(MULTIVERSE, GOAL_MV, depth=5, budget_left=500, max_branches=8).startswith("nested 5 deep")
    assert reason(MULTIVERSE, GOAL_MV, depth=0, budget_left=29, max_branches=8).startswith("29 tokens of budget")
    # More parts than the lanes comes first, in every family (a prompt's goal is then refused, naming the field).
    with pytest.raises(ForkTooWide):
        decide(NPR, six, depth=0, budget_left=5000, max_branches=5)


def test_more_parts_than_the_engines_cap_is_refused_not_cut() -> None:
    with pytest.raises(ForkTooWide, match="--hogwild-max-workers"):
        decide(MULTIVERSE, GOAL_MV, depth=0, budget_left=500, max_branches=2)


def test_the_watch_sees_a_fork_and_a_branch_end_across_token_boundaries() -> None:
    top = Watch(MULTIVERSE, in_branch=False)
    pieces = [GOAL_MV[i:i + 3] for i in range(0, len(GOAL_MV), 3)]
    said = [top.feed(p) for p in pieces]
    assert said[-1] == "fork" and said.count("fork") == 1
    assert top.feed(" more text") is None  # one goal end forks once
    branch = Watch(MULTIVERSE, in_branch=True)
    assert [branch.feed(p) for p in ("\n<Path>\n1: even", " cases: 4 </Pa", "th>")] == [None, None, "end"]
    assert branch.feed("</Goal>") == "end"  # a branch that has ended stays ended


def joined(p0: int, branch_lens: list[int], cont_len: int) -> View:
    """The trunk's view after a join of branches ``branch_lens`` long, forked at ``p0`` (the whole prompt)."""
    ends = tuple(p0 + n for n in branch_lens)
    state = ForkState((ForkNode(0, p0, tuple(range(1, len(branch_lens) + 1)), ends),))
    return fork_view(p0, [p0 + cont_len, *ends], 0, state)


def test_a_join_places_every_branch_at_the_prefix_end() -> None:
    view = joined(10, [4, 7, 0], 2)
    assert view.spans == (Span(0, 0, 10), Span(1, 10, 14), Span(2, 10, 17), Span(0, 10, 12))  # empty one left out
    assert view.view_starts() == [0, 10, 10, 17]
    assert view.view_pos(0, 10) == 17 and view.view_pos(2, 16) == 16
    # The continuation's query rotates by (17 - 10) against the prefix, 7 - 0 against each branch.
    assert view.deltas() == [7, 7, 7, 0]
    with pytest.raises(ValueError, match="starts after"):
        View((Span(1, 10, 14), Span(0, 10, 12)), (10, 12))


# -- the join's attention against the dense oracle --------------------------------------------------

def _join_setup(c: Case, branch_lens: list[int], cont_len: int, positioned: bool):
    """Lane 0: the prefix, then the continuation; lanes 1..k: the branches (each lane stores the prefix too, as
    forked lanes share its blocks). ``positioned``: the join view; else a control with the branches one after
    another (as a sequential engine would position them)."""
    group = SyntheticGroup.build(c.prompt_len, [cont_len, *branch_lens], c.num_kv_heads, c.head_dim, c.block_size,
                                 c.kv_layout, c.dtype, seed=c.seed)
    p0 = c.prompt_len
    prefix, own = Span(0, 0, p0), Span(0, p0, p0 + cont_len)
    branches = [Span(b + 1, p0, p0 + n) for b, n in enumerate(branch_lens)]
    if positioned:
        view = joined(p0, branch_lens, cont_len)
    else:
        view = View((prefix, *branches, own))
    rng = random.Random(c.seed)
    n_q = min(cont_len, rng.randint(1, c.max_query_tokens))
    rows = group.rows([view], [n_q])
    query = torch.randn(n_q, c.num_kv_heads * c.gqa, c.head_dim,
                        generator=torch.Generator().manual_seed(c.seed + 1)).to(c.dtype)
    return group, [view], rows, query


@pytest.mark.parametrize("branch_lens", [[5, 9], [12, 3, 7, 20], [1, 40]])
@pytest.mark.parametrize("max_query_tokens", [1, 4])
def test_join_attention_matches_the_dense_oracle_and_a_sequential_placement_does_not(
        branch_lens: list[int], max_query_tokens: int) -> None:
    c = Case(prompt_len=45, block_size=16, max_query_tokens=max_query_tokens, seed=len(branch_lens))
    group, views, rows, query = _join_setup(c, branch_lens, cont_len=6, positioned=True)
    ref = oracle(c, group, views, rows, query)
    errs = {path: rel_err(ours(c, group, rows, query, path), ref) for path in paths_for(c, rows)}
    assert max(errs.values()) <= 1e-5, errs
    # Control: the same tokens with the branches forced one after another must miss the oracle of the join.
    _, seq_views, seq_rows, _ = _join_setup(c, branch_lens, cont_len=6, positioned=False)
    assert rel_err(ours(c, group, seq_rows, query), ref) > 1e-3
    # And the oracle itself tells the two placements apart.
    assert rel_err(oracle(c, group, seq_views, seq_rows, query), ref) > 1e-3


def test_join_attention_bf16_cache() -> None:
    c = dataclasses.replace(Case(prompt_len=64, block_size=32, seed=3), dtype=torch.bfloat16)
    group, views, rows, query = _join_setup(c, [10, 30, 2], cont_len=3, positioned=True)
    ref = oracle(c, group, views, rows, query)
    errs = {path: rel_err(ours(c, group, rows, query, path), ref) for path in paths_for(c, rows)}
    assert max(errs.values()) <= 1e-2, errs


# -- one request's lanes through a fork and its join -------------------------------------------------

def _feed(lanes, lens, lane: int, text: str, tokens: int) -> dict[int, str]:
    lens[lane] += tokens
    return lanes.observe(lane, text, lens[lane])


def _waiting(lanes, computed, sampled, live=None):
    return lanes.who_sits_out(computed, sampled, live or [True] * len(computed))


def test_lanes_fork_decode_side_by_side_and_join_after_the_longest_branch() -> None:
    from vllm_hogwild.core.forkjoin.families import ForkJoinLanes
    from vllm_hogwild.core.forkjoin.lane_channel import RECORD_VERSION, LaneRecord

    P = 20
    lanes = ForkJoinLanes(MULTIVERSE, num_lanes=5, prompt_len=P, max_tokens=500)
    lens = [P] * 5
    assert _waiting(lanes, [P] * 5, [0] * 5) == {1, 2, 3, 4}
    assert lanes.state is None and fork_view(P, lens, 0, lanes.state).spans == (Span(0, 0, P),)
    assert _feed(lanes, lens, 0, GOAL_MV[:40], 10) == {}
    force = _feed(lanes, lens, 0, GOAL_MV[40:], 25)
    assert force == {0: "<Conclusion>\n", 1: "\n<Path>\n1:", 2: "\n<Path>\n2:", 3: "\n<Path>\n3.1:"}
    assert lanes.take_released() == [1, 2, 3] and lanes.pool == [4], "the lane no fork took stays in the pool"
    assert lanes.lanes_to_stop() == []
    p0 = P + 35
    assert lanes.state.forks == (ForkNode(0, p0, (1, 2, 3)),)
    # The order of a fork the trunk wrote: every branch samples first (the trunk waits, a lane that sampled too),
    # then the trunk feeds the goal's last token (the branches wait), then the branches decode.
    assert _waiting(lanes, [p0 - 1, P, P, 0, 0], [35, 1, 1, 0, 0]) == {0, 1, 2, 4}
    assert _waiting(lanes, [p0 - 1, P, P, P, 0], [35, 1, 1, 1, 0]) == {1, 2, 3, 4}
    assert _waiting(lanes, [p0, P, P, P, 0], [36, 1, 1, 1, 0]) == {0, 4}
    assert _waiting(lanes, [p0, P + 2, P + 1, P + 1, 0], [36, 3, 2, 2, 0]) == {0, 4}, "isolated: no lock-step"
    # Each branch reads the trunk up to the fork, then its own text, forced right after it (not after siblings).
    for lane, (text, n) in {1: ("\n<Path>\n1: even: 4", 6), 2: ("\n<Path>\n2: odd", 4),
                            3: ("\n<Path>\n3.1: n=0", 5)}.items():
        assert _feed(lanes, lens, lane, text, n) == {}
        view = fork_view(P, lens, lane, lanes.state)
        assert view.spans == (Span(0, 0, p0), Span(lane, P, P + n)) and view.view_starts() == [0, p0]
    hog = dataclasses.replace(lanes.state, hogwild=True)  # hogwild branches: the others so far, one after another
    view = fork_view(P, lens, 2, hog)
    assert view.spans == (Span(0, 0, p0), Span(1, P, P + 6), Span(3, P, P + 5), Span(2, P, P + 4))
    assert view.view_starts() == [0, p0, p0 + 6, p0 + 11]
    hogwild = ForkJoinLanes(MULTIVERSE, num_lanes=4, prompt_len=P, max_tokens=500, hogwild=True)
    hogwild.observe(0, GOAL_MV, P + 35)
    assert _waiting(hogwild, [p0, P + 2, P + 1, P + 1], [36, 3, 2, 2]) == {0, 1}, "hogwild branches: lock-step"
    assert _waiting(hogwild, [p0, P + 1, P, 0], [36, 2, 1, 0]) == {0, 1, 2}, "until every sibling sampled"
    assert _feed(lanes, lens, 2, " done</Path>", 3) == {} and lanes.lanes_to_stop() == [2]
    assert not lanes.stopped(2, lens[2])
    assert _feed(lanes, lens, 1, " cases</Path>", 4) == {} and lanes.lanes_to_stop() == [1]
    assert not lanes.stopped(1, lens[1])
    assert _feed(lanes, lens, 3, " ok</Pa", 2) == {}
    assert _feed(lanes, lens, 3, "th>", 1) == {} and lanes.lanes_to_stop() == [3]
    version = lanes.version
    assert lanes.stopped(3, lens[3]) and lanes.version == version + 1
    assert lanes.state.forks == (ForkNode(0, p0, (1, 2, 3), (P + 10, P + 7, P + 8)),)
    assert _waiting(lanes, lens, [1] * 5) == {4}
    # The trunk goes on in its own lane after the fork, read after the longest branch (branch 1: 10 tokens).
    lens[0] = p0 + 2
    view = fork_view(P, lens, 0, lanes.state)
    assert view.spans == (Span(0, 0, p0), Span(1, P, P + 10), Span(2, P, P + 7), Span(3, P, P + 8), Span(0, p0, p0 + 2))
    assert view.view_starts() == [0, p0, p0, p0, p0 + 10]
    assert fork_view(P, lens, 4, lanes.state).spans == (Span(4, 0, P),), "a spare lane reads its own lane"
    assert lanes.record(2, 8, True) == LaneRecord(RECORD_VERSION, 2, branch="2", parent=0, lanes=(1, 2, 3),
                                                  fork_tokens=35, fork_chars=len(GOAL_MV), keep=7)
    assert lanes.record(2).keep is None, "a record before the lane finished"
    assert lanes.record(4, 1, True) == LaneRecord(RECORD_VERSION, 4, keep=0)
    lanes.trunk_finished()
    assert lanes.take_released() == [4] and lanes.lanes_to_stop() == [4], "spare lanes end once the trunk has"


GOAL2 = "Split.\n<Parallel>\n<Goal>\n<Outline>\n1: a</Outline>\n<Outline>\n2: b</Outline>\n</Goal>"
SUB_GOAL = "<Parallel>\n<Goal>\n<Outline>\n1.1: x</Outline>\n<Outline>\n1.2: y</Outline>\n</Goal>"


def test_a_branch_forks_again_nested_and_the_trunk_forks_again_after_its_join() -> None:
    from vllm_hogwild.core.forkjoin.families import ForkJoinLanes

    P = 10
    lanes = ForkJoinLanes(MULTIVERSE, num_lanes=6, prompt_len=P, max_tokens=500)
    lens = [P] * 6
    p0 = P + 30
    assert _feed(lanes, lens, 0, GOAL2, 30) == {0: "<Conclusion>\n", 1: "\n<Path>\n1:", 2: "\n<Path>\n2:"}
    assert lanes.take_released() == [1, 2] and lanes.pool == [3, 4, 5]
    lens[0] = p0
    # Branch 1 writes a goal of its own: its fork takes the lowest free lanes; its sub-branches start where it is.
    q0 = P + 12
    force = _feed(lanes, lens, 1, "\n<Path>\n1: " + SUB_GOAL, 12)
    assert force == {1: "<Conclusion>\n", 3: "\n<Path>\n1.1:", 4: "\n<Path>\n1.2:"}
    assert lanes.take_released() == [3, 4] and lanes.pool == [5]
    assert lanes.state.forks[1] == ForkNode(1, q0, (3, 4))
    assert lanes.strands[3].depth == 2 and lanes.strands[3].parent == 1
    assert _feed(lanes, lens, 2, "\n<Path>\n2: b", 5) == {}
    _feed(lanes, lens, 3, "\n<Path>\n1.1: x", 6)
    _feed(lanes, lens, 4, "\n<Path>\n1.2: y", 3)
    view = fork_view(P, lens, 3, lanes.state)
    assert view.spans == (Span(0, 0, p0), Span(1, P, q0), Span(3, P, P + 6))
    assert view.view_starts() == [0, p0, p0 + 12], "a nested branch reads every fork above it"
    # Branch 1 waits at its fork (it fed its goal's end), its sibling branch 2 goes on.
    sampled = [31, 13, 6, 6, 3, 0]
    assert _waiting(lanes, lens, sampled) == {0, 1, 5}
    assert _waiting(lanes, [p0, q0 - 1, P + 5, P, P, 0], [31, 13, 6, 1, 0, 0]) == {0, 1, 3, 5}
    # The sub-branches end (1.2 first): branch 1 joins them and goes on after the longer (6 tokens).
    _feed(lanes, lens, 4, "</Path>", 1)
    assert lanes.lanes_to_stop() == [4] and not lanes.stopped(4, lens[4])
    _feed(lanes, lens, 3, "</Path>", 1)
    assert lanes.lanes_to_stop() == [3] and lanes.stopped(3, lens[3])
    assert lanes.state.forks[1] == ForkNode(1, q0, (3, 4), (P + 7, P + 4)) and lanes.state.forks[0].ends is None
    lens[1] = q0 + 3
    view = fork_view(P, lens, 1, lanes.state)
    assert view.spans == (Span(0, 0, p0), Span(1, P, q0), Span(3, P, P + 7), Span(4, P, P + 4), Span(1, q0, q0 + 3))
    assert view.view_starts() == [0, p0, p0 + 12, p0 + 12, p0 + 12 + 7]
    _feed(lanes, lens, 1, " done</Path>", 0)
    assert lanes.lanes_to_stop() == [1] and not lanes.stopped(1, lens[1])
    _feed(lanes, lens, 2, "</Path>", 1)
    assert lanes.lanes_to_stop() == [2] and lanes.stopped(2, lens[2])
    # The trunk after its join: branch 1's whole content (its nested fork laid in), branch 2, both at p0.
    lens[0] = p0 + 2
    view = fork_view(P, lens, 0, lanes.state)
    extent1 = 12 + 7 + 3
    assert view.spans == (Span(0, 0, p0), Span(1, P, q0), Span(3, P, P + 7), Span(4, P, P + 4),
                          Span(1, q0, q0 + 3), Span(2, P, P + 6), Span(0, p0, p0 + 2))
    assert view.view_starts() == [0, p0, p0 + 12, p0 + 12, p0 + 19, p0, p0 + extent1]
    # Another goal of the trunk's, after its join: a second fork, from the last free lane.
    goal = "\n<Goal>\n<Outline>\n7: c</Outline>\n</Goal>"
    assert _feed(lanes, lens, 0, goal, 8) == {0: "<Conclusion>\n", 5: "\n<Path>\n7:"} and lanes.pool == []
    assert lanes.state.forks[2] == ForkNode(0, p0 + 10, (5,))
    lens[5] = P + 2
    view = fork_view(P, lens, 5, lanes.state)
    assert view.view_starts()[-1] == p0 + extent1 + 10 and view.spans[-1] == Span(5, P, P + 2)
    assert lanes.record(5).fork_tokens == 40 and lanes.record(3).parent == 1
    # No lane left: the next goal does not fork, and says why.
    assert _feed(lanes, lens, 5, "x</Path>", 1) == {} and lanes.stopped(5, lens[5])
    assert _feed(lanes, lens, 0, goal, 9) == {} and [(b, r) for b, _, r in lanes.unforked] == [
        (None, "a goal of 1 parts: more branches than the request's free branch lanes (0; hogwild_max_branches)")]


def test_hogwild_branches_do_not_nest_and_no_fork_may_reach_past_the_context() -> None:
    from vllm_hogwild.core.forkjoin.families import ForkJoinLanes

    P = 10
    hog = ForkJoinLanes(MULTIVERSE, num_lanes=6, prompt_len=P, max_tokens=500, hogwild=True)
    assert set(hog.observe(0, GOAL2, P + 30)) == {0, 1, 2}
    assert hog.observe(1, "\n<Path>\n1: " + SUB_GOAL, P + 12) == {} and hog.pool == [3, 4, 5]
    assert hog.unforked == [], "a goal inside a hogwild branch is text"
    # Every lane may write its whole budget: a fork goes only where that keeps positions inside the window.
    tight = ForkJoinLanes(MULTIVERSE, num_lanes=6, prompt_len=P, max_tokens=100, max_positions=P + 250)
    assert set(tight.observe(0, GOAL2, P + 30)) == {0, 1, 2}  # P + 100 + 100 <= P + 250
    assert tight.observe(1, "\n<Path>\n1: " + SUB_GOAL, P + 12) == {}  # P + 100 + (100 + 100) > P + 250
    assert [(b, at) for b, at, _ in tight.unforked] == [("1", 12)] and tight.pool == [3, 4, 5]
    assert "context window (260 positions)" in tight.unforked[0][2]


def test_tags_that_are_special_tokens_fork_though_the_clients_text_leaves_them_out() -> None:
    """Multiverse's tags are special tokens of its tokenizer: a request's text skips them by default. The protocol
    reads them (``hidden``); the fork point counts the characters the client's text has."""
    from vllm_hogwild.core.forkjoin.families import ForkJoinLanes

    lanes = ForkJoinLanes(MULTIVERSE, num_lanes=3, prompt_len=4, max_tokens=500)
    pieces = [("Split.\n", ""), ("", "<Goal>"), ("\n", ""), ("", "<Outline>"), ("\n1: a", ""), ("", "</Outline>"),
              ("", "<Outline>"), ("\n2: b", ""), ("", "</Outline>"), ("\n", "")]
    for i, (visible, hidden) in enumerate(pieces):
        assert lanes.observe(0, visible, 5 + i, hidden) == {}
    force = lanes.observe(0, "", 15, "</Goal>")
    assert set(force) == {0, 1, 2} and lanes.state.forks[0].at == 15
    assert lanes.record(1).fork_chars == len("Split.\n\n\n1: a\n2: b\n"), "the client's characters"
    assert lanes.observe(1, "\n\n1: a", 8, "") == {} and lanes.observe(1, "", 9, "</Path>") == {}
    assert lanes.lanes_to_stop() == [1], "a branch end that is a special token ends the branch"


def test_lanes_refuse_a_fork_wider_than_their_lanes_and_follow_the_familys_rules() -> None:
    from vllm_hogwild.core.forkjoin.families import ForkJoinLanes, prompt_goal

    lanes = ForkJoinLanes(MULTIVERSE, num_lanes=3, prompt_len=5, max_tokens=500)
    assert lanes.observe(0, GOAL_MV, 40) == {} and lanes.state is None  # three parts, two branch lanes
    assert "3 parts" in lanes.unforked[0][2] and lanes.record(1, 0, False).unforked == tuple(lanes.unforked)
    assert lanes.trunk_record().unforked == tuple(lanes.unforked)
    lanes.trunk_finished()
    assert lanes.take_released() == [1, 2] and lanes.lanes_to_stop() == [1, 2], "unused lanes end at once"
    npr = ForkJoinLanes(NPR, num_lanes=6, prompt_len=5, max_tokens=1500)
    assert npr.observe(0, GOAL_NPR, 600) == {} and npr.state is None  # under 1,024 tokens left: no fork
    assert npr.retired and _waiting(npr, [5] * 6, [0] * 6) == set(), "no fork can come: the lanes went back"
    assert npr.observe(2, "text", 6) == {}, "a lane no fork took writes nothing the protocol reads"
    # A prompt's tail: a complete goal forks at once; an unclosed one is carried to the trunk's text.
    assert prompt_goal(MULTIVERSE, "intro " + GOAL_MV + "\n") == (("1", "2", "3.1"), "")
    parts, open_goal = prompt_goal(MULTIVERSE, "intro " + GOAL_MV[:60])
    assert parts is None and open_goal.startswith("<Goal>")
    carried = ForkJoinLanes(MULTIVERSE, num_lanes=4, prompt_len=5, max_tokens=500, trunk_text=open_goal)
    assert carried.observe(0, GOAL_MV[60:], 30)[1] == "\n<Path>\n1:", "the prompt's entries count"


def test_a_fork_the_trunk_writes_runs_through_the_group_table_in_the_engines_order() -> None:
    """Through the stand-in engine (tests/unit/table_engine.py): the branch lanes wait outside the queues until
    the trunk writes its goal; every lane samples its first (forced) token before the trunk's first token after
    the fork; the branches decode while the trunk waits; each ends with its end of sequence once it wrote its
    end; the trunk goes on with the join header once every branch has stopped; every lane is freed."""
    from tests.unit.table_engine import EOS, FakeEngine, decode
    from vllm_hogwild.core.forkjoin.lane_channel import RECORD_VERSION, LaneRecord

    engine = FakeEngine(prompt_len=6)
    trunk_script = "Go <Goal>\n<Outline>\n1: a</Outline>\n<Outline>\n2: b</Outline>\n</Goal>" + "x" * 200
    scripts = {"0_g": trunk_script, "1_g": "\n<Path>\n1: left</Path>", "2_g": "\n<Path>\n2: right side</Path>",
               "3_g": "never"}  # a lane's script at its output index (forced tokens take theirs)
    lanes = engine.add_group("g", 4, max_tokens=120, protocol="multiverse")
    records, order = {}, []
    stop = engine.stop

    def stop_and_record(request):
        record = engine.table.lane_record(request.request_id, finished=True)
        if record is not None:
            records[request.request_id] = record
        stop(request)

    engine.stop = stop_and_record

    def sample(request, k):
        script = scripts[request.request_id]
        return ord(script[request.num_output_tokens % len(script)])

    goal_len = trunk_script.index("</Goal>") + len("</Goal>")
    seen = {r.request_id: 0 for r in lanes}
    for step in range(400):
        if not engine.table:
            break
        engine.step(sample)
        for r in lanes:  # (step, lane, output index) of every token, sampled or forced
            order += [(step, r.request_id, i) for i in range(seen[r.request_id], r.num_output_tokens)]
            seen[r.request_id] = r.num_output_tokens
        if lanes[0].num_output_tokens < goal_len:
            assert all(r.status == "aside" for r in lanes[1:]), "branch lanes wait outside the queues"
    assert not engine.table and engine.table.num_aside == 0
    texts = {r.request_id: decode(r.output_token_ids) for r in lanes}
    assert texts["1_g"] == "\n<Path>\n1: left</Path>" and texts["2_g"] == "\n<Path>\n2: right side</Path>"
    assert texts["3_g"] == "" and lanes[3].output_token_ids == [EOS], "the spare lane only ends"
    assert texts["0_g"].startswith(trunk_script[:goal_len] + "<Conclusion>\nx")
    assert [lanes[i].output_token_ids[-1] for i in (1, 2)] == [EOS, EOS]
    # Every branch lane's first token comes in a step before the trunk's first token after the fork; the lane no
    # fork took ends once no fork can take it: the branches ended, and the trunk has written 91 of its 120
    # tokens (Multiverse forks with 30 left), long before the trunk ends.
    after = next(step for step, rid, i in order if rid == "0_g" and i == goal_len)
    assert all(step < after for step, rid, i in order if rid in ("1_g", "2_g") and i == 0)
    past = next(step for step, rid, i in order if rid == "0_g" and i == 90)
    (spare_step,) = [step for step, rid, _ in order if rid == "3_g"]
    assert past < spare_step <= past + 2 and spare_step < max(step for step, rid, _ in order if rid == "0_g") - 20
    # The branches decode while the trunk waits; its join header goes on once both stopped.
    last_branch = max(step for step, rid, _ in order if rid in ("1_g", "2_g"))
    assert not [i for step, rid, i in order if rid == "0_g" and after < step <= last_branch]
    assert records["1_g"] == LaneRecord(RECORD_VERSION, 1, branch="1", parent=0, lanes=(1, 2), fork_tokens=goal_len,
                                        fork_chars=goal_len, keep=len(texts["1_g"]))
    assert records["3_g"].branch is None and records["3_g"].keep == 0
    forks = [f.state.forks for w in engine.wires for f in w.forks]
    assert len(forks) == 2 and forks[0][0].ends is None and forks[1][0].ends == (6 + len(texts["1_g"]),
                                                                               6 + len(texts["2_g"]))
    assert forks[0][0].at == 6 + goal_len
    assert set(engine.freed) == {r.request_id for r in lanes}


@pytest.mark.parametrize("when", ["before the fork", "during the branches"])
def test_an_aborted_fork_join_request_leaves_nothing_behind(when) -> None:
    from tests.unit.table_engine import FakeEngine

    engine = FakeEngine(prompt_len=6)
    goal = "<Goal>\n<Outline>\n1: a</Outline>\n<Outline>\n2: b</Outline>\n</Goal>"
    script = {"0_g": goal + "x" * 50, "1_g": "\n<Path>\n1: aaaa", "2_g": "\n<Path>\n2: bbbb", "3_g": "z"}
    lanes = engine.add_group("g", 4, max_tokens=200, protocol="multiverse")
    steps = 5 if when == "before the fork" else len(goal) + 6
    for _ in range(steps):
        engine.step(lambda r, k: ord(script[r.request_id][r.num_output_tokens % len(script[r.request_id])]))
    assert (lanes[1].status == "aside") == (when == "before the fork")
    engine.abort("g")
    assert not engine.table and engine.table.num_aside == 0 and engine.table.num_queued == 0


def test_lanes_kept_back_for_a_fork_keep_their_blocks_from_later_admissions_with_reserve() -> None:
    """With ``reserve`` the lanes a fork/join group keeps back for its forks count at admission with their whole
    budgets (1 + 4 x 11 = 45 blocks for the group): a second group that would fit only in those blocks waits
    (its trunk would wait for them)."""
    from tests.unit.table_engine import FakeEngine

    engine = FakeEngine(prompt_len=6, block_size=4, num_blocks=60, kv="reserve")
    a = engine.add_group("a", 4, max_tokens=40, protocol="multiverse")
    engine.step(lambda r, k: ord("x"))
    assert a[0].status == "running" and all(r.status == "aside" for r in a[1:])
    b = engine.add_group("b", 4, max_tokens=40, protocol="multiverse")
    engine.step(lambda r, k: ord("x"))  # a's trunk holds 12 blocks; its kept lanes 33 more
    assert all(r.status == "aside" for r in b) and engine.table.num_waiting_groups == 1
    for _ in range(60):  # a's trunk ends (no goal: its lanes end once it has), then b goes in
        if all(r.status == "finished" for r in a):
            break
        engine.step(lambda r, k: ord("x"))
    engine.step(lambda r, k: ord("x"))
    assert all(r.status == "finished" for r in a) and b[0].status == "running"


def test_lanes_kept_back_for_a_fork_take_no_kv_until_it_comes_with_on_demand() -> None:
    """With ``on-demand`` a lane no fork took yet costs nothing at admission: a second group goes in beside the
    first in 10 blocks (each trunk takes 2; the 6 kept lanes would have taken 12). When a fork takes lanes, they
    ask for their first blocks like any request, and until the engine schedules them the table lists them for
    the room-making pass (request id, slots of their first allocation, the prompt's length). Before this rule, the second
    group waited here for the blocks of the first one's kept lanes."""
    from tests.unit.table_engine import FakeEngine

    engine = FakeEngine(prompt_len=6, block_size=4, num_blocks=10)
    goal = "<Goal>\n<Outline>\n1: a</Outline>\n<Outline>\n2: b</Outline>\n</Goal>"
    scripts = {"0_a": "x" * 8 + goal + "y" * 40, "1_a": "\n<Path>\n1: a</Path>", "2_a": "\n<Path>\n2: b</Path>"}
    a = engine.add_group("a", 4, max_tokens=200, protocol="multiverse")
    seen, table_step = [], engine.table.step

    def spy(*args, **kwargs):  # what the room-making pass would read before vLLM schedules
        seen.append(engine.table.forked_lanes())
        return table_step(*args, **kwargs)

    engine.table.step = spy

    def sample(request, k):
        script = scripts.get(request.request_id, "z")
        return ord(script[request.num_output_tokens % len(script)])

    engine.step(sample)
    b = engine.add_group("b", 4, max_tokens=200, protocol="multiverse")
    engine.step(sample)
    assert a[0].status == "running" and b[0].status == "running", "the kept lanes took no block"
    assert all(r.status == "aside" for r in a[1:] + b[1:])
    assert engine.table.admitter.spare() == (6, 0), "slots kept, no block"
    for _ in range(len(goal) + 14):  # (the goal ends with the trunk's 73rd token)
        engine.step(sample)
    forked = [lanes for lanes in seen if lanes]
    assert forked == [[("1_a", 7, 6), ("2_a", 7, 6)]], "listed once: queued, then scheduled"
    assert a[1].status == "running" and a[3].status == "aside" and engine.table.forked_lanes() == []


def test_lanes_no_fork_can_take_go_back_at_once() -> None:
    """A request's spare lanes are released (each to end at once) as soon as no sequence may fork any more by
    the family's rules, not when the trunk ends; a goal written after that says the family's reason."""
    from vllm_hogwild.core.forkjoin.families import ForkJoinLanes

    # NPR: the trunk forks only with 1,024 tokens of budget left; with 1,500 it may until it has written 476.
    npr = ForkJoinLanes(NPR, num_lanes=4, prompt_len=5, max_tokens=1500)
    assert npr.observe(0, "x", 5 + 476) == {} and npr.pool == [1, 2, 3]
    assert npr.observe(0, "x", 5 + 477) == {} and npr.pool == [] and npr.retired
    assert npr.take_released() == [1, 2, 3] and npr.lanes_to_stop() == [1, 2, 3]
    assert npr.observe(0, GOAL_NPR, 5 + 600) == {}
    assert npr.unforked == [(None, 600, "900 tokens of budget left: npr forks with at least 1024 left")]
    # NPR does not nest: once its fork took lanes 1-2 and the trunk is past its budget, lane 3 goes back while the
    # branches still run.
    npr = ForkJoinLanes(NPR, num_lanes=4, prompt_len=5, max_tokens=1500)
    assert set(npr.observe(0, GOAL_NPR, 5 + 400)) == {0, 1, 2} and npr.pool == [3]
    assert npr.take_released() == [1, 2]  # the fork's lanes, to the engine's queue
    assert npr.observe(1, "\n<step>\n1: a", 5 + 5) == {} and npr.pool == [3]  # the trunk waits; it may fork again
    npr.strands[0].written = 477  # (what the trunk's next tokens would make it)
    assert npr.observe(2, "\n<step>\n2: b", 5 + 5) == {} and npr.pool == [] and npr.take_released() == [3]
    # Multiverse nests: a branch with budget left keeps the pool.
    mv = ForkJoinLanes(MULTIVERSE, num_lanes=5, prompt_len=5, max_tokens=100)
    assert set(mv.observe(0, GOAL2, 5 + 60)) == {0, 1, 2} and mv.pool == [3, 4] and mv.take_released() == [1, 2]
    assert mv.observe(0, "x", 5 + 71) == {} and mv.pool == [3, 4]  # the trunk is past its budget, branches not
    assert mv.observe(1, "y", 5 + 71) == {} and mv.observe(2, "y", 5 + 70) == {} and mv.pool == [3, 4]
    assert mv.observe(2, "y", 5 + 71) == {} and mv.pool == [] and mv.take_released() == [3, 4]


def test_a_lane_that_must_end_next_cuts_an_accepted_run_there() -> None:
    """With speculative decoding a lane may accept several tokens in a step; a branch's run is cut where its end
    of sequence must come next, as one token per step would reach it: one token short of its budget (so the token
    before is fed and the join reads it), or right after it wrote its end. The trunk has no budget end here."""
    from vllm_hogwild.core.protocol.driver import ForkJoinDriver
    from vllm_hogwild.core.options import parse_request

    options = parse_request({"hogwild_protocol": "multiverse", "hogwild_branch_end": "[jqyz]"})
    driver = ForkJoinDriver(options, 3, 40, 5, lambda text: [ord(c) for c in text], fork_now=("1", "2"))
    lanes = driver.lanes
    for queue in driver.queues:  # (the headers forced: nothing queued any more)
        queue.clear()
    assert not driver.may_force(1, 38) and driver.may_force(1, 39), "one token short of the budget"
    assert not driver.may_force(0, 39), "the trunk ends at its budget as any request does"
    lanes.observe(2, "a", 5 + 10)
    assert not driver.may_force(2, 10)
    lanes.observe(2, "z", 5 + 11)  # its end
    assert driver.may_force(2, 11) and lanes.ends_next(2, 11)
    driver.end_lanes([0, 0, 0])
    assert list(driver.queues[2]) == [0], "its end of sequence is forced next"


@pytest.mark.parametrize("chunk", [1 << 20, 4], ids=["whole", "cut by the token budget"])
def test_headers_are_fed_ahead_in_one_step_and_what_is_not_fed_goes_back(chunk) -> None:
    """Through the stand-in engine: a branch header's tokens after its first, and the join header's, are fed in
    one step with the token before them; the wire names them. Where the step's budget cuts a lane short, the
    tokens it did not feed go back to its queue and the next is forced as without feeding ahead. The document
    is the same as with headers forced one token a step (the control), in fewer steps."""
    from tests.unit.table_engine import FakeEngine, decode

    goal = "Go <Goal>\n<Outline>\n1: a</Outline>\n<Outline>\n2: b</Outline>\n</Goal>"
    scripts = {"0_g": goal + "x" * 100, "1_g": "\n<Path>\n1: left</Path>", "2_g": "\n<Path>\n2: right</Path>"}

    def run(ahead: bool):
        engine = FakeEngine(prompt_len=6, chunk=chunk)
        engine.table.feeding_ahead = ahead
        lanes = engine.add_group("g", 3, max_tokens=120, protocol="multiverse")
        fed = []  # per step: request id -> tokens fed
        while engine.table:
            engine.step(lambda r, k: ord(scripts[r.request_id][r.num_output_tokens % len(scripts[r.request_id])]))
            fed.append({row.request_id: row.num_scheduled for row in engine.rows})
        return engine, [decode(r.output_token_ids) for r in lanes], fed

    engine, texts, fed = run(True)
    control, control_texts, control_fed = run(False)
    assert texts == control_texts
    assert texts[1] == "\n<Path>\n1: left</Path>" and texts[0].startswith(goal + "<Conclusion>\nx")
    forced = [p for w in engine.wires for p in w.fed_ahead.items()]
    assert not [p for w in control.wires for p in w.fed_ahead.items()]
    header, join = len("\n<Path>\n1:"), len("<Conclusion>\n")
    if chunk > 100:
        assert sorted(len(tokens) for _, (_, tokens) in forced) == [header - 1, header - 1, join - 1]
        assert {r: n for step in fed for r, n in step.items() if n == header} == {"1_g": header, "2_g": header}
        assert len(control_fed) - len(fed) == (header - 1) + (join - 1)
    else:  # at most 4 tokens a step: each header is fed in parts, the rest given back and forced again
        assert forced and all(len(tokens) <= chunk - 1 for _, (_, tokens) in forced)
        assert max(n for step in fed for r, n in step.items() if r != "0_g" or n < 6) <= chunk
        assert len(fed) < len(control_fed)
