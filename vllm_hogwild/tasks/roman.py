"""The collaborator's task: Roman numerals for a list of numbers. Pure, no torch and no vLLM.

A task lists ``K`` distinct numbers from 1 to :data:`MAX_NUMBER`; the answer
gives each one in Roman numerals. The work splits into independent items of
unequal length (``I`` is one letter, ``XXXVIII`` seven), so N workers can share
it, and a fixed split of the list is unbalanced: reading who took what pays.

The text the trained collaborator reads and writes (:func:`prompt`)::

    Roman numerals: 12 38 7 21
    Answers:
    38 = XXXVIII;          <- worker 0
    12 = XII;
    7 = VII;               <- worker 1
    21 = XXI;

Every worker writes entries ``"\n{number} = {numeral};"``, each on a line of
its own. Writing an entry's number claims it: a co-worker that reads the claim takes another number. A
worker that sees every number claimed ends its text. The answer is the union
of every worker's entries (:func:`check`); it is correct when every listed
number has exactly the right numeral, no entry names a number that is not
listed and nothing else is written. The same number done twice (two workers
claimed it in the same engine step, or a worker did not read a claim) is a
*duplicated item*: wasted work, not an error, as long as both numerals are right.

Every error in an argument is a ``ValueError`` that names the field.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Sequence

MAX_NUMBER = 39  # numbers 1..39: 39 item types, numerals of 1 to 7 letters
MAX_ITEMS = MAX_NUMBER
PROMPT_HEAD = "Roman numerals:"
ANSWER_HEAD = "Answers:"
ENTRY_END = ";"  # ends every entry; the `step_end` of the layouts with a shared history
_NUMERALS = ((10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I"))
_ENTRY = re.compile(r"\s*(\d{1,3})\s*=\s*([IVXLCDM]{1,12})\s*;")
_PROMPT = re.compile(r"\s*Roman numerals:((?:\s+\d{1,3}){1,64})\s*(?:\n\s*Answers:\s*)?$")


def to_roman(number: int) -> str:
    """``number`` (1..39) in Roman numerals."""
    _check_number("number", number)
    out = []
    for value, letters in _NUMERALS:
        while number >= value:
            out.append(letters)
            number -= value
    return "".join(out)


@dataclass(frozen=True)
class Task:
    """The numbers to convert, in the order the prompt lists them."""

    items: tuple[int, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.items, tuple) or not 1 <= len(self.items) <= MAX_ITEMS:
            raise ValueError(f"items: a tuple of 1 to {MAX_ITEMS} numbers")
        for number in self.items:
            _check_number("items", number)
        if len(set(self.items)) != len(self.items):
            raise ValueError("items: every number once")

    @property
    def num_items(self) -> int:
        return len(self.items)

    def answer(self) -> dict[int, str]:
        return {n: to_roman(n) for n in self.items}

    def prompt(self) -> str:
        return prompt(self)


def make_task(num_items: int, seed: int) -> Task:
    """``num_items`` distinct numbers drawn with ``seed`` (any int)."""
    _check_int("num_items", num_items, 1, MAX_ITEMS)
    _check_int("seed", seed, -(1 << 63), (1 << 63) - 1)
    return Task(tuple(random.Random(seed).sample(range(1, MAX_NUMBER + 1), num_items)))


def make_tasks(num_tasks: int, seed: int, min_items: int = 12, max_items: int = 24) -> list[Task]:
    """``num_tasks`` tasks of ``min_items`` to ``max_items`` numbers each, all drawn from ``seed``."""
    _check_int("num_tasks", num_tasks, 1, 1_000_000)
    _check_int("seed", seed, -(1 << 63), (1 << 63) - 1)
    _check_int("min_items", min_items, 1, MAX_ITEMS)
    _check_int("max_items", max_items, min_items, MAX_ITEMS)
    rng = random.Random(seed)
    return [Task(tuple(rng.sample(range(1, MAX_NUMBER + 1), rng.randint(min_items, max_items))))
            for _ in range(num_tasks)]


def prompt(task: Task) -> str:
    """The prompt the collaborator reads (completions; the chat template renders a user message to the same)."""
    return f"{PROMPT_HEAD} {' '.join(map(str, task.items))}\n{ANSWER_HEAD}"


def task_of_prompt(text: str) -> Task:
    """The task a prompt asks for (the text :func:`prompt` writes, ``Answers:`` optional)."""
    if not isinstance(text, str) or len(text) > 4096:
        raise ValueError("prompt: a string of at most 4096 characters")
    match = _PROMPT.match(text)
    if match is None:
        raise ValueError(f"prompt: expected {PROMPT_HEAD!r} followed by numbers from 1 to {MAX_NUMBER}")
    return Task(tuple(int(n) for n in match.group(1).split()))


def entry(number: int) -> str:
    """One worker's entry for ``number``, as the collaborator writes it: a line of its own."""
    return f"\n{number} = {to_roman(number)}{ENTRY_END}"


@dataclass(frozen=True)
class Entry:
    worker: int
    number: int
    numeral: str


@dataclass
class Score:
    """How a group's texts answer a task."""

    correct: bool  # every listed number has exactly its numeral, nothing else is written
    entries: list[Entry] = field(default_factory=list)  # every entry, worker by worker, in writing order
    missing: tuple[int, ...] = ()  # listed numbers nobody wrote
    wrong: tuple[int, ...] = ()  # numbers with a wrong numeral (or not listed at all)
    malformed: int = 0  # characters of text that are not entries
    duplicated_items: int = 0  # entries beyond the first for a number

    def claims(self, worker: int) -> list[int]:
        return [e.number for e in self.entries if e.worker == worker]


def parse(text: str) -> tuple[list[tuple[int, str]], int]:
    """``(entries, malformed characters)`` of one worker's text; an unfinished last entry is malformed."""
    if not isinstance(text, str):
        raise ValueError("texts: every text is a string")
    entries, pos, bad = [], 0, 0
    while pos < len(text):
        match = _ENTRY.match(text, pos)
        if match is None:
            nxt = text.find(ENTRY_END, pos)
            end = len(text) if nxt < 0 else nxt + 1
            bad += len(text[pos:end].strip())
            pos = end
            continue
        entries.append((int(match.group(1)), match.group(2)))
        pos = match.end()
    return entries, bad


def check(task: Task, texts: Sequence[str]) -> Score:
    """Score the group's texts (one per worker, in worker order) against ``task``."""
    if not isinstance(task, Task):
        raise ValueError("task: a Task")
    if isinstance(texts, str) or not isinstance(texts, Sequence) or not texts:
        raise ValueError("texts: a non-empty sequence of strings, one per worker")
    truth = task.answer()
    entries, malformed, seen, wrong = [], 0, {}, set()
    for worker, text in enumerate(texts):
        found, bad = parse(text)
        malformed += bad
        for number, numeral in found:
            entries.append(Entry(worker, number, numeral))
            seen[number] = seen.get(number, 0) + 1
            if truth.get(number) != numeral:
                wrong.add(number)
    missing = tuple(n for n in task.items if n not in seen)
    duplicated = sum(c - 1 for c in seen.values())
    correct = not missing and not wrong and malformed == 0
    return Score(correct, entries, missing, tuple(sorted(wrong)), malformed, duplicated)


def _check_int(name: str, value, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{name}: an integer in [{low}, {high}]")


def _check_number(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_NUMBER:
        raise ValueError(f"{name}: numbers from 1 to {MAX_NUMBER}")
