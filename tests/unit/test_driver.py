"""Protocol driving for one group (pure): placed prefixes, redundancy checks, answers, the finisher."""

from __future__ import annotations

from vllm_hogwild.core.driver import ProtocolDriver
from vllm_hogwild.core.options import parse_request
from vllm_hogwild.core.protocol import FINISHER_SUFFIX, REDUNDANCY_CHECK, step_prefix
from vllm_hogwild.core.steps import STEP_END, StepTracker
from vllm_hogwild.core.wire import ARGMAX

P = 10
EOS = 0


def encode(text: str) -> list[int]:
    return [ord(c) for c in text]


def decode(ids) -> str:
    return "".join(chr(i) for i in ids)


def driver(n: int, max_tokens: int, **options) -> ProtocolDriver:
    opts = parse_request({f"hogwild_{k}": v for k, v in options.items()})
    tracker = StepTracker(n, P, opts.step_end or STEP_END) if opts.layout in ("combined", "interleaved") else None
    return ProtocolDriver(opts, n, max_tokens, P, tracker, encode)


def run(d: ProtocolDriver, samples: list[list[str]], steps: int) -> list[str]:
    """Lock-step decode: each step every live worker places its forced token or samples its next character."""
    n = d.num_workers
    texts = [""] * n
    eos_ids = [EOS] * n
    stopped = [False] * n
    for k in range(steps):
        finisher = d.maybe_start_finisher([None if stopped[w] else len(texts[w]) for w in range(n)])
        if finisher is not None:
            d.stop([w for w in range(n) if not stopped[w]], eos_ids, keep=finisher)
        for w in range(n):
            if stopped[w] or len(texts[w]) >= d.max_tokens:
                continue
            forced = d.forced(w, len(texts[w]))
            token = samples[w][k % len(samples[w])] if forced is None else ("$" if forced == ARGMAX else chr(forced))
            if forced == EOS:
                stopped[w] = True
                continue
            d.observe(w, len(texts[w]), token)
            texts[w] += token
        if d.answered:
            d.stop([w for w in range(n) if not stopped[w]], eos_ids)
    return texts


def test_every_step_starts_with_its_writers_prefix_and_placed_text_never_ends_a_step() -> None:
    d = driver(2, 400, layout="combined", protocol="named", step_end="[!:]")  # ":" occurs in every prefix
    texts = run(d, [list("ab!"), list("xyzw!")], 200)
    import re

    for w, name in enumerate(("Alice", "Bob")):
        numbers = [int(k) for k in re.findall(rf"\*\*{name} \[(\d+)\]:\*\* ", texts[w])]
        assert numbers == list(range(1, len(numbers) + 1)) and len(numbers) >= 5, texts[w]
        assert texts[w].startswith(step_prefix(w, 1, 2)), texts[w]
    for w in range(2):  # steps ended on the sampled '!' only, never on a prefix's ':'
        ends = d.tracker._lanes[w].ends
        assert len(ends) >= 5 and all(texts[w][e - P - 1] == "!" for e in ends)


def test_redundancy_checks_ride_on_a_prefix_every_k_group_tokens() -> None:
    d = driver(2, 600, layout="combined", protocol="named", step_end="!", redundancy_every=100)
    texts = run(d, [list("abcdefg!"), list("hijk!")], 500)
    checks = sum(t.count(REDUNDANCY_CHECK) for t in texts)
    assert 3 <= checks <= sum(len(t) for t in texts) // 100 + 2, checks
    assert not any(t.startswith(step_prefix(w, 1, 2, check=True)) for w, t in enumerate(texts))


def test_an_answer_ends_every_worker_one_token_later() -> None:
    d = driver(3, 100, answer_pattern=r"A(\d)")
    texts = run(d, [list("xxxxxxxxxxxxxxxxxxxx"), list("yyyyyA7yyyyyy"), list("zzzzzzzzzzzzz")], 40)
    assert d.answered
    assert [len(t) for t in texts] == [7, 7, 7]  # the match completes at token 6; everyone ends after token 7


def test_the_finisher_takes_the_last_tokens_of_the_budget() -> None:
    max_tokens, finisher = 120, 6
    d = driver(3, max_tokens, protocol="collab", step_end="!", finisher=finisher)
    suffix = FINISHER_SUFFIX["math"]
    texts = run(d, [list("abcdefghijklmnopqrstuvwxyz!"), list("cde!"), list("fghi!")], max_tokens + 5)
    assert d.finisher == 0
    start = texts[0].index(suffix)
    assert texts[0][start + len(suffix):] == "$" * finisher and len(texts[0]) == max_tokens
    assert start == max_tokens - len(suffix) - finisher
    assert [len(t) for t in texts[1:]] == [start, start]  # the others ended when the finisher began


def test_a_prefix_being_placed_gives_way_to_the_finisher_when_both_do_not_fit() -> None:
    """Documented: the finisher starts once the room after the queued prefix is the reserve; a long prefix
    (the redundancy check) can make it start early, and the worker samples on after the finisher's tokens."""
    max_tokens, finisher = 120, 6
    d = driver(2, max_tokens, protocol="collab", step_end="!", redundancy_every=10, finisher=finisher)
    texts = run(d, [list("ab!"), list("cd!")], max_tokens + 5)
    suffix = FINISHER_SUFFIX["math"]
    start = texts[0].index(suffix)
    assert d.finisher == 0 and texts[0][start + len(suffix):start + len(suffix) + finisher] == "$" * finisher
    assert start <= max_tokens - len(suffix) - finisher


def test_no_finisher_on_budgets_too_short_for_it() -> None:
    d = driver(2, 40, protocol="collab", finisher=16)
    assert d.reserve == 0 and d.maybe_start_finisher([30, 30]) is None


def test_may_place_when_queued_answered_or_at_the_finishers_room() -> None:
    """Speculative decoding runs on drafts only where the engine will not place the next token."""
    d = driver(2, 200, layout="combined", protocol="collab", finisher=4, redundancy_every=0)
    assert d.may_place(0, 0) and d.may_place(1, 0)  # step 1's prefix is queued
    d.queues[0].clear()
    assert not d.may_place(0, 10)
    assert d.may_place(0, 200 - d.reserve) and not d.may_place(0, 200 - d.reserve - 1)  # the finisher's room
    d.answered = True
    assert d.may_place(0, 10)
    plain = driver(2, 200)  # raw: nothing is ever placed
    assert not any(plain.may_place(w, n) for w in range(2) for n in (0, 150, 199))
