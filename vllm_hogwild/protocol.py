"""The collaboration protocol's text: worker names, step prefixes, preambles, checks, the final answer.

Pure, no vLLM. The engine turns these strings into tokens it places into the
lanes (see ``docs/user_guide.md``); this module only decides what they say.

- Workers are named Alice, Bob, Carol, Dave, Erin, Frank, Grace, Heidi (up to
  8); every step of a worker starts with its prefix, ``**Alice [3]:** ``.
- The preamble tells the workers they are a team that writes into one shared
  transcript, in a template per task kind (``math``: a boxed final answer,
  ``code``, ``general``) and person (``second``: "You are Alice ...",
  ``first``: "I am Alice ..."). The same text serves raw prompts
  (``/v1/completions``) and chat, where it goes through the model's template.
- A periodic redundancy check is a short question a worker's step prefix
  carries ("Am I repeating someone's work?").
- The finisher's suffix asks one worker for the final answer now.
- :func:`final_answer` finds the answer a worker wrote (``\\boxed{...}`` by
  default, or any regular expression with one group).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

NAMES = ("Alice", "Bob", "Carol", "Dave", "Erin", "Frank", "Grace", "Heidi")
TASKS = ("math", "code", "general")
PERSONS = ("second", "first")
MAX_WORKERS = len(NAMES)

_TEAM = {
    "second": (
        "You are {name}, one of {n} workers ({roster}) solving the task below together. "
        "You all write at the same time into one shared transcript and see each other's finished steps "
        "and the step each of the others is writing right now. Split the work: say what you take on, "
        "do not redo what someone else is doing, and build on their results."
    ),
    "first": (
        "I am {name}, one of {n} workers ({roster}) solving the task below together. "
        "We all write at the same time into one shared transcript and I see the others' finished steps "
        "and the step each of them is writing right now. We split the work: I say what I take on, "
        "I do not redo what someone else is doing, and I build on their results."
    ),
}
_GOAL = {
    "math": "When the answer is certain, write it once as \\boxed{answer}.",
    "code": "When the code is complete, write the final version once in a single ```python block.",
    "general": "When the task is done, write the final result once, starting with 'Final answer:'.",
}
_STEPS = "Write in short steps separated by blank lines."

REDUNDANCY_CHECK = "(Am I repeating someone's work? If so, I switch to something else.) "
FINISHER_SUFFIX = "\n\nTime is up. The final answer, in one line: "

DEFAULT_ANSWER_PATTERN = {
    "math": r"\\boxed\{((?:[^{}]|\{[^{}]*\})*)\}",
    "code": r"```python\n(.*?)```",
    "general": r"Final answer:\s*(.+)",
}


def names(num_workers: int) -> tuple[str, ...]:
    if not 1 <= num_workers <= MAX_WORKERS:
        raise ValueError(f"n: the collaboration protocol names 1 to {MAX_WORKERS} workers, not {num_workers}")
    return NAMES[:num_workers]


def step_prefix(worker: int, step: int, num_workers: int, check: bool = False) -> str:
    """``**Alice [3]:** `` (step counted from 1), with the redundancy check when ``check``."""
    name = names(num_workers)[worker]
    return f"**{name} [{step}]:** " + (REDUNDANCY_CHECK if check else "")


def preamble(worker: int, num_workers: int, task: str = "general", person: str = "second") -> str:
    """What worker ``worker`` is told before the task."""
    if task not in TASKS:
        raise ValueError(f"hogwild.task: unknown task {task!r}; expected one of {list(TASKS)}")
    if person not in PERSONS:
        raise ValueError(f"hogwild.person: unknown person {person!r}; expected one of {list(PERSONS)}")
    team = names(num_workers)
    roster = ", ".join(team)
    text = _TEAM[person].format(name=team[worker], n=num_workers, roster=roster)
    return f"{text} {_STEPS} {_GOAL[task]}"


@dataclass(frozen=True)
class RedundancyChecks:
    """Every ``every`` tokens the group generates, the next step prefix of each worker carries the check."""

    every: int = 0  # 0: off

    def due(self, group_tokens_before: int, group_tokens_now: int) -> bool:
        """True when the group crossed a multiple of ``every`` between the two counts."""
        if self.every <= 0:
            return False
        return group_tokens_now // self.every > group_tokens_before // self.every


def final_answer(text: str, task: str = "math", pattern: str | None = None) -> str | None:
    """The last answer written in ``text`` (the pattern's first group, stripped), or ``None``."""
    regex = re.compile(pattern or DEFAULT_ANSWER_PATTERN[task], re.DOTALL)
    found = [m.group(1).strip() for m in regex.finditer(text)]
    return found[-1] if found else None


def group_answer(texts: Sequence[str], pattern: str) -> tuple[int, str] | None:
    """``(worker, answer)`` of a group's outputs (worker order): the first worker whose text matches.

    With ``answer_pattern`` the engine ends the group one token after the first
    match, so at most the workers that matched in that same step carry one.
    """
    regex = re.compile(pattern, re.DOTALL)
    for worker, text in enumerate(texts):
        match = regex.search(text)
        if match:
            return worker, match.group(1).strip()
    return None
