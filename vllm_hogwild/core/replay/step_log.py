"""A group's engine steps, kept compactly, and exact replay of a preempted group from them. Pure, no vLLM import.

**The step log.** What each engine step of a group was, as the views need it:
which workers decoded and every lane's length (what co-workers read: accepted
tokens only). Steps are kept as runs: in a run, the same workers decode and
each of their lanes grows by one token per step, so a group decoding in
lock-step costs one counter per step, whatever its length. A speculative step
(lanes grow by their accepted tokens) is a run of one step. Paragraph joins
are kept apart, as events.

**Replay.** A preempted group frees every block. On resumption every lane
re-feeds its tokens as chunked-prefill rows, each token with the view it was
produced under:

- lane ``w`` fed, at a step where it decoded, its last sampled token (position
  ``lane_len - 1``) and its drafts; a position's view is the one of the *last*
  step that fed it (a rejected draft is fed again later);
- that view: every co-worker at the step's lane length, the shared history as
  it stood after the step's joins, each lane's paragraph start then, and its own
  lane up to the position itself (causal within the row). A fork/join
  request's forks need no record: a view reads only text before its reader's
  position, and a fork before that position had joined, with the branch
  lengths it keeps, by the time the reader got there
  (:func:`~vllm_hogwild.core.views.forks.fork_view` of the forks now gives the
  view of then);
- prompt positions are plain prefill: the lane from position 0.

The lanes re-feed in lock-step by past steps: in one engine step every lane
re-feeds the positions of the same past steps (:meth:`Replay.chunk_ends`), so
every co-worker token a re-fed query reads is written by the end of that
engine step, as it was originally. When vLLM's token budget cuts a lane's
chunk short, the other lanes' tokens of later steps are rolled back
(:meth:`Replay.valid`), as vLLM rolls back rejected drafts. The resumed
group's K/V then equal the original's to rounding, and it goes on as if it had
never been preempted.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field
from typing import Sequence

from vllm_hogwild.core.wire import GroupReplay, ReplayStep

PROMPT = -1  # the "step" of prompt positions: plain prefill


@dataclass
class Run:
    """Consecutive steps in which the same workers decode, each lane one token more per step."""

    first: int  # the group's index of its first step
    decoding: tuple[int, ...]
    lens: tuple[int, ...]  # every lane's length at the first step (after that step's writes)
    length: int = 1  # steps in the run
    exact: bool = False  # one speculative step: lanes grew by their accepted tokens; never extended

    def lens_at(self, step: int) -> tuple[int, ...]:
        k = step - self.first
        return tuple(n + k for n in self.lens) if len(self.decoding) == len(self.lens) else tuple(
            n + (k if w in self.decoding else 0) for w, n in enumerate(self.lens))


@dataclass
class StepLog:
    """Every engine step of one group (see the module's docstring)."""

    num_lanes: int
    prompt_len: int
    runs: list[Run] = field(default_factory=list)
    joins: list[tuple[int, int, tuple[int, ...]]] = field(default_factory=list)  # (step, history spans, starts)
    num_steps: int = 0

    def record(self, lens: Sequence[int], decoding: Sequence[int], exact: bool = False) -> None:
        """One step: the lanes' lengths after its writes, its decoding workers (``exact``: a speculative step)."""
        last = self.runs[-1] if self.runs else None
        if (not exact and last is not None and not last.exact and tuple(decoding) == last.decoding
                and tuple(lens) == last.lens_at(self.num_steps)):
            last.length += 1
        else:
            self.runs.append(Run(self.num_steps, tuple(decoding), tuple(lens), exact=exact))
        self.num_steps += 1

    def advance(self) -> list[int]:
        """One more step of the last run: the same workers decoded, each one token more (lock-step). Returns
        every lane's length after the step, from the run alone (a group in lock-step needs nothing else)."""
        run = self.runs[-1]
        k = run.length
        run.length += 1
        self.num_steps += 1
        if len(run.decoding) == len(run.lens):
            return [n + k for n in run.lens]
        return [n + k if w in run.decoding else n for w, n in enumerate(run.lens)]

    def join(self, num_history: int, paragraph_starts: Sequence[int]) -> None:
        """Paragraphs joined the history at the step just recorded; ``num_history`` spans in it now."""
        self.joins.append((self.num_steps - 1, num_history, tuple(paragraph_starts)))


@dataclass
class Replay:
    """One preempted group's way back: its log and each lane's length when it was preempted."""

    log: StepLog
    targets: list[int]  # tokens of each lane whose K/V existed at the preemption: what is re-fed
    _fed: list[list[tuple[int, int, int]]] = field(default_factory=list)  # per lane: (first position, step, steps)

    def __post_init__(self) -> None:
        # The log does not change while the group replays: index it once.
        self._fed = [[] for _ in self.targets]
        for run in self.log.runs:
            for w in run.decoding:
                self._fed[w].append((run.lens[w] - 1, run.first, run.length))
        self._starts = [[f[0] for f in fed] for fed in self._fed]
        self._lasts = [[first + length - 1 for _, first, length in fed] for fed in self._fed]
        self._run_firsts = [r.first for r in self.log.runs]
        self._join_steps = [j[0] for j in self.log.joins]

    @property
    def prompt_len(self) -> int:
        return self.log.prompt_len

    @property
    def num_steps(self) -> int:
        return self.log.num_steps

    def step_of(self, lane: int, position: int) -> int:
        """The step whose view ``position`` of ``lane`` was produced under (:data:`PROMPT` for the prompt)."""
        i = bisect_right(self._starts[lane], position) - 1
        if i < 0 or position < self.prompt_len:
            return PROMPT
        start, first, length = self._fed[lane][i]
        return first + min(position - start, length - 1)  # past a run's last position: that step's accepted drafts

    def end_of(self, lane: int, step: int) -> int:
        """First position of ``lane`` fed at ``step`` or later (its target when none)."""
        if step <= 0:
            return min(self.prompt_len, self.targets[lane])
        i = bisect_left(self._lasts[lane], step)  # the first run of the lane that reaches ``step``
        if i == len(self._lasts[lane]):
            return self.targets[lane]
        start, first, _ = self._fed[lane][i]
        return start + max(0, step - first)

    def view_step(self, step: int) -> ReplayStep:
        """Step ``step`` as the worker processes need it to rebuild its views."""
        run = self.log.runs[bisect_right(self._run_firsts, step) - 1]
        i = bisect_right(self._join_steps, step) - 1
        log = self.log
        num_history, starts = (0, (log.prompt_len,) * log.num_lanes) if i < 0 else log.joins[i][1:]
        return ReplayStep(run.lens_at(step), num_history, starts)

    def done(self, computed: Sequence[int]) -> bool:
        return all(c >= k for c, k in zip(computed, self.targets))

    def _frontier(self, computed: Sequence[int]) -> int:
        """The last past step every lane has written all of (-2: some lane is still in its prompt)."""
        pending = [self.step_of(w, c) for w, c in enumerate(computed) if c < self.targets[w]]
        return min(pending) - 1 if pending else self.num_steps

    def chunk_ends(self, computed: Sequence[int], budget: int, max_chunk: int = 0) -> list[int]:
        """Where each lane's re-feeding stops this engine step: through the same past steps for every lane.

        ``computed``: each lane's tokens written so far; ``budget``: tokens the group may take this
        step (one more past step is always taken); ``max_chunk``: the most tokens one lane may take
        (0: no limit).
        """
        first = self._frontier(computed) + 1  # the oldest step some lane still has to write
        if first >= self.num_steps:
            return [max(c, k) for c, k in zip(computed, self.targets)]

        def ends(step: int) -> list[int]:
            return [max(c, self.end_of(w, step)) for w, c in enumerate(computed)]

        def fits(step: int) -> bool:
            e = ends(step)
            return (sum(e) - sum(computed) <= budget
                    and (not max_chunk or all(b - c <= max_chunk for b, c in zip(e, computed))))

        lo, hi = max(first + 1, 1), self.num_steps  # at least one step beyond the frontier
        if not fits(lo):
            return ends(lo)
        while lo < hi:  # the furthest step whose tokens fit
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
        return ends(lo)

    def valid(self, computed: Sequence[int]) -> list[int]:
        """Each lane's written tokens whose view was whole: a token of a step that some co-worker has not
        written through is rolled back (re-fed next engine step). Prompt tokens always stand."""
        frontier = self._frontier(computed)
        if frontier >= self.num_steps:
            return list(computed)
        return [c if c <= self.prompt_len else min(c, max(self.prompt_len, self.end_of(w, frontier + 1)))
                for w, c in enumerate(computed)]

    def wire(self, group_id: str, lanes: Sequence[tuple[int, int, int]], valid: Sequence[int] | None = None
             ) -> GroupReplay:
        """What the worker processes need to rebuild the views of the positions ``lanes`` re-feed now:
        ``(lane, start, end)`` each. Positions from ``valid[lane]`` on will be rolled back (:meth:`valid`):
        they read their own lane only, as prompt positions do (their output is thrown away)."""
        runs_by_lane, steps = [], set()
        for lane, start, end in lanes:
            runs, p = [], start
            kept = end if valid is None else min(end, max(valid[lane], start))
            while p < end:
                t = PROMPT if p >= kept else self.step_of(lane, p)
                stop = end if p >= kept else min(kept, self.prompt_len if t == PROMPT else self.end_of(lane, t + 1))
                if t != PROMPT:
                    steps.add(t)
                runs.append((p, stop, t))
                p = stop
            runs_by_lane.append((lane, runs))
        order = sorted(steps)
        index = {t: i for i, t in enumerate(order)}
        return GroupReplay(group_id, tuple(self.view_step(t) for t in order), tuple(
            (lane, tuple((a, b, PROMPT if t == PROMPT else index[t]) for a, b, t in runs))
            for lane, runs in runs_by_lane))
