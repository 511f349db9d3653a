"""The collaborator's task: generator, prompt, parser and checker (pure)."""

from __future__ import annotations

import pytest

from vllm_hogwild.tasks import roman


def test_numerals() -> None:
    known = {1: "I", 4: "IV", 9: "IX", 14: "XIV", 19: "XIX", 24: "XXIV", 38: "XXXVIII", 39: "XXXIX"}
    assert {n: roman.to_roman(n) for n in known} == known
    lengths = {len(roman.to_roman(n)) for n in range(1, roman.MAX_NUMBER + 1)}
    assert lengths == set(range(1, 8))  # unequal items: 1 to 7 letters


@pytest.mark.parametrize("k", [1, 2, 12, 24, roman.MAX_ITEMS])
def test_generator_is_seeded_and_distinct(k: int) -> None:
    a, b, c = roman.make_task(k, 5), roman.make_task(k, 5), roman.make_task(k, 6)
    assert a == b and a.num_items == k and len(set(a.items)) == k
    assert k == roman.MAX_ITEMS or a != c
    tasks = roman.make_tasks(64, 3)
    assert tasks == roman.make_tasks(64, 3) and all(12 <= t.num_items <= 24 for t in tasks)


def test_prompt_round_trip() -> None:
    task = roman.make_task(7, 1)
    text = roman.prompt(task)
    assert text == f"Roman numerals: {' '.join(map(str, task.items))}\nAnswers:"
    assert roman.task_of_prompt(text) == task
    assert roman.task_of_prompt("Roman numerals: 3 9") == roman.Task((3, 9))


def test_check_union_of_workers() -> None:
    task = roman.Task((12, 7, 38))
    texts = ["\n38 = XXXVIII;\n12 = XII;", "\n7 = VII;"]
    assert "".join(roman.entry(n) for n in (38, 12)) == texts[0]
    score = roman.check(task, texts)
    assert score.correct and score.duplicated_items == 0 and score.claims(0) == [38, 12] and score.claims(1) == [7]
    dup = roman.check(task, [" 38 = XXXVIII; 12 = XII;", " 12 = XII; 7 = VII;"])
    assert dup.correct and dup.duplicated_items == 1


@pytest.mark.parametrize("texts, missing, wrong, malformed", [
    ([" 38 = XXXVIII; 12 = XII;"], (7,), (), 0),  # a number nobody did
    ([" 38 = XXXVIII; 12 = XII; 7 = VIII;"], (), (7,), 0),  # a wrong numeral
    ([" 38 = XXXVIII; 12 = XII; 7 = VII; 5 = V;"], (), (5,), 0),  # a number not listed
    ([" 38 = XXXVIII; 12 = XII; 7 = VII; 9 = I"], (), (), 5),  # an unfinished entry
    ([" 38 = XXXVIII; 12 = XII; 7 = VII; hello"], (), (), 5),  # other text
    ([" 38 = XXXVIII; 12 = XII;", " 7 = VII; 12 = XI;"], (), (12,), 0),  # a duplicate that disagrees
])
def test_check_failures(texts, missing, wrong, malformed) -> None:
    score = roman.check(roman.Task((12, 7, 38)), texts)
    assert not score.correct
    assert (score.missing, score.wrong, score.malformed) == (missing, wrong, malformed)


@pytest.mark.parametrize("call, field", [
    (lambda: roman.make_task(0, 1), "num_items"),
    (lambda: roman.make_task(40, 1), "num_items"),
    (lambda: roman.make_task("3", 1), "num_items"),
    (lambda: roman.make_task(3, 1.5), "seed"),
    (lambda: roman.make_tasks(0, 1), "num_tasks"),
    (lambda: roman.make_tasks(4, 1, min_items=10, max_items=5), "max_items"),
    (lambda: roman.Task((1, 1)), "items"),
    (lambda: roman.Task((0,)), "items"),
    (lambda: roman.Task([1, 2]), "items"),
    (lambda: roman.to_roman(40), "number"),
    (lambda: roman.task_of_prompt("Add 3 and 4"), "prompt"),
    (lambda: roman.task_of_prompt("Roman numerals: 3 3"), "items"),
    (lambda: roman.task_of_prompt(None), "prompt"),
    (lambda: roman.check(roman.Task((1,)), "I = I;"), "texts"),
    (lambda: roman.check(roman.Task((1,)), []), "texts"),
    (lambda: roman.check(roman.Task((1,)), [None]), "texts"),
    (lambda: roman.check((1,), [" 1 = I;"]), "task"),
])
def test_bad_input_names_the_field(call, field: str) -> None:
    with pytest.raises(ValueError, match=f"^{field}: "):
        call()


def test_parser_is_linear_on_hostile_text() -> None:
    import time

    text = " 1 = I" * 20_000 + "=" * 100_000
    t0 = time.perf_counter()
    entries, bad = roman.parse(text)
    # A guard against unbounded cost, not a speed check: the parse takes about 0.01 ms on a loaded 2-core
    # machine (no entry end in the text: one failed match, one search), so 2 s is over 10,000 times that;
    # only a parser gone super-linear (a backtracking pattern) reaches it.
    assert time.perf_counter() - t0 < 2.0 and entries == [] and bad > 0
