"""Step detection and promotion into the shared history (pure), and the ``interleaved`` layout."""

from __future__ import annotations

import itertools
import re

import pytest

from vllm_hogwild.core.protocol.paragraphs import PARAGRAPH_END, ParagraphTracker
from vllm_hogwild.core.views.spans import Span, build_views, combined_views, interleaved_views

P = 5  # prompt length


def ends_by_definition(pieces: list[str]) -> list[int]:
    """Independent restatement: token i ends a step iff the text since the last end, up to and
    including token i, holds a sentence end + blank line that token i completes."""
    out, since = [], ""
    for i, piece in enumerate(pieces):
        before = since
        since += piece
        completed = [m for m in re.finditer(PARAGRAPH_END, since) if m.end() > len(before)]
        if completed:
            out.append(i)
            since = ""
    return out


ALPHABET = ["Hi", ".", "\n", "\n\n", ".\n\n", " ", "!", "?\n", "a\n\nb", ")"]


@pytest.mark.parametrize("length", [1, 2, 3, 4])
def test_step_ends_match_the_definition_exhaustively(length: int) -> None:
    for pieces in itertools.product(ALPHABET, repeat=length):
        tracker = ParagraphTracker(1, P)
        got = [i for i, piece in enumerate(pieces) if tracker.on_sampled(0, P + i, piece)]
        assert got == ends_by_definition(list(pieces)), pieces


@pytest.mark.parametrize("text,ends", [
    ("Done.\n\n", True), ("Done!\n \n", True), ('He said "yes."\n\n', True), ("**Case 1.**\n\n", True),
    ("x = 1\n\n", False), ("Done.\n", False), ("Done. \n\nNext", True), ("1.5\n\n", False),
])
def test_a_step_ends_at_a_blank_line_after_a_finished_sentence(text: str, ends: bool) -> None:
    tracker = ParagraphTracker(1, P)
    got = [tracker.on_sampled(0, P + i, ch) for i, ch in enumerate(text)]
    assert any(got) == ends
    if ends:  # at the character (token) that completes the blank line
        assert got.index(True) == text.index("\n", text.index("\n") + 1)


def test_steps_join_after_their_last_token_is_fed_and_in_worker_order() -> None:
    t = ParagraphTracker(3, P)
    # Group step 1: every worker samples its first token (position P).
    assert not t.on_sampled(0, P, "A")
    assert t.on_sampled(1, P, "B.\n\n")  # worker 1's step is one token: [P, P+1)
    assert not t.on_sampled(2, P, "C")
    assert t.join([P + 1] * 3) == []  # those tokens are fed now: worker 1's ending token is a query
    assert t.on_sampled(0, P + 1, ".\n\n")  # worker 0's step ends at P+2
    assert t.on_sampled(1, P + 1, "Again.\n\n")  # worker 1 ends another step at P+2
    assert not t.on_sampled(2, P + 1, "c")
    assert t.join([P + 2] * 3) == [Span(1, P, P + 1)]
    assert t.paragraph_starts == [P, P + 1, P]
    # Both end in the same group step: they join together, in worker order.
    assert t.join([P + 3] * 3) == [Span(0, P, P + 2), Span(1, P + 1, P + 2)]
    assert t.history == [Span(1, P, P + 1), Span(0, P, P + 2), Span(1, P + 1, P + 2)]
    assert t.paragraph_starts == [P + 2, P + 2, P]
    assert t.join([P + 3] * 3) == []  # nothing new


def test_a_stopped_worker_joins_its_finished_step_then_its_rest() -> None:
    t = ParagraphTracker(2, P)
    t.on_sampled(0, P, "One.\n\n")
    t.on_sampled(0, P + 1, "Two")
    t.on_sampled(0, P + 2, "<eos>")  # its last sampled token is never fed
    t.stop(0, P + 2)
    assert t.join([P + 1, P + 1]) == []  # position P+1 not written yet
    assert t.join([P + 2, P + 2]) == [Span(0, P, P + 1), Span(0, P + 1, P + 2)]
    assert t.paragraph_starts[0] == P + 2
    with pytest.raises(ValueError):
        t.on_sampled(0, P + 3, "x")


def test_a_stop_right_after_a_step_end_joins_one_span() -> None:
    t = ParagraphTracker(1, P)
    t.on_sampled(0, P, "Done.\n\n")
    t.on_sampled(0, P + 1, "<eos>")
    t.stop(0, P + 1)
    assert t.join([P + 1]) == [Span(0, P, P + 1)]


def test_interleaved_views_read_the_history_and_the_own_step_only() -> None:
    lanes = [P + 4, P + 3, P + 2]
    history = [Span(1, P, P + 2), Span(0, P, P + 1)]
    starts = [P + 1, P + 2, P]
    views = interleaved_views(P, lanes, history, starts)
    assert views == build_views("interleaved", P, lanes, history=history, paragraph_starts=starts)
    # Worker 0's own finished step is followed by its own unfinished one: one span (same tokens, same order).
    assert views[0].spans == (Span(0, 0, P), Span(1, P, P + 2), Span(0, P, P + 4))
    assert views[2].spans == (Span(2, 0, P), Span(1, P, P + 2), Span(0, P, P + 1), Span(2, P, P + 2))
    # combined = interleaved + the others' unfinished steps (no separators configured here).
    case = ([P + 2, P + 2], [Span(0, P, P + 1), Span(1, P, P + 1)], [P + 1, P + 1])
    inter, comb = interleaved_views(P, *case)[0].tokens(), combined_views(P, *case)[0].tokens()
    assert comb == inter[:-1] + [(1, P + 1)] + inter[-1:]
    # Empty history: exactly the own lane, i.e. plain attention.
    assert interleaved_views(P, [P + 3], [], [P])[0].spans == (Span(0, 0, P + 3),)


def test_forced_text_never_ends_a_paragraph_but_belongs_to_it() -> None:
    t = ParagraphTracker(1, P)
    assert not t.on_sampled(0, P, "Done.\n\n", can_end=False)  # engine-forced text
    assert not t.on_sampled(0, P + 1, "x")
    assert t.on_sampled(0, P + 2, "Fine.\n\n")
    t.on_sampled(0, P + 3, "y")
    assert t.join([P + 4]) == [Span(0, P, P + 3)]
