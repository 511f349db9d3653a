"""The collaboration protocol's text: worker names, paragraph prefixes, preambles, checks, the final answer.

Pure, no vLLM. The engine turns these strings into tokens it forces into the
lanes (see ``docs/user_guide.md``); this module only decides what they say.

- Workers are named Alice, Bob, Carol, Dave, Erin, Frank, Grace, Heidi (up to
  8); every paragraph of a worker starts with its prefix, ``**Alice [3]:** ``.
- The preamble tells the workers they are a team that writes into one shared
  transcript, in a template per task kind (``math``: a boxed final answer,
  ``code``, ``general``) and person (``second``: "You are one of 2 workers
  ...", ``first``: "We are 2 workers ..."). It is one text for the whole
  group: a worker knows which one it is from its own paragraph prefix, which always
  opens the last part of its view. Raw prompts (``/v1/completions``) get it
  in front of the prompt, chat requests as a system message that goes through
  the model's chat template.
- Section headers (``### Past steps``, ...) stand between the parts of a
  ``combined`` view; the engine stores them once, at the tail of the prompt.
- A periodic redundancy check is a short question a worker's paragraph prefix
  carries ("Am I repeating someone's work?").
- The finisher's suffix asks one worker for the final answer now, in the
  form the task's answer pattern matches.
- :func:`final_answer` finds the answer a worker wrote (``\\boxed{...}`` by
  default, or any regular expression with one group).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from vllm_hogwild.core.errors import HogwildOptionError
from vllm_hogwild.core.patterns import compile_pattern

NAMES = ("Alice", "Bob", "Carol", "Dave", "Erin", "Frank", "Grace", "Heidi")
TASKS = ("math", "code", "general")
PERSONS = ("second", "first")
MAX_WORKERS = len(NAMES)

_TEAM = {
    "second": (
        "You are one of {n} workers ({roster}) solving the task below together. "
        "You all write at the same time into one shared transcript. Every step starts with its writer's name "
        "and number, like **{first} [1]:**, and the step after \"### Work in progress (own)\" is always your own. "
        "You see everyone's finished steps under \"### Past steps\" and the steps the others are writing right now "
        "under \"### Work in progress (others)\". Split the work: say what you take on, do not redo what someone "
        "else is doing, and build on their results."
    ),
    "first": (
        "We are {n} workers ({roster}) solving the task below together. "
        "We all write at the same time into one shared transcript. Every step starts with its writer's name "
        "and number, like **{first} [1]:**, and the step after \"### Work in progress (own)\" is always mine. "
        "I see everyone's finished steps under \"### Past steps\" and the steps the others are writing right now "
        "under \"### Work in progress (others)\". We split the work: I say what I take on, I do not redo what "
        "someone else is doing, and I build on their results."
    ),
}
_GOAL = {
    "math": "When the answer is certain, put it once within \\boxed{}.",
    "code": "When the code is complete, write the final version once in a single ```python block.",
    "general": "When the task is done, write the final result once, starting with 'Final answer:'.",
}
_PARAGRAPHS = "Write in short steps separated by blank lines."  # the model reads paragraphs as "steps"

# Section headers between the parts of a view (``combined``, ``interleaved``).
# The engine stores them once, at the tail of the group's prompt.
HEADERS = {
    "history": "### Past steps\n\n",
    "others": "### Work in progress (others)\n\n",
    "pivot": " <...>\n\n",
    "own": "### Work in progress (own)\n\n",
}
HEADER_ORDER = ("history", "others", "pivot", "own")  # their order in the prompt tail: the own header last

REDUNDANCY_CHECK = "(Am I repeating someone's work? If so, I switch to something else.) "
FINISHER_SUFFIX = {
    "math": "\n\nTime is up. The final answer is \\boxed{",
    "code": "\n\nTime is up. The final code:\n```python\n",
    "general": "\n\nTime is up. Final answer:",
}

DEFAULT_ANSWER_PATTERN = {
    "math": r"\\boxed\{((?:[^{}]|\{[^{}]*\})*)\}",
    "code": r"```python\n(.*?)```",
    "general": r"Final answer:[ \t]*([^\n]+)\n",
}


def names(num_workers: int) -> tuple[str, ...]:
    if not 1 <= num_workers <= MAX_WORKERS:
        raise HogwildOptionError("n", f"the collaboration protocol names 1 to {MAX_WORKERS} workers, not {num_workers}")
    return NAMES[:num_workers]


def paragraph_prefix(worker: int, number: int, num_workers: int, check: bool = False) -> str:
    """``**Alice [3]:** `` (``number`` counted from 1), with the redundancy check when ``check``."""
    name = names(num_workers)[worker]
    return f"**{name} [{number}]:** " + (REDUNDANCY_CHECK if check else "")


def preamble(num_workers: int, task: str = "math", person: str = "second") -> str:
    """What the whole team is told before the task; one text, shared by every worker.

    A worker knows which one it is from its own paragraph prefix, which always opens
    the last part of its view (as in the paper).
    """
    check_template(task, person)
    team = names(num_workers)
    text = _TEAM[person].format(n=num_workers, roster=", ".join(team), first=team[0])
    return f"{text} {_PARAGRAPHS} {_GOAL[task]}"


def check_template(task: str, person: str) -> None:
    if task not in TASKS:
        raise HogwildOptionError("task", f"unknown task {task!r}; expected one of {list(TASKS)}")
    if person not in PERSONS:
        raise HogwildOptionError("person", f"unknown person {person!r}; expected one of {list(PERSONS)}")


@dataclass(frozen=True)
class RedundancyChecks:
    """Every ``every`` tokens the group generates, the next paragraph prefix of each worker carries the check."""

    every: int = 0  # 0: off

    def due(self, group_tokens_before: int, group_tokens_now: int) -> bool:
        """True when the group crossed a multiple of ``every`` between the two counts."""
        if self.every <= 0:
            return False
        return group_tokens_now // self.every > group_tokens_before // self.every


def answer_regex(pattern: str):
    """An answer pattern compiled as everywhere in the project: RE2, ``.`` matching newlines, one group."""
    return compile_pattern("answer_pattern", pattern, dot_all=True, min_groups=1)


def final_answer(text: str, task: str = "math", pattern: str | None = None) -> str | None:
    """The last answer written in ``text`` (the pattern's first group, stripped), or ``None``."""
    found = [m.group(1).strip() for m in answer_regex(pattern or DEFAULT_ANSWER_PATTERN[task]).finditer(text)]
    return found[-1] if found else None


def first_match(texts: Sequence[str], pattern: str):
    """``(worker, match)`` of the first worker (in worker order) whose text matches ``pattern``, or ``None``.

    With ``answer_pattern`` the engine ends the group one token after the first
    match, so at most the workers that matched in that same engine step carry one;
    worker order breaks the tie. Linear in the texts' length (RE2).
    """
    regex = answer_regex(pattern)
    for worker, text in enumerate(texts):
        match = regex.search(text)
        if match:
            return worker, match
    return None


def group_answer(texts: Sequence[str], pattern: str) -> tuple[int, str] | None:
    """``(worker, answer)`` of a group's outputs (worker order): the first worker whose text matches."""
    found = first_match(texts, pattern)
    return None if found is None else (found[0], found[1].group(1).strip())
