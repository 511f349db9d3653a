"""Protocol driving for one group: the tokens the engine forces into lanes, and when the group stops. Pure.

The scheduler shows the driver every sampled token's text (:meth:`ProtocolDriver.observe`,
incrementally detokenized) and asks it, for each worker that samples in a step,
which token to force (:meth:`ProtocolDriver.forced`). What it drives:

- **paragraph prefixes** (``named``, ``collab``): every paragraph of a worker starts with
  ``**Alice [k]:** ``, queued as token ids when the previous paragraph ends (and for
  paragraph 1 at the start), forced one token per step; every ``redundancy_every``
  tokens of the group, a worker's next prefix carries the redundancy check;
- **answers** (``answer_pattern``): once any worker's text matches, every live
  worker samples its end of sequence next (:meth:`ProtocolDriver.stop`);
- **the finisher** (``collab``): the last ``len(suffix) + finisher`` tokens of
  the lowest live worker's budget go to the task's "time is up" suffix and then
  greedy tokens (:data:`~vllm_hogwild.core.wire.ARGMAX`), and every other live
  worker ends, so the finisher reads the whole shared transcript. The finisher
  starts when the worker's budget, after the paragraph prefix it is forcing, has no
  more than that room left; when the prefix and the suffix do not both fit, the
  prefix gives way (its forced part stays).

Text the engine forced never ends a paragraph. No vLLM import: token ids come from an
``encode`` callable, end-of-sequence ids from the caller.
"""

from __future__ import annotations

from collections import deque
from typing import Callable, Sequence

from vllm_hogwild.core.options import NAMED_PROTOCOLS, RequestOptions
from vllm_hogwild.core.patterns import WindowMatcher
from vllm_hogwild.core.protocol_text import FINISHER_SUFFIX, RedundancyChecks, answer_regex, paragraph_prefix
from vllm_hogwild.core.protocol.paragraphs import ParagraphTracker
from vllm_hogwild.core.wire import ARGMAX


class ForcedTokens:
    """Each lane's queue of token ids the engine forces, one per sampled token; what was forced, by index."""

    def __init__(self, num_workers: int) -> None:
        self.queues = [deque() for _ in range(num_workers)]  # tokens still to force, per lane
        self.forced_at = [set() for _ in range(num_workers)]  # output indices forced, per lane

    def forced(self, worker: int, num_output_tokens: int) -> int | None:
        """The token ``worker`` must sample as its output token ``num_output_tokens`` (None: its own choice)."""
        queue = self.queues[worker]
        if not queue:
            return None
        self.forced_at[worker].add(num_output_tokens)
        return queue.popleft()

    def take(self, worker: int, num_output_tokens: int, limit: int) -> list[int]:
        """Up to ``limit`` queued tokens of ``worker`` at once, from its output token ``num_output_tokens`` on:
        the engine feeds them in one step (they are forced, never sampled). :meth:`give_back` undoes it."""
        queue = self.queues[worker]
        tokens = [queue.popleft() for _ in range(min(limit, len(queue)))]
        self.forced_at[worker].update(range(num_output_tokens, num_output_tokens + len(tokens)))
        return tokens

    def give_back(self, worker: int, tokens: Sequence[int], num_output_tokens: int) -> None:
        """Taken tokens the engine did not feed (``num_output_tokens``: the first one's index) go back to the
        front of the queue, in order."""
        self.queues[worker].extendleft(reversed(tokens))
        self.forced_at[worker].difference_update(range(num_output_tokens, num_output_tokens + len(tokens)))

    def force_only(self, worker: int, token: int | None) -> None:
        """``worker`` forces ``token`` next and nothing else (``None``: nothing at all)."""
        self.queues[worker].clear()
        if token is not None:
            self.queues[worker].append(token)


class ProtocolDriver(ForcedTokens):
    reads_hidden = False  # the text of tokens the client's text leaves out (special tokens): not read

    def __init__(self, options: RequestOptions, num_workers: int, max_tokens: int, prompt_len: int,
                 tracker: ParagraphTracker | None, encode: Callable[[str], list[int]]) -> None:
        self.options = options
        self.num_workers = num_workers
        self.max_tokens = max_tokens
        self.prompt_len = prompt_len
        self.tracker = tracker  # paragraph ends (the layouts with a shared history), shared with the views
        self.encode = encode
        self.named = options.protocol in NAMED_PROTOCOLS
        super().__init__(num_workers)
        self.num_observed = [0] * num_workers  # output tokens of each lane seen so far
        self.paragraph_numbers = [1] * num_workers  # the paragraph each worker writes
        self.checked_at = [0] * num_workers  # group tokens at each worker's last redundancy check
        self.answers = (
            [WindowMatcher(answer_regex(options.answer_pattern)) for _ in range(num_workers)]
            if options.answer_pattern is not None else None
        )
        self.answered = False
        self.finisher: int | None = None  # the worker the finisher runs on, once started
        self.suffix = encode(FINISHER_SUFFIX[options.task]) if options.finisher else []
        # Whether the scheduler must detokenize this group's tokens (paragraphs or answers).
        self.observes_text = tracker is not None or self.answers is not None
        # Whether the engine may ever force a token in this group (prefixes, the finisher, stops).
        self.forces_tokens = self.named or self.answers is not None or self.reserve > 0
        if self.named:
            for w in range(num_workers):
                self.queues[w].extend(encode(paragraph_prefix(w, 1, num_workers)))

    @property
    def reserve(self) -> int:
        """Tokens at the end of the finisher's budget that are its (0: no finisher)."""
        if not self.options.finisher or self.max_tokens <= 2 * (len(self.suffix) + self.options.finisher):
            return 0
        return len(self.suffix) + self.options.finisher

    def observe(self, worker: int, index: int, text: str, hidden: str = "") -> None:
        """Output token ``index`` of ``worker`` was sampled; ``text`` is what it adds to the worker's text (the
        Hogwild protocols read the client's text: ``hidden``, a token's text the client does not see, is not)."""
        ended = self.tracker is not None and self.tracker.on_sampled(
            worker, self.prompt_len + index, text, can_end=index not in self.forced_at[worker])
        self.num_observed[worker] = index + 1
        if ended and self.named and self.finisher is None:
            self._queue_next_prefix(worker, index)
        if self.answers is not None and self.answers[worker].feed(text):
            self.answered = True

    def _queue_next_prefix(self, worker: int, index: int) -> None:
        # The group's tokens seen so far: the others' as last observed, this worker's up to ``index``.
        seen = sum(self.num_observed)
        number = self.paragraph_numbers[worker] + 1
        check = RedundancyChecks(self.options.redundancy_every).due(self.checked_at[worker], seen)
        prefix = self.encode(paragraph_prefix(worker, number, self.num_workers, check))
        self.paragraph_numbers[worker] = number
        if check:
            self.checked_at[worker] = seen
        self.queues[worker].extend(prefix)

    def may_force(self, worker: int, num_output_tokens: int) -> bool:
        """Whether the engine may force ``worker``'s next token: something is queued, the group stops,
        or the finisher's room is reached (speculative decoding: such a worker must not run on drafts)."""
        if self.queues[worker] or self.answered or self.finisher is not None:
            return True
        return bool(self.reserve) and self.max_tokens - num_output_tokens <= self.reserve

    def maybe_start_finisher(self, num_outputs: Sequence[int | None]) -> int | None:
        """Start the finisher when the lowest live worker reaches its reserve; returns that worker.

        ``num_outputs[w]``: output tokens of worker ``w`` so far (``None``: it has stopped).
        """
        if not self.reserve or self.finisher is not None or self.answered:
            return None
        live = [w for w, n in enumerate(num_outputs) if n is not None]
        if not live:
            return None
        queue = self.queues[live[0]]
        room = self.max_tokens - num_outputs[live[0]] - len(queue)  # after a paragraph prefix being forced
        if room > self.reserve:
            return None
        self.finisher = live[0]
        if room <= len(self.suffix):
            queue.clear()  # no room for the prefix and the suffix: the prefix gives way
        queue.extend([*self.suffix, *[ARGMAX] * self.options.finisher])
        return self.finisher

    def stop(self, live: Sequence[int], eos_ids: Sequence[int | None], keep: int | None = None) -> None:
        """Every live worker in ``live`` but ``keep`` samples its end of sequence next."""
        for w in live:
            eos = eos_ids[w]
            if w != keep and eos is not None and list(self.queues[w]) != [eos]:
                self.force_only(w, eos)


class ForkJoinDriver(ForcedTokens):
    """Protocol driving for a fork/join request (``multiverse``, ``npr``): the same interface as
    :class:`ProtocolDriver`, over :class:`~vllm_hogwild.core.forkjoin.families.ForkJoinLanes`.

    It forces each branch's header and each forking sequence's join header (as token ids, one per step),
    and ends every lane ≥ 1 that is done (a branch that wrote its end, a lane no fork took) with its end
    of sequence. No answers, no finisher.
    """

    observes_text = True
    forces_tokens = True
    reads_hidden = True  # a model's fork/join tags may be special tokens the client's text leaves out
    tracker = None
    answered = False
    finisher = None
    reserve = 0

    def __init__(self, options: RequestOptions, num_workers: int, max_tokens: int, prompt_len: int,
                 encode: Callable[[str], list[int]], fork_now: Sequence[str] | None = None,
                 open_goal: str = "", max_positions: int | None = None) -> None:
        from vllm_hogwild.core.forkjoin.families import FAMILIES, ForkJoinLanes

        self.options = options
        self.num_workers = num_workers
        self.prompt_len = prompt_len
        self.encode = encode
        self.lanes = ForkJoinLanes(FAMILIES[options.protocol], num_workers, prompt_len, max_tokens,
                                   hogwild=options.branches == "hogwild", branch_end=options.branch_end,
                                   trunk_text=open_goal, max_positions=max_positions)
        super().__init__(num_workers)
        self.num_observed = [0] * num_workers
        if fork_now:
            self._force(self.lanes.fork_now(fork_now))

    def _force(self, texts: dict[int, str]) -> None:
        for lane, text in texts.items():
            self.queues[lane].extend(self.encode(text))

    def observe(self, worker: int, index: int, text: str, hidden: str = "") -> None:
        self.num_observed[worker] = index + 1
        self._force(self.lanes.observe(worker, text, self.prompt_len + index + 1, hidden))

    def end_lanes(self, eos_ids: Sequence[int | None]) -> None:
        """Lanes the protocol is done with sample their end of sequence next."""
        for lane in self.lanes.lanes_to_stop():
            self.force_only(lane, eos_ids[lane])

    def may_force(self, worker: int, num_output_tokens: int) -> bool:
        """Text queued for the lane, or its end of sequence to come (forced after the step's outputs)."""
        return bool(self.queues[worker]) or self.lanes.ends_next(worker, num_output_tokens)

    def maybe_start_finisher(self, num_outputs: Sequence[int | None]) -> int | None:
        return None

    def stop(self, live: Sequence[int], eos_ids: Sequence[int | None], keep: int | None = None) -> None:
        return None
