"""The collaboration protocol's text (pure)."""

from __future__ import annotations

import pytest

from vllm_hogwild.core.protocol_text import (
    HEADERS,
    NAMES,
    PERSONS,
    TASKS,
    RedundancyChecks,
    final_answer,
    names,
    preamble,
    paragraph_prefix,
)


def test_names_and_prefixes() -> None:
    assert names(2) == ("Alice", "Bob") and len(set(NAMES)) == 8
    assert paragraph_prefix(1, 3, 2) == "**Bob [3]:** "
    assert paragraph_prefix(0, 1, 4, check=True).startswith("**Alice [1]:** (Am I repeating")
    for bad in (0, 9):
        with pytest.raises(ValueError, match="^n: "):
            names(bad)


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("person", PERSONS)
@pytest.mark.parametrize("n", [2, 4, 8])
def test_the_preamble_names_the_team_and_how_to_read_the_transcript(task, person, n) -> None:
    text = preamble(n, task, person)
    assert text.startswith("You are one of" if person == "second" else "We are")
    assert f"{n} workers ({', '.join(NAMES[:n])})" in text
    assert "**Alice [1]:**" in text
    assert all(h.strip().removeprefix("### ") in text for k, h in HEADERS.items() if k != "pivot")
    assert ("\\boxed{}" in text) == (task == "math")


def test_bad_template_fields_are_named() -> None:
    from vllm_hogwild.core.errors import HogwildOptionError

    with pytest.raises(HogwildOptionError, match="^task: ") as info:
        preamble(2, task="poetry")
    assert info.value.parameter == "task"
    with pytest.raises(HogwildOptionError, match="^person: ") as info:
        preamble(2, person="third")
    assert info.value.parameter == "person"


@pytest.mark.parametrize("task", TASKS)
def test_the_finisher_suffix_leads_into_the_default_answer_pattern(task) -> None:
    """Suffix + a short answer + its closing text matches the task's pattern."""
    from vllm_hogwild.core.protocol_text import DEFAULT_ANSWER_PATTERN, FINISHER_SUFFIX

    tail = {"math": "42}", "code": "print(42)\n```", "general": " 42\n"}[task]
    assert final_answer("some work" + FINISHER_SUFFIX[task] + tail, task) in ("42", "print(42)")
    assert final_answer("some work" + FINISHER_SUFFIX[task], task) is None
    assert DEFAULT_ANSWER_PATTERN.keys() == FINISHER_SUFFIX.keys()


def test_redundancy_checks_fire_when_the_group_crosses_a_multiple() -> None:
    checks = RedundancyChecks(every=100)
    assert [checks.due(a, b) for a, b in [(0, 99), (99, 100), (100, 101), (180, 230), (0, 400)]] == [
        False, True, False, True, True]
    assert not RedundancyChecks(0).due(0, 10**6)


@pytest.mark.parametrize("text,task,expected", [
    ("so x = 3.\n\n\\boxed{3}", "math", "3"),
    ("\\boxed{1} no wait \\boxed{\\frac{1}{2}}", "math", "\\frac{1}{2}"),
    ("nothing yet", "math", None),
    ("Final answer: Paris\n", "general", "Paris"),
    ("Final answer: Par", "general", None),  # a line still being written
    ("```python\nprint(1)\n```", "code", "print(1)"),
])
def test_final_answer_is_the_last_one_written(text, task, expected) -> None:
    assert final_answer(text, task) == expected


def test_final_answer_with_a_configured_pattern() -> None:
    assert final_answer("ANSWER=42;", pattern=r"ANSWER=(\d+)") == "42"


def test_group_answer_is_the_first_worker_that_wrote_one() -> None:
    from vllm_hogwild.core.protocol_text import group_answer

    pattern = r"\\boxed\{([^}]*)\}"
    assert group_answer(["thinking", "so \\boxed{ 7 }", "\\boxed{8}"], pattern) == (1, "7")
    assert group_answer(["a", "b"], pattern) is None
