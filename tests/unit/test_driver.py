"""Protocol driving for one group (pure): forced prefixes, redundancy checks, answers, the finisher.

The runs go through the group table, in the order the scheduler calls it.
"""

from __future__ import annotations

from tests.unit.table_engine import FakeEngine, encode
from vllm_hogwild.core.protocol.driver import ProtocolDriver
from vllm_hogwild.core.options import HISTORY_LAYOUTS, parse_request
from vllm_hogwild.core.protocol.paragraphs import PARAGRAPH_END, ParagraphTracker
from vllm_hogwild.core.protocol_text import FINISHER_SUFFIX, REDUNDANCY_CHECK, paragraph_prefix

P = 10


def driver(n: int, max_tokens: int, **options) -> ProtocolDriver:
    opts = parse_request({f"hogwild_{k}": v for k, v in options.items()})
    tracker = ParagraphTracker(n, P, opts.step_end or PARAGRAPH_END) if opts.layout in HISTORY_LAYOUTS else None
    return ProtocolDriver(opts, n, max_tokens, P, tracker, encode)


def run(n: int, max_tokens: int, samples: list[str], steps: int, **options) -> tuple[ProtocolDriver, list[str]]:
    """A group decoding in lock-step through the group table (tests/unit/table_engine.py stands in for vLLM):
    each step every live worker samples its next character, or the token the engine forces."""
    engine = FakeEngine(prompt_len=P)
    requests = engine.add_group("g", n, max_tokens, **options)
    driver = engine.table.groups["g"].driver
    texts = engine.run({r.request_id: s for r, s in zip(requests, samples)}, steps)
    return driver, [texts[r.request_id] for r in requests]


def test_every_paragraph_starts_with_its_writers_prefix_and_forced_text_never_ends_one() -> None:
    d, texts = run(2, 400, ["ab!", "xyzw!"], 200, layout="combined", protocol="named",
                   step_end="[!:]")  # ":" occurs in every prefix
    import re

    for w, name in enumerate(("Alice", "Bob")):
        numbers = [int(k) for k in re.findall(rf"\*\*{name} \[(\d+)\]:\*\* ", texts[w])]
        assert numbers == list(range(1, len(numbers) + 1)) and len(numbers) >= 5, texts[w]
        assert texts[w].startswith(paragraph_prefix(w, 1, 2)), texts[w]
    for w in range(2):  # paragraphs ended on the sampled '!' only, never on a prefix's ':'
        ends = [span.end for span in d.tracker.history if span.lane == w]
        assert len(ends) >= 5 and all(texts[w][e - P - 1] == "!" for e in ends)


def test_redundancy_checks_ride_on_a_prefix_every_k_group_tokens() -> None:
    d, texts = run(2, 600, ["abcdefg!", "hijk!"], 500, layout="combined", protocol="named", step_end="!",
                   redundancy_every=100)
    checks = sum(t.count(REDUNDANCY_CHECK) for t in texts)
    assert 3 <= checks <= sum(len(t) for t in texts) // 100 + 2, checks
    assert not any(t.startswith(paragraph_prefix(w, 1, 2, check=True)) for w, t in enumerate(texts))


def test_an_answer_ends_every_worker_one_token_later() -> None:
    d, texts = run(3, 100, ["xxxxxxxxxxxxxxxxxxxx", "yyyyyA7yyyyyy", "zzzzzzzzzzzzz"], 40, answer_pattern=r"A(\d)")
    assert d.answered
    assert [len(t) for t in texts] == [7, 7, 7]  # the match completes at token 6; everyone ends after token 7


def test_the_finisher_takes_the_last_tokens_of_the_budget() -> None:
    max_tokens, finisher = 120, 6
    d, texts = run(3, max_tokens, ["abcdefghijklmnopqrstuvwxyz!", "cde!", "fghi!"], max_tokens + 5,
                   protocol="collab", step_end="!", finisher=finisher)
    suffix = FINISHER_SUFFIX["math"]
    assert d.finisher == 0
    start = texts[0].index(suffix)
    assert texts[0][start + len(suffix):] == "$" * finisher and len(texts[0]) == max_tokens
    assert start == max_tokens - len(suffix) - finisher
    assert [len(t) for t in texts[1:]] == [start, start]  # the others ended when the finisher began


def test_a_prefix_being_forced_gives_way_to_the_finisher_when_both_do_not_fit() -> None:
    """Documented: the finisher starts once the room after the queued prefix is the reserve; a long prefix
    (the redundancy check) can make it start early, and the worker samples on after the finisher's tokens."""
    max_tokens, finisher = 120, 6
    d, texts = run(2, max_tokens, ["ab!", "cd!"], max_tokens + 5, protocol="collab", step_end="!",
                   redundancy_every=10, finisher=finisher)
    suffix = FINISHER_SUFFIX["math"]
    start = texts[0].index(suffix)
    assert d.finisher == 0 and texts[0][start + len(suffix):start + len(suffix) + finisher] == "$" * finisher
    assert start <= max_tokens - len(suffix) - finisher


def test_no_finisher_on_budgets_too_short_for_it() -> None:
    d = driver(2, 40, protocol="collab", finisher=16)
    assert d.reserve == 0 and d.maybe_start_finisher([30, 30]) is None


def test_may_place_when_queued_answered_or_at_the_finishers_room() -> None:
    """Speculative decoding runs on drafts only where the engine will not force the next token."""
    d = driver(2, 200, layout="combined", protocol="collab", finisher=4, redundancy_every=0)
    assert d.may_force(0, 0) and d.may_force(1, 0)  # step 1's prefix is queued
    d.queues[0].clear()
    assert not d.may_force(0, 10)
    assert d.may_force(0, 200 - d.reserve) and not d.may_force(0, 200 - d.reserve - 1)  # the finisher's room
    d.answered = True
    assert d.may_force(0, 10)
    plain = driver(2, 200)  # raw: nothing is ever forced
    assert not any(plain.may_force(w, n) for w in range(2) for n in (0, 150, 199))
