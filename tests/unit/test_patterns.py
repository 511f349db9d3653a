"""Client patterns: RE2 only, bounded compile, bounded matching per token; every option value of every type."""

from __future__ import annotations

import re
import time

import pytest

from vllm_hogwild.core.errors import HogwildOptionError
from vllm_hogwild.core.options import EngineOptions, parse_request
from vllm_hogwild.core.patterns import LOOKBACK_CHARS, MAX_PATTERN_CHARS, WindowMatcher, compile_pattern
from vllm_hogwild.core.protocol.paragraphs import ParagraphTracker

HOSTILE = r"([\w ]+)+Z"  # exponential backtracking in Python's re on words and spaces without a Z


@pytest.mark.parametrize("pattern,why", [
    ("(" * 5000, "characters"),  # over the length cap (Python's re: RecursionError)
    ("(" * 500, "missing )"),
    (r"(a)\1", "escape"),  # a backreference
    (r"(?=a)b", "perl operator"),  # look-ahead
    (r"(?<!a)b", "perl operator"),  # look-behind
    ("a{1001}", "repetition"),
    ("((a{999}){999}){999}", "repetition"),
    ("", "non-empty"),
    (None, "non-empty"),
    (5, "non-empty"),
    (["a"], "non-empty"),
    ({"a": 1}, "non-empty"),
])
def test_patterns_re2_cannot_take_are_refused_naming_the_field(pattern, why) -> None:
    with pytest.raises(HogwildOptionError) as info:
        compile_pattern("hogwild_step_end", pattern)
    assert info.value.parameter == "hogwild_step_end"
    assert why in info.value.message


def test_a_short_pattern_over_the_memory_budget_is_refused() -> None:
    pattern = r"(\pL{30}){30}"  # 13 characters, a program of 900 Unicode letter classes
    assert len(pattern) < MAX_PATTERN_CHARS
    with pytest.raises(HogwildOptionError, match="too large") as info:
        compile_pattern("hogwild_answer_pattern", pattern)
    assert info.value.parameter == "hogwild_answer_pattern"


def test_answer_patterns_need_a_group_and_match_across_lines() -> None:
    with pytest.raises(HogwildOptionError, match="group"):
        compile_pattern("answer_pattern", "no group", min_groups=1)
    regex = compile_pattern("answer_pattern", r"```python\n(.*?)```", dot_all=True, min_groups=1)
    assert regex.search("x ```python\na = 1\nb = 2\n``` y").group(1) == "a = 1\nb = 2\n"


def test_the_hostile_pattern_runs_in_linear_time() -> None:
    """Python's re needs exponential time here; RE2 a bounded few microseconds per token."""
    matcher = WindowMatcher(compile_pattern("answer_pattern", HOSTILE, dot_all=True, min_groups=1))
    start = time.perf_counter()
    for i in range(20_000):
        assert not matcher.feed("word ")
        assert len(matcher._tail) <= LOOKBACK_CHARS + 1  # bounded work per token, whatever the text's length
    elapsed = time.perf_counter() - start
    assert matcher.feed("Z")  # and it still matches
    print(f"\n20,000 tokens of a hostile pattern: {elapsed:.2f} s")
    # A guard against unbounded cost, not a speed check (the bounded tail above is the per-token bound): about
    # 0.12 s on a loaded 2-core machine, so 30 s is over 200 times that; Python's re would not finish one
    # search of this text.
    assert elapsed < 30


@pytest.mark.parametrize("pieces,pattern,expected", [
    (["Ans", "wer: 4", "2 done"], r"Answer: (\d+) done", [False, False, True]),
    (["\\boxed{", "7", "}"], r"\\boxed\{(\d+)\}", [False, False, True]),
    (["x" * 5000, "^start"], r"^start", [False, False]),  # ^ is the text's start, not the window's edge
    (["start", "x" * 5000], r"^start", [True, True]),
])
def test_window_matcher_matches_what_the_whole_text_matches(pieces, pattern, expected) -> None:
    matcher = WindowMatcher(compile_pattern("p", pattern, dot_all=True))
    assert [matcher.feed(p) for p in pieces] == expected


def test_a_match_longer_than_the_window_is_not_seen() -> None:
    """The documented bound: the engine sees matches within the window (plus the new text)."""
    matcher = WindowMatcher(compile_pattern("p", r"<(x+)>", dot_all=True, min_groups=1))
    assert not matcher.feed("<" + "x" * (LOOKBACK_CHARS + 10))
    assert not matcher.feed(">")
    matcher = WindowMatcher(compile_pattern("p", r"<(x+)>", dot_all=True, min_groups=1))
    assert not matcher.feed("<" + "x" * (LOOKBACK_CHARS - 10))
    assert matcher.feed(">")


def test_paragraph_tracker_keeps_a_bounded_window_and_still_ends_paragraphs() -> None:
    tracker = ParagraphTracker(1, 5, paragraph_end=HOSTILE)
    for i in range(3000):
        assert not tracker.on_sampled(0, 5 + i, "word ")
        assert len(tracker._lanes[0].text) <= LOOKBACK_CHARS + 1 + len("word ")
    assert tracker.on_sampled(0, 3005, "Z")
    assert tracker._lanes[0].text == ""


# -- every option, every JSON type ------------------------------------------------

VALUES = [None, True, False, 10**30, -(10**30), -1, 0, 1.5, float("inf"), "", "x" * 100_000, "ünïcødé ✓ \x00",
          [], [1, "a"], {}, {"a": 1}]
OPTIONS = ["layout", "protocol", "step_end", "answer_pattern", "redundancy_every", "task", "person", "finisher"]


def _parse_or_error(extra: dict):
    try:
        return parse_request(extra)
    except HogwildOptionError as err:
        return err


@pytest.mark.parametrize("name", OPTIONS + ["speed"])
def test_every_option_and_every_type_parses_or_names_its_field(name) -> None:
    for flat in (True, False):
        for value in VALUES:
            extra = {f"hogwild_{name}": value} if flat else {"hogwild": {name: value}}
            field = f"hogwild_{name}" if flat else f"hogwild.{name}"
            got = _parse_or_error(extra)
            if isinstance(got, HogwildOptionError):
                assert got.parameter == field, (extra, got)
                assert len(str(got)) < 400  # a 100 kB value is not echoed back
            else:  # only in-range integers of the counting options parse alone
                assert name == "redundancy_every" and value == 0, (extra, got)


@pytest.mark.parametrize("value", VALUES)
def test_the_nested_object_of_any_type_parses_or_is_named(value) -> None:
    got = _parse_or_error({"hogwild": value})
    if isinstance(got, HogwildOptionError):
        assert got.parameter.startswith("hogwild"), got
    else:
        assert value in (None, True) or value == {}


def test_operator_switch_allows_only_the_built_in_patterns() -> None:
    assert EngineOptions.from_additional_config({"hogwild": {"client_patterns": False}}).client_patterns is False
    with pytest.raises(HogwildOptionError) as info:
        EngineOptions.from_additional_config({"hogwild": {"client_patterns": "off"}})
    assert info.value.parameter == "additional_config.hogwild.client_patterns"
    for extra, field in [({"hogwild_answer_pattern": r"(\d+)"}, "hogwild_answer_pattern"),
                         ({"hogwild": {"layout": "combined", "step_end": "\n\n"}}, "hogwild.step_end")]:
        with pytest.raises(HogwildOptionError, match="built-in") as info:
            parse_request(extra, client_patterns=False)
        assert info.value.parameter == field
        parse_request(extra, client_patterns=True)
    # The collab protocol's own answer pattern and the default step end are built in.
    collab = parse_request({"hogwild_protocol": "collab"}, client_patterns=False)
    assert collab.answer_pattern is not None and collab.step_end is None


def test_built_in_patterns_compile_under_re2_and_keep_their_meaning() -> None:
    from vllm_hogwild.core.protocol_text import DEFAULT_ANSWER_PATTERN, FINISHER_SUFFIX, final_answer
    from vllm_hogwild.core.protocol.paragraphs import PARAGRAPH_END

    compile_pattern("step_end", PARAGRAPH_END)
    for task, pattern in DEFAULT_ANSWER_PATTERN.items():
        compile_pattern("answer_pattern", pattern, dot_all=True, min_groups=1)
    assert final_answer("so \\boxed{\\frac{1}{2}} done") == "\\frac{1}{2}"
    assert final_answer("```python\nprint(1)\nprint(2)\n```", "code") == "print(1)\nprint(2)"
    assert final_answer("x" + FINISHER_SUFFIX["general"] + " 42\n", "general") == "42"
    for text in ("Done.\n\n", "He said \u201cyes.\u201d\n\n", "**Case 1.**\n\n"):
        assert re.search(PARAGRAPH_END, text) and compile_pattern("step_end", PARAGRAPH_END).search(text)
