"""A fork/join request's lanes assembled into one completion (serving/assembly.py), whole and streamed.

The lanes' outputs are vLLM's own CompletionOutput objects, fed as the output processor would: one
lane's delta at a time, in the order the engine produces them around a fork the trunk wrote (every lane
samples before the trunk's first token after the fork; see core/forkjoin/families.ForkJoinLanes). The engine-level
runs (tests/integration/test_forkjoin.py) start their forks at once: a random model writes no goal.
"""

from __future__ import annotations

import pytest

from vllm_hogwild.core.forkjoin.lane_channel import new_record
from vllm_hogwild.core.options import RequestOptions, RequestSpec
from vllm_hogwild.serving.assembly import Assembly

EOS = 2
SPEC = RequestSpec(RequestOptions(layout="forkjoin", protocol="multiverse"), num_workers=4)


def out(index, text, ids, finish=None, record=None):
    """A lane's CompletionOutput as the output processor hands it over: a lane ≥ 1's record attached."""
    from vllm.logprobs import Logprob
    from vllm.outputs import CompletionOutput

    completion = CompletionOutput(index=index, text=text, token_ids=list(ids), cumulative_logprob=None,
                                  logprobs=[{t: Logprob(-0.5)} for t in ids], finish_reason=finish, stop_reason=None)
    if record is not None:
        completion.hogwild_lane = record
    return completion


def rec(lane, branch, keep=None, parent=0, lanes=(1, 2), tokens=2, chars=11):
    """A lane's record as the engine sends it: from its first output on; ``keep`` with its last."""
    if branch is None:
        return new_record(lane, keep=keep)
    return new_record(lane, branch=branch, parent=parent, lanes=tuple(lanes), fork_tokens=tokens, fork_chars=chars,
                      keep=keep)


# The engine's order: trunk "Plan" "</Goal>"; every branch lane's first sample (its header), each output with
# its record; the trunk's join header token (held); branch 2 ends first, branch 1 after; then the trunk; lane 3,
# which no fork took, ends once the trunk has.
EVENTS = [
    (out(0, "Plan", [10]), False),
    (out(0, "</Goal>", [11]), False),
    (out(1, "\nP1:", [20], record=rec(1, "1")), False),
    (out(2, "\nP2:", [30], record=rec(2, "2")), False),
    (out(0, "<C>", [12]), False),
    (out(1, " a", [21], record=rec(1, "1")), False),
    (out(2, " b.", [31], record=rec(2, "2")), False),
    (out(1, " c", [22], record=rec(1, "1")), False),
    (out(2, "", [EOS], "stop", rec(2, "2", 2)), False),
    (out(1, ".", [23], record=rec(1, "1")), False),
    (out(1, "", [EOS], "stop", rec(1, "1", 4)), False),
    (out(0, " so", [13]), False),
    (out(0, " done", [14], "length"), False),
    (out(3, "", [EOS], "stop", rec(3, None, 0)), True),
]
DOCUMENT = "Plan</Goal>\nP1: a c.\nP2: b.<C> so done"
TOKENS = [10, 11, 20, 21, 22, 23, 30, 31, 12, 13, 14]


def finals(events):
    """Each lane's whole output, as vLLM hands them over in ``FINAL_ONLY`` mode."""
    whole = {}
    for o, _ in events:
        if o.index not in whole:
            whole[o.index] = out(o.index, "", [])
        f = whole[o.index]
        f.text += o.text
        f.token_ids = [*f.token_ids, *o.token_ids]
        f.logprobs = [*f.logprobs, *o.logprobs]
        f.finish_reason, f.stop_reason = o.finish_reason, o.stop_reason
        if getattr(o, "hogwild_lane", None) is not None:
            f.hogwild_lane = o.hogwild_lane
    return list(whole.values())


def test_a_whole_completion_is_the_flat_document_with_its_tree() -> None:
    merged = Assembly(SPEC, streaming=False).whole(finals(EVENTS))
    assert merged.index == 0 and merged.text == DOCUMENT and merged.token_ids == TOKENS
    assert len(merged.logprobs) == len(TOKENS) and merged.finish_reason == "length"
    assert merged.cumulative_logprob == pytest.approx(-0.5 * len(TOKENS))
    tree = merged.hogwild
    assert tree["forked"] and tree["fork_tokens"] == 2 and tree["trunk_tokens"] == 5
    assert [(r["branch"], r["text"], r["num_tokens"]) for r in tree["branches"]] == [
        ("1", "\nP1: a c.", 4), ("2", "\nP2: b.", 2)]
    assert tree["forks"] == [{"fork_tokens": 2, "branches": tree["branches"]}]
    assert tree["num_tokens"] == len(TOKENS) and tree["sequential_steps"] == 5 + 4


def test_a_stream_sends_the_same_document_in_order_each_token_once() -> None:
    assembly = Assembly(SPEC, streaming=True)
    deltas = [d for o, finished in EVENTS if (d := assembly.stream(o, finished)) is not None]
    assert "".join(d.text for d in deltas) == DOCUMENT
    assert [t for d in deltas for t in d.token_ids] == TOKENS
    assert [d.finish_reason for d in deltas][-1] == "length" and all(d.finish_reason is None for d in deltas[:-1])
    assert all(d.index == 0 for d in deltas)
    assert deltas[-1].hogwild["branches"][1] == {"branch": "2", "text": "\nP2: b.", "num_tokens": 2, "steps": 2}
    assert deltas[-1].hogwild["trunk_tokens"] == 5, "the last output carries the tree"
    # Branch 1 goes out live; branch 2's text waits for branch 1's end, the trunk's for the last branch's.
    texts = [d.text for d in deltas]
    assert texts[:5] == ["Plan", "</Goal>", "\nP1:", " a", " c"]
    assert texts[5] == "." and texts[6] == "\nP2: b.<C>"


def test_a_request_that_never_forks_is_its_trunk() -> None:
    assembly = Assembly(SPEC, streaming=True)
    events = [(out(0, "Just text", [10, 11], "length"), False)]
    events += [(out(i, "", [EOS], "stop", rec(i, None, 0)), i == 3) for i in (1, 2, 3)]
    deltas = [d for o, finished in events if (d := assembly.stream(o, finished)) is not None]
    assert "".join(d.text for d in deltas) == "Just text" and [t for d in deltas for t in d.token_ids] == [10, 11]
    assert deltas[-1].finish_reason == "length" and all(d.finish_reason is None for d in deltas[:-1])


SPEC6 = RequestSpec(RequestOptions(layout="forkjoin", protocol="multiverse"), num_workers=6)
# A nested fork and a second fork of the trunk: the trunk forks (lanes 1, 2) after "G"; branch 1 forks (lanes 3, 4)
# after "\nP1:g" (2 tokens, 5 characters); after the trunk's join, it forks again (lane 5) after "G<C>x" + "G".
NESTED = [
    (out(0, "G", [10]), False),
    (out(1, "\nP1:", [20], record=rec(1, "1", tokens=1, chars=1)), False),
    (out(2, "\nP2:", [30], record=rec(2, "2", tokens=1, chars=1)), False),
    (out(0, "<C>", [11]), False),
    (out(1, "g", [21], record=rec(1, "1", tokens=1, chars=1)), False),
    (out(2, " two", [31], record=rec(2, "2", tokens=1, chars=1)), False),
    (out(3, "\nP1.1:", [40], record=rec(3, "1.1", parent=1, lanes=(3, 4), tokens=2, chars=5)), False),
    (out(4, "\nP1.2:", [50], record=rec(4, "1.2", parent=1, lanes=(3, 4), tokens=2, chars=5)), False),
    (out(1, "<C>", [22], record=rec(1, "1", tokens=1, chars=1)), False),
    (out(2, "", [EOS], "stop", rec(2, "2", 2, tokens=1, chars=1)), False),
    (out(4, " y", [51], record=rec(4, "1.2", parent=1, lanes=(3, 4), tokens=2, chars=5)), False),
    (out(3, " x", [41], record=rec(3, "1.1", parent=1, lanes=(3, 4), tokens=2, chars=5)), False),
    (out(4, "", [EOS], "stop", rec(4, "1.2", 2, parent=1, lanes=(3, 4), tokens=2, chars=5)), False),
    (out(3, "", [EOS], "stop", rec(3, "1.1", 2, parent=1, lanes=(3, 4), tokens=2, chars=5)), False),
    (out(1, " one", [23], record=rec(1, "1", tokens=1, chars=1)), False),
    (out(1, "", [EOS], "stop", rec(1, "1", 4, tokens=1, chars=1)), False),
    (out(0, "x", [12]), False),
    (out(0, "G", [13]), False),
    (out(5, "\nP9:", [60], record=rec(5, "9", lanes=(5,), tokens=4, chars=6)), False),
    (out(0, "<C>", [14]), False),
    (out(5, " z", [61], record=rec(5, "9", lanes=(5,), tokens=4, chars=6)), False),
    (out(5, "", [EOS], "stop", rec(5, "9", 2, lanes=(5,), tokens=4, chars=6)), False),
    (out(0, " end", [15], "stop"), True),
]
NESTED_DOC = "G" + "\nP1:g" + "\nP1.1: x" + "\nP1.2: y" + "<C> one" + "\nP2: two" + "<C>xG" + "\nP9: z" + "<C> end"
NESTED_TOKENS = [10, 20, 21, 40, 41, 50, 51, 22, 23, 30, 31, 11, 12, 13, 60, 61, 14, 15]


def test_nested_and_second_forks_assemble_in_document_order_whole_and_streamed() -> None:
    merged = Assembly(SPEC6, streaming=False).whole(finals(NESTED))
    assert merged.text == NESTED_DOC and merged.token_ids == NESTED_TOKENS
    tree = merged.hogwild
    assert [f["fork_tokens"] for f in tree["forks"]] == [1, 4] and tree["branches"] == tree["forks"][0]["branches"]
    one = tree["branches"][0]
    assert one["text"] == "\nP1:g\nP1.1: x\nP1.2: y<C> one" and one["num_tokens"] == 4 + 2 + 2
    assert [b["branch"] for b in one["forks"][0]["branches"]] == ["1.1", "1.2"] and one["steps"] == 4 + 2
    assert "forks" not in tree["branches"][1], "a branch that did not fork has no forks"
    assert tree["num_tokens"] == len(NESTED_TOKENS)
    assert tree["sequential_steps"] == 6 + max(6, 2) + 2  # the trunk's, branch 1's (with its longest), branch 9's
    assembly = Assembly(SPEC6, streaming=True)
    deltas = [d for o, finished in NESTED if (d := assembly.stream(o, finished)) is not None]
    assert "".join(d.text for d in deltas) == NESTED_DOC
    assert [t for d in deltas for t in d.token_ids] == NESTED_TOKENS
    assert deltas[-1].hogwild == tree
    texts = [d.text for d in deltas]
    assert texts[:5] == ["G", "\nP1:", "g", "\nP1.1:", " x"], "the first branch of each fork goes out live"


def test_a_parent_delta_that_straddles_its_fork_is_cut_at_the_fork_point() -> None:
    """With vLLM's --stream-interval above 1 the trunk's text before and after a fork may come in one output."""
    events = [
        (out(1, "\nP1:", [20], record=rec(1, "1")), False),
        (out(2, "\nP2:", [30], record=rec(2, "2")), False),
        (out(1, "", [EOS], "stop", rec(1, "1", 1)), False),
        (out(2, "", [EOS], "stop", rec(2, "2", 1)), False),
        (out(0, "Plan</Goal><C> so", [10, 11, 12, 13], "length"), False),
        (out(3, "", [EOS], "stop", rec(3, None, 0)), True),
    ]
    assembly = Assembly(SPEC, streaming=True)
    deltas = [d for o, finished in events if (d := assembly.stream(o, finished)) is not None]
    assert "".join(d.text for d in deltas) == "Plan</Goal>\nP1:\nP2:<C> so"
    assert [t for d in deltas for t in d.token_ids] == [10, 11, 20, 30, 12, 13]


def test_a_fork_the_prompt_ends_in_is_known_before_any_branch_speaks() -> None:
    """The prompt ends in a goal: the trunk's first token (its join header's) may come before the branches'."""
    spec = RequestSpec(RequestOptions(layout="forkjoin", protocol="multiverse"), num_workers=4, fork_now=("1", "2"))
    start = dict(tokens=0, chars=0)
    events = [
        (out(0, "<C>", [12]), False),
        (out(1, "\nP1: a", [20, 21], record=rec(1, "1", **start)), False),
        (out(2, "\nP2:", [30], record=rec(2, "2", **start)), False),
        (out(2, "", [EOS], "stop", rec(2, "2", 1, **start)), False),
        (out(1, "", [EOS], "stop", rec(1, "1", 2, **start)), False),
        (out(0, " so", [13], "length"), False),
        (out(3, "", [EOS], "stop", rec(3, None, 0)), True),
    ]
    assembly = Assembly(spec, streaming=True)
    deltas = [d for o, finished in events if (d := assembly.stream(o, finished)) is not None]
    assert "".join(d.text for d in deltas) == "\nP1: a\nP2:<C> so"
    assert [t for d in deltas for t in d.token_ids] == [20, 21, 30, 12, 13]


def test_a_lane_record_crosses_vllms_own_wire_only_with_the_plugins_types() -> None:
    """The engine core's batch, encoded by vLLM's own encoder, decoded as the hooked client does: the record
    arrives with its output, every other output is vLLM's. Control: vLLM's stock decoder drops the field."""
    import msgspec
    from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

    from vllm_hogwild.core.forkjoin.lane_channel import LaneRecord, check, output_types, record_of, with_record

    output_type, outputs_type = output_types(EngineCoreOutput, EngineCoreOutputs)
    assert output_types(EngineCoreOutput, EngineCoreOutputs) == (output_type, outputs_type), "one pair per process"
    record = rec(2, "3.1", 5, parent=1, lanes=(2, 4))
    lane = EngineCoreOutput("lane-2", [7, 8], finish_reason=None, stop_reason=None)
    batch = EngineCoreOutputs(outputs=[EngineCoreOutput("plain", [1]), with_record(lane, record, output_type)])
    assert batch.outputs[1].new_token_ids == [7, 8] and batch.outputs[1].stop_reason is None
    frames = MsgpackEncoder().encode(batch)
    got = MsgpackDecoder(outputs_type).decode(frames)
    assert [record_of(o) for o in got.outputs] == [None, record]
    assert got.outputs[1].new_token_ids == [7, 8] and got.outputs[0].request_id == "plain"
    stock = MsgpackDecoder(EngineCoreOutputs).decode(frames)
    assert [record_of(o) for o in stock.outputs] == [None, None], "vLLM's decoder drops a field it does not know"
    with pytest.raises(RuntimeError, match="version 99"):
        check(msgspec.structs.replace(record, version=99))
    assert isinstance(record, LaneRecord)


def test_tokens_fed_in_one_step_count_one_sequential_step() -> None:
    """Each output carries its tokens' accept steps (forced text fed ahead, or accepted drafts, share one): a
    lane's sequential steps are its distinct steps, not its tokens."""
    events = []
    for step, (o, finished) in enumerate(EVENTS):  # copies: EVENTS is shared
        copy = out(o.index, o.text, o.token_ids, o.finish_reason, getattr(o, "hogwild_lane", None))
        copy.hogwild = {"accept_steps": [step] * len(o.token_ids)}
        events.append((copy, finished))
    joined = out(1, " c.", [22, 23], record=rec(1, "1"))  # branch 1's last two tokens in one step
    joined.hogwild = {"accept_steps": [7, 7]}
    events = [e for e in events if e[0].token_ids not in ([22], [23])]
    events.insert(7, (joined, False))
    assembly = Assembly(SPEC, streaming=True)
    deltas = [d for o, finished in events if (d := assembly.stream(o, finished)) is not None]
    tree = deltas[-1].hogwild
    assert [t for d in deltas for t in d.token_ids] == TOKENS
    assert tree["branches"][0]["num_tokens"] == 4 and tree["branches"][0]["steps"] == 3
    assert tree["sequential_steps"] == 5 + 3
