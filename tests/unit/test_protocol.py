"""The collaboration protocol's text (pure)."""

from __future__ import annotations

import pytest

from vllm_hogwild.protocol import (
    NAMES,
    PERSONS,
    TASKS,
    RedundancyChecks,
    final_answer,
    names,
    preamble,
    step_prefix,
)


def test_names_and_prefixes() -> None:
    assert names(2) == ("Alice", "Bob") and len(set(NAMES)) == 8
    assert step_prefix(1, 3, 2) == "**Bob [3]:** "
    assert step_prefix(0, 1, 4, check=True).startswith("**Alice [1]:** (Am I repeating")
    for bad in (0, 9):
        with pytest.raises(ValueError, match="^n: "):
            names(bad)


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("person", PERSONS)
@pytest.mark.parametrize("n", [2, 4, 8])
def test_preambles_name_the_reader_and_the_team(task, person, n) -> None:
    for w in range(n):
        text = preamble(w, n, task, person)
        assert f"{'You are' if person == 'second' else 'I am'} {NAMES[w]}," in text
        assert ", ".join(NAMES[:n]) in text and f"one of {n} workers" in text
    assert ("\\boxed{answer}" in preamble(0, n, task, person)) == (task == "math")


def test_bad_template_fields_are_named() -> None:
    with pytest.raises(ValueError, match="^hogwild.task: "):
        preamble(0, 2, task="poetry")
    with pytest.raises(ValueError, match="^hogwild.person: "):
        preamble(0, 2, person="third")


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
    ("```python\nprint(1)\n```", "code", "print(1)"),
])
def test_final_answer_is_the_last_one_written(text, task, expected) -> None:
    assert final_answer(text, task) == expected


def test_final_answer_with_a_configured_pattern() -> None:
    assert final_answer("ANSWER=42;", pattern=r"ANSWER=(\d+)") == "42"


def test_group_answer_is_the_first_worker_that_wrote_one() -> None:
    from vllm_hogwild.protocol import group_answer

    pattern = r"\\boxed\{([^}]*)\}"
    assert group_answer(["thinking", "so \\boxed{ 7 }", "\\boxed{8}"], pattern) == (1, "7")
    assert group_answer(["a", "b"], pattern) is None
