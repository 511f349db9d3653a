"""A fork/join request's lanes assembled into one completion (serving/forkjoin.py), whole and streamed.

The lanes' outputs are vLLM's own CompletionOutput objects, fed as the output processor would: one
lane's delta at a time, in the order the engine produces them around a fork the trunk wrote (every lane
samples before the trunk's first token after the fork; see core/forkjoin.ForkJoinLanes). The engine-level
runs (tests/integration/test_forkjoin.py) start their forks at once: a random model writes no goal.
"""

from __future__ import annotations

import pytest

from vllm_hogwild.core.forkjoin import lane_record
from vllm_hogwild.core.options import RequestOptions, RequestSpec
from vllm_hogwild.serving.forkjoin import Assembly

EOS = 2
SPEC = RequestSpec(RequestOptions(layout="forkjoin", protocol="multiverse"), num_workers=4)


def out(index, text, ids, finish=None, record=None):
    from vllm.logprobs import Logprob
    from vllm.outputs import CompletionOutput

    return CompletionOutput(index=index, text=text, token_ids=list(ids), cumulative_logprob=None,
                            logprobs=[{t: Logprob(-0.5)} for t in ids], finish_reason=finish,
                            stop_reason=None if record is None else lane_record(record))


def rec(lane, branch, keep):
    return {"lane": lane, "branch": branch, "keep": keep, "fork_tokens": 2, "fork_chars": 11}


# The engine's order: trunk "Plan" "</Goal>"; every lane's first sample (branch headers; lane 3 is spare and
# ends at once); the trunk's join header token (held); branch 2 ends first, branch 1 after; then the trunk.
EVENTS = [
    (out(0, "Plan", [10]), False),
    (out(0, "</Goal>", [11]), False),
    (out(1, "\nP1:", [20]), False),
    (out(2, "\nP2:", [30]), False),
    (out(3, "", [EOS], "stop", rec(3, None, 0)), False),
    (out(0, "<C>", [12]), False),
    (out(1, " a", [21]), False),
    (out(2, " b.", [31]), False),
    (out(1, " c", [22]), False),
    (out(2, "", [EOS], "stop", rec(2, "2", 2)), False),
    (out(1, ".", [23]), False),
    (out(1, "", [EOS], "stop", rec(1, "1", 4)), False),
    (out(0, " so", [13]), False),
    (out(0, " done", [14], "length"), True),
]
DOCUMENT = "Plan</Goal>\nP1: a c.\nP2: b.<C> so done"
TOKENS = [10, 11, 20, 21, 22, 23, 30, 31, 12, 13, 14]


def test_a_whole_completion_is_the_flat_document_with_its_tree() -> None:
    finals = {}
    for o, _ in EVENTS:
        if o.index not in finals:
            finals[o.index] = out(o.index, "", [])
        f = finals[o.index]
        f.text += o.text
        f.token_ids = [*f.token_ids, *o.token_ids]
        f.logprobs = [*f.logprobs, *o.logprobs]
        f.finish_reason, f.stop_reason = o.finish_reason, o.stop_reason
    merged = Assembly(SPEC, streaming=False).whole(list(finals.values()))
    assert merged.index == 0 and merged.text == DOCUMENT and merged.token_ids == TOKENS
    assert len(merged.logprobs) == len(TOKENS) and merged.finish_reason == "length"
    assert merged.cumulative_logprob == pytest.approx(-0.5 * len(TOKENS))
    tree = merged.hogwild
    assert tree["forked"] and tree["fork_tokens"] == 2 and tree["trunk_tokens"] == 5
    assert [(r["branch"], r["text"], r["num_tokens"]) for r in tree["branches"]] == [
        ("1", "\nP1: a c.", 4), ("2", "\nP2: b.", 2)]
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
    events += [(out(i, "", [EOS], "stop", {"lane": i, "branch": None, "keep": 0}), i == 3) for i in (1, 2, 3)]
    deltas = [d for o, finished in events if (d := assembly.stream(o, finished)) is not None]
    assert "".join(d.text for d in deltas) == "Just text" and [t for d in deltas for t in d.token_ids] == [10, 11]
    assert deltas[-1].finish_reason == "length" and all(d.finish_reason is None for d in deltas[:-1])
