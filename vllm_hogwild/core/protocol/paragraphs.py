"""Paragraphs of a collaborating group: where each worker's paragraph ends, and when it joins the shared history.

Pure bookkeeping, no torch and no vLLM. Patterns are RE2's, matched over a
bounded window of each lane's recent text (:mod:`vllm_hogwild.core.patterns`). Used
by the ``combined`` and ``interleaved`` layouts (:func:`vllm_hogwild.core.views.spans.combined_views`,
:func:`vllm_hogwild.core.views.spans.interleaved_views`). Users and the paper call these
"steps" (the option ``step_end``); in the code a step is always an engine step.

- A worker's text is cut into *paragraphs*. A paragraph ends with the token that
  completes a blank line following a finished sentence (the default
  :data:`PARAGRAPH_END`; any regular expression can be configured, ``step_end``). A
  token that completes the blank line and carries more text after it still ends the
  paragraph: paragraphs end on token boundaries.
- A finished paragraph *joins the history* (for every worker, the writer included)
  once the token that ended it has been fed, i.e. in the first engine step that
  feeds a token of the writer's next paragraph: the reader's own text is always the
  last span of its view, and the token being fed is a query. Paragraphs that join in
  the same engine step join in worker order. Joining changes views only; no K/V
  moves.
- A worker that stops: its finished paragraph, then its unfinished rest, join the
  history once its last fed token is written.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from vllm_hogwild.core.patterns import LOOKBACK_CHARS, compile_pattern
from vllm_hogwild.core.views.spans import Span

# A sentence end (optionally closed by quotes, brackets or markdown emphasis),
# then a blank line.
PARAGRAPH_END = "[.!?][\"'\u201d\u2019)\\]*_]*[ \t]*\n[ \t]*\n"  # RE2 syntax; the quotes are the characters


@dataclass
class _LaneParagraphs:
    paragraph_start: int  # stored position where the oldest paragraph not in the history starts
    text: str = ""  # text sampled since the last paragraph end: at most its last LOOKBACK_CHARS characters
    cut: bool = False  # text lost its beginning: its first character is context only
    ends: list[int] = field(default_factory=list)  # stored ends of finished paragraphs not joined yet
    stopped_at: int | None = None  # lane length when the worker stopped
    flushed: bool = False  # its rest joined the history after it stopped


@dataclass
class ParagraphTracker:
    """Paragraphs of ``num_workers`` lanes that all start after ``prompt_len`` prompt tokens.

    Feed every sampled token with :meth:`on_sampled` (its stored position in
    the lane and its text), call :meth:`join` once per engine step of the group with the
    lanes' lengths (tokens whose K/V is written once this step's writes land)
    before building views, and :meth:`stop` when a worker stops.
    """

    num_workers: int
    prompt_len: int
    paragraph_end: str = PARAGRAPH_END  # the option step_end
    history: list[Span] = field(default_factory=list)  # finished paragraphs, in the order they joined
    _lanes: list[_LaneParagraphs] = field(default_factory=list)
    _pattern: Any = None
    _num_pending: int = 0  # lanes with a paragraph end (or a stop) not joined yet

    def __post_init__(self) -> None:
        self._pattern = compile_pattern("step_end", self.paragraph_end)
        self._lanes = [_LaneParagraphs(self.prompt_len) for _ in range(self.num_workers)]

    @property
    def pending(self) -> bool:
        """Whether a :meth:`join` may move something (O(1): a step without it needs no join)."""
        return self._num_pending > 0

    @property
    def paragraph_starts(self) -> list[int]:
        """Where each worker's unfinished part (what is not in the history) starts."""
        return [lane.paragraph_start for lane in self._lanes]

    def on_sampled(self, worker: int, position: int, text: str, can_end: bool = True) -> bool:
        """Record the token sampled for ``worker`` at stored ``position``; True if it ends a paragraph.

        ``can_end=False`` for text the engine forced (a paragraph prefix): it is
        part of the paragraph but never ends one.
        """
        lane = self._lanes[worker]
        if lane.stopped_at is not None:
            raise ValueError(f"worker {worker} has stopped")
        # The text since the last paragraph end, cut to a bounded window (plus one character of
        # context): the work per token is bounded by the new text plus the window, however
        # long a paragraph runs.
        if len(lane.text) > LOOKBACK_CHARS + 1:
            lane.text, lane.cut = lane.text[-(LOOKBACK_CHARS + 1):], True
        before = len(lane.text)
        lane.text += text
        if not can_end:
            return False
        # Only a match that this token completes counts (earlier text was checked already).
        for match in self._pattern.finditer(lane.text, 1 if lane.cut else 0):
            if match.end() > before:
                if not lane.ends:
                    self._num_pending += 1
                lane.ends.append(position + 1)
                lane.text, lane.cut = "", False
                return True
        return False

    def join(self, lane_lens: Sequence[int]) -> list[Span]:
        """Move finished paragraphs into the history; return the spans that joined now, in order."""
        joined = []
        for w, (lane, n) in enumerate(zip(self._lanes, lane_lens)):
            waiting = bool(lane.ends) or lane.stopped_at is not None and not lane.flushed
            if lane.stopped_at is not None:
                if n < lane.stopped_at or lane.flushed:
                    continue  # its last fed token is not written yet, or its rest has joined
                ends = [e for e in lane.ends if e < lane.stopped_at] + [lane.stopped_at]
                lane.ends, lane.flushed = [], True
            else:
                ends = [e for e in lane.ends if n > e]
                lane.ends = lane.ends[len(ends):]
            if waiting and not lane.ends and (lane.stopped_at is None or lane.flushed):
                self._num_pending -= 1
            for end in ends:
                if end > lane.paragraph_start:
                    joined.append(Span(w, lane.paragraph_start, end))
                    lane.paragraph_start = end
        self.history += joined
        return joined

    def stop(self, worker: int, lane_len: int) -> None:
        """``worker`` generates no more; its lane holds ``lane_len`` tokens (its last sampled one is never fed)."""
        lane = self._lanes[worker]
        if not lane.ends:
            self._num_pending += 1  # its rest joins once written
        lane.stopped_at = lane_len
