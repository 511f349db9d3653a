"""Links whose paths run into each other: a worker may finish its path by reference to one already written.

The links task (:mod:`.links`) with merges: many starts' paths run into a node that another start's path also
passes, and from there on share its links and its terminal. Where paths merge is nowhere in the prompt (the links
stay in a random order, and a node's in-links are not grouped): it is known only once a path through the node has
been written. A worker whose path reaches a node that some entry already written has followed *past* it ends its
entry there with a reference, ``=``, instead of following the shared rest again::

    Links:
    12>45
    45>7
    7>9
    88>7
    9>Z
    Starts: a=12, b=88,
    Paths:
    a: 12 45 7 9 Z;          <- a worker follows a's path to its end
    b: 88 7=                 <- a co-worker reaches 7, which a's entry has passed: b's path goes on as a's does

The reference names no entry: every path through a node goes on the same way (each node has one link out), so
"from here on, as written" is exact. It is right when what the worker wrote is the start's path up to the node and
another finished entry of the group has written that node followed by more of its path (a node or an end): a
reference to an entry that itself ends there by reference is not (two workers that reach the node in one step and
both refer would leave the rest unwritten). An independent request reads only its own text, so a split made in
advance reuses only its own share's paths; a Hogwild group reads everyone's.

Modes:

- **all**: every start's path;
- **find**: the prompt names the goal, :data:`GOAL` (``Z``), and how many starts reach it (``Find: 3 to Z.``);
  the group is done when every one of them is written (an entry reaching ``Z`` by reference counts). A full
  entry that ends at the goal ends with ``!`` (one that ends elsewhere with ``;``); a reference ends with ``=``.
  The client ends it there: it cancels the group once the texts hold the prompt's count of starts that say they
  reach the goal (:func:`written_finds`, the texts alone), as the split with cancel's client cancels its requests.

The merge distribution (:func:`make_task`): a task's starts are "trunks" (their own terminal, lengths drawn as
:func:`.links.draw_hops` draws them, at least two links) and "mergers" (a path of 1 to 3 new links that runs into
a node of a path drawn before it, chosen uniformly among its inner nodes: long paths attract more merges); the
prompt lists the starts shuffled. :func:`merge_stats` measures the share of starts that merge and the shared
suffix's share of a merging path's links; :mod:`.merges_policy` runs the baselines and the policy in lock-step.
Every error in an argument is a ``ValueError`` that names the field. Pure: no torch, no vLLM.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Sequence

from vllm_hogwild.tasks.links import (FIND_HEAD, FOUND, GOAL, ITEM_OVERHEAD, LINK, LINKS_HEAD, MAX_NODE,
                                      PATH_END, PATHS_HEAD, SLOTS, STARTS_HEAD, TERMINALS, _check_int, draw_hops,
                                      parse_entries, seeded_tasks)

MODES = ("all", "find")
REFERENCE = "="  # ends an entry at a node some other entry has followed past: the rest as written there
MAX_ITEMS = len(SLOTS)
MAX_PATH = 40  # nodes on one path, start and terminal included (a merger's prefix and its target's suffix)
MERGE_SHARE = (0.5, 0.7)  # the share of a task's starts that merge, drawn uniformly per task
MERGE_PREFIX = (1, 3)  # a merger's own links before the node it runs into
_ENTRY = re.compile(r"\n([a-z]):((?: (?:\d{1,3}|[A-Z]))+)([;!=])")
_PROMPT = re.compile(
    r"Links:((?:\n\d{1,3}>(?:\d{1,3}|[A-Z]))+)\nStarts:((?: [a-z]=\d{1,3},)+)(?:\nFind: (\d{1,2}) to ([A-Z])\.)?"
    r"\nPaths:$")


@dataclass(frozen=True)
class MergesTask:
    """Each start's whole path (start, inner nodes, terminal letter), in the prompt's order of starts; the order
    the prompt lists the links in (a permutation of :attr:`links_in_order`); the mode."""

    paths: tuple[tuple, ...]
    link_order: tuple[int, ...]
    mode: str = "all"

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode: one of {MODES}")
        if not isinstance(self.paths, tuple) or not 1 <= len(self.paths) <= MAX_ITEMS:
            raise ValueError(f"paths: a tuple of 1 to {MAX_ITEMS} paths")
        succ, into = {}, {}
        for path in self.paths:
            if not isinstance(path, tuple) or not 2 <= len(path) <= MAX_PATH:
                raise ValueError(f"paths: each a tuple of a start, nodes and a terminal, at most {MAX_PATH} nodes")
            *inner, end = path
            if end not in TERMINALS:
                raise ValueError("paths: each ends at a terminal (a letter A..Z)")
            for node in inner:
                if isinstance(node, bool) or not isinstance(node, int) or not 1 <= node <= MAX_NODE:
                    raise ValueError(f"paths: nodes are integers from 1 to {MAX_NODE}")
            if len(set(inner)) != len(inner):
                raise ValueError("paths: a path passes a node once")
            for a, b in zip(path, path[1:]):
                if succ.setdefault(a, b) != b:
                    raise ValueError("paths: a node has one link out (paths that meet go on together)")
                if isinstance(b, str) and into.setdefault(b, a) != a:
                    raise ValueError("paths: a terminal has one link in (paths that share a terminal meet before it)")
        starts = [p[0] for p in self.paths]
        inner = {n for p in self.paths for n in p[1:-1]}
        if len(set(starts)) != len(starts) or inner & set(starts):
            raise ValueError("paths: distinct starts, none on another path")
        if sorted(self.link_order) != list(range(len(succ))):
            raise ValueError("link_order: a permutation of the links")
        ends = {p[-1] for p in self.paths}
        if self.mode == "find" and GOAL not in ends:
            raise ValueError(f"paths: in find mode some path ends at the goal {GOAL}")
        if self.mode == "all" and GOAL in ends:
            raise ValueError(f"paths: no path ends at the goal {GOAL} in all mode")

    @property
    def starts(self) -> tuple[int, ...]:
        return tuple(p[0] for p in self.paths)

    @property
    def links_in_order(self) -> list[tuple]:
        """Every link once, in the order the paths first pass them."""
        seen, out = set(), []
        for path in self.paths:
            for link in zip(path, path[1:]):
                if link not in seen:
                    seen.add(link)
                    out.append(link)
        return out

    @property
    def links(self) -> list[tuple]:
        """Every link in the prompt's order."""
        ordered = self.links_in_order
        return [ordered[i] for i in self.link_order]

    @property
    def answer(self) -> tuple[int, ...]:
        """Find mode: the indices of the starts whose paths reach the goal (all mode: none)."""
        return tuple(i for i, p in enumerate(self.paths) if self.mode == "find" and p[-1] == GOAL)

    def hops(self) -> list[int]:
        return [len(p) - 1 for p in self.paths]

    def costs(self) -> list[int]:
        """Each start's cost in tokens written in full: its links and :data:`.links.ITEM_OVERHEAD`."""
        return [h + ITEM_OVERHEAD for h in self.hops()]

    def prompt(self) -> str:
        return prompt(self)


def make_task(num_items: int, seed: int, mode: str = "all") -> MergesTask:
    """A task of ``num_items`` starts drawn with ``seed``: trunks and mergers (module docstring); find mode: one
    trunk's terminal is the goal, and its mergers reach it too."""
    _check_int("num_items", num_items, 1, MAX_ITEMS)
    _check_int("seed", seed, -(1 << 63), (1 << 63) - 1)
    if mode not in MODES:
        raise ValueError(f"mode: one of {MODES}")
    rng = random.Random(seed)
    while True:  # redrawn until the nodes suffice (rare at these sizes)
        task = _draw(rng, num_items, mode)
        if task is not None:
            return task


def _draw(rng: random.Random, num_items: int, mode: str) -> MergesTask | None:
    mergers = round(num_items * rng.uniform(*MERGE_SHARE)) if num_items > 1 else 0
    trunks = num_items - mergers
    free = rng.sample(range(1, MAX_NODE + 1), MAX_NODE)
    ends = rng.sample([t for t in TERMINALS if t != GOAL], trunks)
    if mode == "find":
        ends[rng.randrange(trunks)] = GOAL
    paths = []
    for end in ends:
        hops = max(2, draw_hops(rng))
        if len(free) < hops:
            return None
        paths.append((*(free.pop() for _ in range(hops)), end))
    for _ in range(mergers):
        inner = [(p, k) for p in paths for k in range(1, len(p) - 1)]  # long paths: more nodes to run into
        if not inner:
            return None
        target, k = rng.choice(inner)
        own = rng.randint(*MERGE_PREFIX)
        if len(free) < own or own + len(target) - k > MAX_PATH:
            return None
        paths.append((*(free.pop() for _ in range(own)), *target[k:]))
    rng.shuffle(paths)
    links = len({link for p in paths for link in zip(p, p[1:])})
    order = list(range(links))
    rng.shuffle(order)
    return MergesTask(tuple(paths), tuple(order), mode)


def make_tasks(num_tasks: int, seed: int, mode: str = "all", min_items: int = 16,
               max_items: int = 20) -> list[MergesTask]:
    """``num_tasks`` tasks of ``min_items`` to ``max_items`` starts each, all drawn from ``seed``."""
    return seeded_tasks(make_task, MAX_ITEMS, num_tasks, seed, mode, min_items, max_items)


def prompt(task: MergesTask) -> str:
    """The prompt: the links (shuffled), the lettered starts, in find mode how many starts reach the goal."""
    if not isinstance(task, MergesTask):
        raise ValueError("task: a MergesTask")
    links = "".join(f"\n{a}{LINK}{b}" for a, b in task.links)
    starts = " ".join(f"{SLOTS[i]}={s}," for i, s in enumerate(task.starts))
    find = f"\n{FIND_HEAD} {len(task.answer)} to {GOAL}." if task.mode == "find" else ""
    return f"{LINKS_HEAD}{links}\n{STARTS_HEAD} {starts}{find}\n{PATHS_HEAD}"


def task_of_prompt(text: str) -> MergesTask:
    """The task a prompt asks for (the text :func:`prompt` writes)."""
    if not isinstance(text, str) or len(text) > 16384:
        raise ValueError("prompt: a string of at most 16384 characters")
    match = _PROMPT.match(text)
    if match is None:
        raise ValueError(f"prompt: expected {LINKS_HEAD!r} lines 'a>b', {STARTS_HEAD!r} 'a=12,' and {PATHS_HEAD!r}")
    listed = []
    for line in match.group(1).strip("\n").split("\n"):
        a, b = line.split(LINK)
        listed.append((int(a), int(b) if b.isdigit() else b))
    succ = {}
    for a, b in listed:
        if a in succ:
            raise ValueError("prompt: a node with two links")
        succ[a] = b
    lettered = re.findall(r" ([a-z])=(\d{1,3}),", match.group(2))
    if "".join(letter for letter, _ in lettered) != SLOTS[:len(lettered)]:
        raise ValueError("prompt: the starts lettered a, b, c, ... in order")
    paths = []
    for start in (int(s) for _, s in lettered):
        path, node = [start], start
        while not isinstance(node, str):
            if node not in succ or len(path) >= MAX_PATH:
                raise ValueError(f"prompt: the path from {start} does not end at a terminal")
            node = succ[node]
            path.append(node)
        paths.append(tuple(path))
    mode = "find" if match.group(4) else "all"
    if mode == "find" and match.group(4) != GOAL:
        raise ValueError(f"prompt: the goal is {GOAL}")
    used = {link for p in paths for link in zip(p, p[1:])}
    if len(listed) != len(used) or set(listed) != used:
        raise ValueError("prompt: links that no start reaches")
    try:
        task = MergesTask(tuple(paths), tuple(range(len(listed))), mode)
        position = {link: i for i, link in enumerate(task.links_in_order)}
        task = MergesTask(task.paths, tuple(position[link] for link in listed), mode)
    except ValueError as err:
        raise ValueError(f"prompt: {err}") from None
    if mode == "find" and int(match.group(3)) != len(task.answer):
        raise ValueError(f"prompt: {len(task.answer)} starts reach {GOAL}, not {match.group(3)}")
    return task


def entry(index: int, nodes: Sequence, end: str = PATH_END) -> str:
    """One entry: ``"\\n{letter}: {start} {node} ...{end}"``; ``end`` is ``;`` or ``!`` after a terminal, or
    :data:`REFERENCE` after the node the rest is taken from."""
    _check_int("index", index, 0, MAX_ITEMS - 1)
    if end not in (PATH_END, FOUND, REFERENCE):
        raise ValueError(f"end: one of {PATH_END!r}, {FOUND!r}, {REFERENCE!r}")
    return f"\n{SLOTS[index]}:" + "".join(f" {node}" for node in nodes) + end


def entry_for(task: MergesTask, index: int, upto: int | None = None) -> str:
    """The entry the task's ``index``-th start is right with: its whole path (``upto`` None) or its path up to
    node ``upto`` (a position, at least 1, before the terminal) and a reference."""
    path = task.paths[index]
    if upto is None:
        return entry(index, path, FOUND if task.mode == "find" and path[-1] == GOAL else PATH_END)
    _check_int("upto", upto, 1, len(path) - 2)
    return entry(index, path[:upto + 1], REFERENCE)


@dataclass(frozen=True)
class MergeEntry:
    worker: int
    index: int  # the start's index in the list (its letter)
    nodes: tuple  # what the worker wrote after the letter: the start, then the path (up to the reference)
    end: str  # ";", "!" or "="; "" for find mode's last entry of a worker the group's end cut off
    position: int  # its order among the worker's entries


@dataclass(frozen=True)
class Reference:
    """A right reference: ``worker``'s entry for start ``index`` ended at ``node``, which ``from_worker``'s entry
    for start ``from_index`` (the first that continues past it, in worker order, a finished one first) had
    written; ``skipped`` links of the shared rest were not written."""

    worker: int
    index: int
    node: int
    from_worker: int
    from_index: int
    skipped: int


@dataclass
class MergesScore:
    correct: bool  # all: every start right; find: every start reaching the goal right; and no wrong entry
    entries: list[MergeEntry] = field(default_factory=list)
    missing: tuple[int, ...] = ()  # indices of starts nobody finished (find: of those reaching the goal)
    wrong: tuple[int, ...] = ()  # indices of starts with a wrong entry (a wrong path, end or reference)
    malformed: int = 0  # characters that are no entry
    duplicated_items: int = 0  # finished entries beyond the first for a start
    references: list[Reference] = field(default_factory=list)
    found: tuple[int, ...] = ()  # find: the starts written right that reach the goal


def parse(text: str, allow_unfinished: bool = False) -> tuple[list[tuple[int, tuple, str]], int]:
    """``(entries, malformed characters)`` of one worker's text, each entry ``(index of its letter, the nodes
    written after it, its end)``; an unfinished last entry is malformed unless ``allow_unfinished`` (find mode:
    a worker the group's end cut off), and then it is given with the end ``""``."""
    return parse_entries(text, _ENTRY, allow_unfinished)


def _check_texts(texts: Sequence[str]) -> None:
    if isinstance(texts, str) or not isinstance(texts, Sequence) or not texts:
        raise ValueError("texts: a non-empty sequence of strings, one per worker")
    if len(texts) > 64:
        raise ValueError("texts: at most 64 workers")


def _entries(texts: Sequence[str], count: int, find: bool) -> tuple[list[MergeEntry], int]:
    """Every worker's entries in worker order, and the malformed characters (an entry whose letter is past the
    ``count`` starts among them)."""
    entries, malformed = [], 0
    for worker, text in enumerate(texts):
        got, bad = parse(text, allow_unfinished=find)
        malformed += bad
        for position, (index, nodes, end) in enumerate(got):
            if index >= count:  # a letter no start has (finished or, in find mode, cut off): malformed
                malformed += len(f"{SLOTS[index]}:" + "".join(f" {node}" for node in nodes) + end)
                continue
            entries.append(MergeEntry(worker, index, nodes, end, position))
    return entries, malformed


def _continued(entries: Sequence[MergeEntry]) -> dict:
    """node -> the first entry (worker order) that writes it and goes on past it, a finished one before any the
    group's end cut off (every path through a node goes on the same way: a finished source is whole)."""
    continued: dict = {}
    for e in sorted(entries, key=lambda e: e.end == ""):  # stable: worker order within each kind
        for node in e.nodes[:-1] if e.end in (REFERENCE, "") else e.nodes:
            if isinstance(node, int):
                continued.setdefault(node, e)
    return continued


def _expanded(e: MergeEntry, continued: dict) -> tuple[tuple, MergeEntry] | None:
    """The path an entry stands for and the entry it ends in: its nodes, and after a reference the rest as its
    source goes on (that source's end says whether it is whole: ``""`` where the group's end cut it off); None
    where a reference leads nowhere. Followed in a loop, each entry once: no recursion, whatever the texts."""
    nodes, visited = list(e.nodes), {id(e)}
    while e.end == REFERENCE:
        e = continued.get(nodes[-1])
        if e is None or id(e) in visited:
            return None
        visited.add(id(e))
        nodes.extend(e.nodes[e.nodes.index(nodes[-1]) + 1:])
        if len(nodes) > MAX_PATH:
            return None
    return tuple(nodes), e


def written_finds(texts: Sequence[str], count: int = MAX_ITEMS) -> set[int]:
    """Find mode: the starts (indices) whose finished entries in the group's texts say they reach the goal: an
    entry ended by ``!``, or by a reference whose rest, read through the texts alone, ends in an entry ended by
    ``!``. This is what a client reads to cancel a group (it knows the prompt's count, nothing of the paths), as
    the split with cancel's client does; whether the entries are right is :func:`check`'s. ``count``: the
    task's starts (letters past them are no entry)."""
    _check_texts(texts)
    _check_int("count", count, 1, MAX_ITEMS)
    entries, _ = _entries(texts, count, True)
    continued = _continued(entries)
    found = set()
    for e in entries:
        if e.end == FOUND:
            found.add(e.index)
        elif e.end == REFERENCE:
            got = _expanded(e, continued)
            if got is not None and got[1].end == FOUND:
                found.add(e.index)
    return found


def find_done(task: MergesTask, texts: Sequence[str]) -> bool:
    """Find mode: whether the group's texts hold the prompt's count of starts that say they reach the goal
    (:func:`written_finds`), where its client cancels it; all mode: never."""
    return task.mode == "find" and len(written_finds(texts, len(task.paths))) >= len(task.answer)


def check(task: MergesTask, texts: Sequence[str]) -> MergesScore:
    """Score the group's texts (one per worker, in worker order) against ``task``: every reference expanded,
    exactly (module docstring)."""
    if not isinstance(task, MergesTask):
        raise ValueError("task: a MergesTask")
    _check_texts(texts)
    find = task.mode == "find"
    entries, malformed = _entries(texts, len(task.paths), find)
    continued = _continued(entries)

    def expanded(e: MergeEntry) -> tuple[tuple, bool] | None:
        got = _expanded(e, continued)
        return None if got is None else (got[0], got[1].end != "")

    wrong, right, references, seen = set(), set(), [], {}
    for e in entries:
        if e.end == "":
            continue  # cut off by the group's end (find mode): a source of references, not an entry
        seen[e.index] = seen.get(e.index, 0) + 1
        path = task.paths[e.index]
        if e.end == REFERENCE:
            got = expanded(e)
            if find and got is not None and not got[1] and got[0] == path[:len(got[0])]:
                continue  # right so far, its source cut off by the group's end: unresolved, as if unfinished
            ok = 2 <= len(e.nodes) < len(path) and got is not None and got[0] == path
            if ok:
                source = continued[e.nodes[-1]]
                references.append(Reference(e.worker, e.index, e.nodes[-1], source.worker, source.index,
                                            len(path) - len(e.nodes)))
        else:
            ok = e.nodes == path and (e.end == FOUND) == (find and path[-1] == GOAL)
        (right if ok else wrong).add(e.index)
    if find:
        answer = set(task.answer)
        missing = tuple(sorted(answer - right))
        found = tuple(sorted(answer & right))
        correct = not missing and not wrong and malformed == 0
    else:
        missing = tuple(i for i in range(len(task.paths)) if i not in right and i not in wrong)
        found = ()
        correct = not missing and not wrong and malformed == 0
    return MergesScore(correct, entries, missing, tuple(sorted(wrong)), malformed,
                       sum(c - 1 for c in seen.values()), references, found)


def merge_stats(tasks: Sequence[MergesTask]) -> dict:
    """How much the tasks' paths share: the share of starts whose path runs into a path listed before it (in
    the prompt's order: what a worker going down the list would meet), the shared suffix's mean share of such a
    path's links, and the share of all links that a group reusing everything it could would skip."""
    merging, shares, skipped, total = 0, [], 0, 0
    for task in tasks:
        seen: set = set()
        for path in task.paths:
            k = next((i for i, node in enumerate(path[1:-1], 1) if node in seen), None)
            hops = len(path) - 1
            total += hops
            if k is not None:
                merging += 1
                shares.append((hops - k) / hops)
                skipped += hops - k
            seen.update(path[1:-1])
    starts = sum(len(t.paths) for t in tasks)
    return {"starts": starts, "merging_share": merging / starts,
            "shared_suffix_share": sum(shares) / len(shares) if shares else 0.0, "links_skippable": skipped / total}
