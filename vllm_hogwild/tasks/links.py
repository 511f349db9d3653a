"""A task whose items cost what nobody knows until they are done: follow links from each start to its end.

The prompt holds a table of links between nodes and a list of starting points. Each item is the path from
one start to its end, a terminal node, followed link by link. What a path costs (1 to :data:`MAX_HOPS` links,
heavy-tailed: most are short, some are long) is nowhere in the prompt: the links are listed in a random order,
so nothing cheaper than following a path tells its length. A split made in advance (worker ``i`` takes starts
``i``, ``i + N``, ...) is therefore unbalanced by chance, and workers that claim starts as they go, each taking
what is left when it is free, finish sooner. Two modes:

- **all**: every start's path is the answer;
- **find**: exactly one start's path ends at the goal, the terminal :data:`GOAL` (``Z``) the prompt names; the
  group is done when that one is found and written. A worker that reads a co-worker's find can stop; so can a
  split made in advance whose client cancels the other requests at the find (:func:`split_cancel_steps`, the
  honest baseline in this mode), which needs no reading at all.

The text (one node a token for the trained collaborator's tokenizer)::

    Links:
    12>45
    7>Z
    45>7
    88>B
    Starts: a=12, b=88,
    Find: Z.                <- find mode only
    Paths:
    a: 12 45 7 Z!           <- a worker: the find ("!" where ";" ends any other path)
    b: 88 B;                <- another worker

Internal nodes are numbers 1..:data:`MAX_NODE`, terminals the letters ``A``.. ``Z`` (a path's terminal is its
own; ``Z``, the goal, ends the answer's path in find mode and no path in all mode: which path reaches it is known
only by following them, and telling the goal needs no comparison of two letters, which a 4-layer model of width
128 did not learn over long prompts; see ``docs/user_guide.md``); a link is written ``source>end``; each start has a letter (:data:`SLOTS`, in the list's order), written
``letter=start,``; the terminal to find is followed by a full stop. Writing ``"\\n{letter}:"`` claims that start;
the entry goes on with the start and its path. A worker may also check a co-worker's entry: ``"\n{letter}?"``, then
that start's path followed again (:data:`CHECK`); a check replaces every entry of its start, whether it confirms
or corrects them. The answer is checked by :func:`check`, exactly; every error in an argument is a ``ValueError``
that names the field. Pure: no torch, no vLLM.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Sequence

MAX_NODE = 149  # internal nodes 1..149
TERMINALS = tuple(chr(c) for c in range(ord("A"), ord("Z") + 1))
GOAL = TERMINALS[-1]  # find mode: the terminal to find, and only the answer's path ends there (all mode: none does)
MAX_ITEMS = len(TERMINALS) - 1  # a terminal per path, the goal kept for the find
SLOTS = "abcdefghijklmnopqrstuvwxyz"  # the starts' letters, in the list's order (a claim names a letter)
MAX_HOPS = 30  # links on one path
MAX_TOTAL_HOPS = 140  # a task's paths together (its starts and inner nodes, one per link, must fit MAX_NODE)
MODES = ("all", "find")
MAX_REPEATS = 3  # times the prompt may list each link (a longer table that says nothing more: see make_task)
LINKS_HEAD, STARTS_HEAD, FIND_HEAD, PATHS_HEAD = "Links:", "Starts:", "Find:", "Paths:"
PATH_END, FOUND, LINK = ";", "!", ">"
CHECK = "?"  # "\nb?" in place of "\nb:": the path of b's start followed again, a check of b's entry (see check)
ITEM_OVERHEAD = 3  # tokens of an entry besides its hops: the claim ("\nb:"), the start (" 12") and the end (";" or "!")
_ENTRY = re.compile(r"\n([a-z]):((?: (?:\d{1,3}|[A-Z]))+)([;!])")
_UNFINISHED = re.compile(r"\n[a-z]:(?: (?:\d{1,3}|[A-Z]))*")
_CHECK = re.compile(r"\n([a-z])\?((?: (?:\d{1,3}|[A-Z]))+)([;!])")
_UNFINISHED_CHECK = re.compile(r"\n[a-z][:?](?: (?:\d{1,3}|[A-Z]))*")
_PROMPT = re.compile(
    r"Links:((?:\n\d{1,3}>(?:\d{1,3}|[A-Z]))+)\nStarts:((?: [a-z]=\d{1,3},)+)(?:\nFind: ([A-Z])\.)?\nPaths:$")


@dataclass(frozen=True)
class LinksTask:
    """The paths (each a start, its internal nodes, its terminal), the order the prompt lists links in, the mode
    and (find) the terminal to find."""

    paths: tuple[tuple, ...]  # each (start, node, ..., terminal letter)
    link_order: tuple[int, ...]  # the prompt's lines: each link (by its place in path order) once, or each
    # :attr:`repeats` times (a permutation of the links repeated)
    mode: str = "all"
    target: str | None = None

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode: one of {MODES}")
        if not isinstance(self.paths, tuple) or not 1 <= len(self.paths) <= MAX_ITEMS:
            raise ValueError(f"paths: a tuple of 1 to {MAX_ITEMS} paths")
        nodes, terminals, total = set(), set(), 0
        for path in self.paths:
            if not isinstance(path, tuple) or not 2 <= len(path) <= MAX_HOPS + 1:
                raise ValueError(f"paths: each a tuple of a start, nodes and a terminal, 1 to {MAX_HOPS} links")
            *inner, end = path
            if end not in TERMINALS or end in terminals:
                raise ValueError("paths: each ends at a terminal of its own (a letter A..Z)")
            for node in inner:
                if isinstance(node, bool) or not isinstance(node, int) or not 1 <= node <= MAX_NODE or node in nodes:
                    raise ValueError(f"paths: distinct internal nodes from 1 to {MAX_NODE}")
                nodes.add(node)
            terminals.add(end)
            total += len(path) - 1
        if total > MAX_TOTAL_HOPS:
            raise ValueError(f"paths: at most {MAX_TOTAL_HOPS} links in all")
        repeats, extra = divmod(len(self.link_order), total)
        if extra or not 1 <= repeats <= MAX_REPEATS or sorted(self.link_order) != sorted(list(range(total)) * repeats):
            raise ValueError(f"link_order: a permutation of the links, each listed 1 to {MAX_REPEATS} times as often "
                             "as every other")
        if (self.mode == "find") != (self.target is not None):
            raise ValueError("target: a terminal to find in find mode, none in all mode")
        if self.target is not None and (self.target != GOAL or self.target not in terminals):
            raise ValueError(f"target: the goal {GOAL}, the terminal of one of the paths")
        if self.target is None and GOAL in terminals:
            raise ValueError(f"paths: no path ends at the goal {GOAL} in all mode")

    @property
    def starts(self) -> tuple[int, ...]:
        return tuple(path[0] for path in self.paths)

    @property
    def repeats(self) -> int:
        """How many times the prompt lists each link."""
        return len(self.link_order) // sum(len(path) - 1 for path in self.paths)

    @property
    def links(self) -> list[tuple]:
        """Every line of the prompt's table, in its order (a link :attr:`repeats` times)."""
        ordered = [(a, b) for path in self.paths for a, b in zip(path, path[1:])]
        return [ordered[i] for i in self.link_order]

    def hops(self) -> list[int]:
        """Each item's links (in the starts' order)."""
        return [len(path) - 1 for path in self.paths]

    def costs(self) -> list[int]:
        """Each item's cost in tokens: its links and :data:`ITEM_OVERHEAD`."""
        return [h + ITEM_OVERHEAD for h in self.hops()]

    @property
    def answer_index(self) -> int | None:
        """Find mode: the item whose path ends at the target."""
        return None if self.target is None else next(i for i, p in enumerate(self.paths) if p[-1] == self.target)

    def prompt(self) -> str:
        return prompt(self)


def draw_hops(rng: random.Random) -> int:
    """One path's links: 60% 1 to 3, else a Pareto tail from 6 up to :data:`MAX_HOPS`."""
    if rng.random() < 0.6:
        return rng.randint(1, 3)
    return min(MAX_HOPS, int(6 + rng.paretovariate(1.2) * 4))


def make_task(num_items: int, seed: int, mode: str = "all", repeats: int = 1) -> LinksTask:
    """A task of ``num_items`` paths drawn with ``seed`` (find mode: the target drawn too), its table listing each
    link ``repeats`` times in a random order. The paths and the answer are those of ``repeats=1`` with the same
    seed; only the table is longer (twice or three times the lines for the same links: a longer prompt whose
    lookups the links collaborator gets wrong by chance, see ``docs/user_guide.md``)."""
    _check_int("num_items", num_items, 1, MAX_ITEMS)
    _check_int("seed", seed, -(1 << 63), (1 << 63) - 1)
    _check_int("repeats", repeats, 1, MAX_REPEATS)
    if mode not in MODES:
        raise ValueError(f"mode: one of {MODES}")
    rng = random.Random(seed)
    while True:  # a task whose paths fit the nodes (the long tail is rare enough that this ends at once)
        hops = [draw_hops(rng) for _ in range(num_items)]
        if sum(hops) <= MAX_TOTAL_HOPS:
            break
    nodes = rng.sample(range(1, MAX_NODE + 1), sum(hops))  # starts and internal nodes: hop - 1 inner + 1 start
    ends = rng.sample(TERMINALS, num_items)
    paths, at = [], 0
    for h, end in zip(hops, ends):
        paths.append((*nodes[at: at + h], end))
        at += h
    order = list(range(sum(hops)))
    rng.shuffle(order)
    target = rng.choice(ends) if mode == "find" else None
    # the goal is the answer's terminal (find) or nobody's (all): swap letters, leaving every draw above as it was
    swap = {target: GOAL, GOAL: target} if target is not None else {GOAL: next(t for t in TERMINALS if t not in ends)}
    paths = [(*p[:-1], swap.get(p[-1], p[-1])) for p in paths]
    if repeats > 1:  # drawn after everything else: the paths are those of one listing
        order = list(range(sum(hops))) * repeats
        rng.shuffle(order)
    return LinksTask(tuple(paths), tuple(order), mode, None if target is None else GOAL)


def make_tasks(num_tasks: int, seed: int, mode: str = "all", min_items: int = 16, max_items: int = 20,
               repeats: int = 1) -> list[LinksTask]:
    """``num_tasks`` tasks of ``min_items`` to ``max_items`` paths each, all drawn from ``seed``, each link listed
    ``repeats`` times (the tasks' paths are those of ``repeats=1``)."""
    _check_int("repeats", repeats, 1, MAX_REPEATS)
    return seeded_tasks(lambda k, s, m: make_task(k, s, m, repeats), MAX_ITEMS, num_tasks, seed, mode, min_items,
                        max_items)


def seeded_tasks(make, most: int, num_tasks: int, seed: int, mode: str, min_items: int, max_items: int) -> list:
    """``num_tasks`` tasks ``make(items, seed, mode)`` of ``min_items`` to ``max_items`` (at most ``most``) items
    each, their sizes and seeds all drawn from ``seed`` (the links family's generators share it)."""
    _check_int("num_tasks", num_tasks, 1, 1_000_000)
    _check_int("seed", seed, -(1 << 63), (1 << 63) - 1)
    _check_int("min_items", min_items, 1, most)
    _check_int("max_items", max_items, min_items, most)
    rng = random.Random(seed)
    return [make(rng.randint(min_items, max_items), rng.randrange(1 << 62), mode) for _ in range(num_tasks)]


def prompt(task: LinksTask) -> str:
    """The prompt the collaborator reads (completions; the chat template renders a user message to the same)."""
    if not isinstance(task, LinksTask):
        raise ValueError("task: a LinksTask")
    links = "".join(f"\n{a}{LINK}{b}" for a, b in task.links)  # a link: its source, then where it leads
    starts = " ".join(f"{SLOTS[i]}={s}," for i, s in enumerate(task.starts))  # its letter, the start, a comma
    find = f"\n{FIND_HEAD} {task.target}." if task.target is not None else ""
    return f"{LINKS_HEAD}{links}\n{STARTS_HEAD} {starts}{find}\n{PATHS_HEAD}"


def task_of_prompt(text: str) -> LinksTask:
    """The task a prompt asks for (the text :func:`prompt` writes)."""
    if not isinstance(text, str) or len(text) > 16384:
        raise ValueError("prompt: a string of at most 16384 characters")
    match = _PROMPT.match(text)
    if match is None:
        raise ValueError(f"prompt: expected {LINKS_HEAD!r} lines 'a>b', {STARTS_HEAD!r} 'a=12,' and {PATHS_HEAD!r}")
    links = [tuple(line.split(LINK)) for line in match.group(1).strip("\n").split("\n")]
    succ = {}
    for a, b in links:
        end = int(b) if b.isdigit() else b
        if succ.setdefault(int(a), end) != end:
            raise ValueError("prompt: a node with two links")
    paths = []
    lettered = re.findall(r" ([a-z])=(\d{1,3}),", match.group(2))
    if "".join(letter for letter, _ in lettered) != SLOTS[:len(lettered)]:
        raise ValueError("prompt: the starts lettered a, b, c, ... in order")
    for start in (int(s) for _, s in lettered):
        path, node = [start], start
        while not isinstance(node, str):
            if node not in succ or len(path) > MAX_HOPS + 1:
                raise ValueError(f"prompt: the path from {start} does not end at a terminal")
            node = succ[node]
            path.append(node)
        paths.append(tuple(path))
    in_path_order = [(a, b) for path in paths for a, b in zip(path, path[1:])]
    position = {link: i for i, link in enumerate(in_path_order)}
    listed = [(int(a), int(b) if b.isdigit() else b) for a, b in links]
    if set(listed) != set(in_path_order):
        raise ValueError("prompt: links that no start reaches")
    if len(set(Counter(listed).values())) != 1:
        raise ValueError("prompt: every link listed as many times as every other")
    target = match.group(3)
    return LinksTask(tuple(paths), tuple(position[link] for link in listed), "find" if target else "all", target)


def entry(index: int, path: Sequence, found: bool = False) -> str:
    """One worker's entry for the path of the ``index``-th start: ``"\\n{letter}: {start} {node} ... {terminal};"``
    (``!`` for the find)."""
    _check_int("index", index, 0, MAX_ITEMS - 1)
    return f"\n{SLOTS[index]}:" + "".join(f" {node}" for node in path) + (FOUND if found else PATH_END)


@dataclass(frozen=True)
class PathEntry:
    worker: int
    start: int  # the start its letter names
    nodes: tuple  # what the worker wrote after the letter: the start, then the path
    found: bool


@dataclass
class LinksScore:
    """How a group's texts answer a task."""

    correct: bool  # all: every start's path exactly, nothing else; find: the find, right, and no wrong path
    entries: list[PathEntry] = field(default_factory=list)  # every finished entry, worker by worker, in writing order
    missing: tuple[int, ...] = ()  # all: starts nobody finished
    wrong: tuple[int, ...] = ()  # starts with a wrong path, or a wrong find
    malformed: int = 0  # characters that are no entry, or an entry of a letter no start has (find mode: a
    # worker's unfinished last entry is not)
    duplicated_items: int = 0  # finished entries beyond the first for a start
    found: int | None = None  # find: the start reported found (the first, by worker order)
    checks: list["PathCheck"] = field(default_factory=list)  # every finished check, worker by worker

    def checks_by_kind(self) -> dict[str, int]:
        """How many checks of each kind (:data:`CHECK_KINDS`, zero where none)."""
        kinds = dict.fromkeys(CHECK_KINDS, 0)
        for c in self.checks:
            kinds[c.kind] += 1
        return kinds


CHECK_KINDS = ("confirmed", "missed", "corrected", "unnecessary", "wrong correction", "without an entry")


@dataclass(frozen=True)
class PathCheck:
    """A finished check (``"\nb? ..."``) and what it did to its start's entries: ``confirmed`` (the path every
    entry wrote, and right), ``missed`` (the same, wrong), ``corrected`` (a path no entry wrote, right),
    ``unnecessary`` (a path no entry wrote where every entry was right: it is wrong), ``wrong correction`` (a
    path no entry wrote, wrong, where an entry was wrong too), ``without an entry`` (no finished entry of its
    start)."""

    worker: int
    start: int
    nodes: tuple
    found: bool
    kind: str


def parse(text: str, allow_unfinished: bool = False) -> tuple[list[tuple[int, tuple, bool]], int]:
    """``(entries, malformed characters)`` of one worker's text, each entry ``(index of its letter, the nodes
    written after it, found)``; its unfinished last entry is malformed unless ``allow_unfinished`` (a worker that
    stopped reading a co-worker's find)."""
    entries, bad = parse_entries(text, _ENTRY, allow_unfinished)
    return [(index, nodes, end == FOUND) for index, nodes, end in entries if end], bad


def parse_entries(text: str, entry_re: re.Pattern, allow_unfinished: bool,
                  checks: list | None = None) -> tuple[list[tuple[int, tuple, str]], int]:
    """The links family's entries in one worker's text: ``(entries, malformed characters)``, each entry ``(index of
    its letter, the nodes written after it, its end as ``entry_re``'s third group matched it)``; an unfinished last
    entry is malformed unless ``allow_unfinished``, and then given with the end ``""`` (if it has a node). With
    ``checks`` (a list), checks (:data:`CHECK`) are read too: each is appended to ``checks`` as ``(its place among
    the entries, index, nodes, end)``, not to the entries; without it they are malformed."""
    if not isinstance(text, str):
        raise ValueError("texts: every text is a string")
    entries, pos, bad = [], 0, 0
    unfinished = _UNFINISHED if checks is None else _UNFINISHED_CHECK
    while pos < len(text):
        match = entry_re.match(text, pos)
        into = entries
        if match is None and checks is not None:
            match = _CHECK.match(text, pos)
            into = checks
        if match is None:
            nxt = text.find("\n", pos + 1)
            end = len(text) if nxt < 0 else nxt
            if allow_unfinished and nxt < 0 and unfinished.fullmatch(text[pos:]):
                nodes = tuple(int(x) if x.isdigit() else x for x in text[pos + 3:].split())
                if nodes and text[pos + 2] == CHECK:
                    checks.append((len(entries), SLOTS.index(text[pos + 1]), nodes, ""))
                elif nodes:
                    entries.append((SLOTS.index(text[pos + 1]), nodes, ""))
            else:
                bad += len(text[pos:end].strip())
            pos = end
            continue
        nodes = tuple(int(x) if x.isdigit() else x for x in match.group(2).split())
        record = (SLOTS.index(match.group(1)), nodes, match.group(3))
        into.append(record if into is entries else (len(entries), *record))
        pos = match.end()
    return entries, bad


def parse_checked(text: str, allow_unfinished: bool = False) -> tuple[list[tuple[int, tuple, bool, bool]], int]:
    """``(records, malformed characters)``: one worker's finished entries and checks in writing order, each
    ``(index of its letter, the nodes written after it, found, a check)``."""
    checks: list = []
    entries, bad = parse_entries(text, _ENTRY, allow_unfinished, checks)
    records, at = [], 0
    for i in range(len(entries) + 1):  # each check before the entry it was written before
        while at < len(checks) and checks[at][0] <= i:
            _, c_index, c_nodes, c_end = checks[at]
            if c_end:
                records.append((c_index, c_nodes, c_end == FOUND, True))
            at += 1
        if i < len(entries) and entries[i][2]:
            index, nodes, end = entries[i]
            records.append((index, nodes, end == FOUND, False))
    return records, bad


def check(task: LinksTask, texts: Sequence[str]) -> LinksScore:
    """LinksScore the group's texts (one per worker, in worker order) against ``task``."""
    if not isinstance(task, LinksTask):
        raise ValueError("task: a LinksTask")
    if isinstance(texts, str) or not isinstance(texts, Sequence) or not texts:
        raise ValueError("texts: a non-empty sequence of strings, one per worker")
    find = task.mode == "find"
    entries, malformed, records = [], 0, []
    for worker, text in enumerate(texts):
        got, bad = parse_checked(text, allow_unfinished=find)
        malformed += bad
        for index, nodes, is_find, is_check in got:
            if index >= len(task.paths):  # a letter no start has
                malformed += len(entry(index, nodes, is_find)) - 1
                continue
            records.append((worker, index, nodes, is_find, is_check))
            if not is_check:
                entries.append(PathEntry(worker, task.paths[index][0], nodes, is_find))
    checked = {index for _, index, _, _, is_check in records if is_check}
    seen, wrong, found, checks = {}, set(), None, []
    for worker, index, nodes, is_find, is_check in records:
        start = task.paths[index][0]
        if not is_check:
            seen[start] = seen.get(start, 0) + 1
        if is_check:
            checks.append(PathCheck(worker, start, nodes, is_find, _check_kind(task, index, nodes, records)))
        elif index in checked:
            continue  # its start's checks answer for it
        if task.paths[index] != nodes or is_find != (find and nodes[-1] == task.target):
            wrong.add(start)
        if is_find and found is None:
            found = start
    duplicated = sum(c - 1 for c in seen.values())
    if find:
        answer = task.paths[task.answer_index][0]
        correct = found == answer and not wrong and malformed == 0
        return LinksScore(correct, entries, (), tuple(sorted(wrong)), malformed, duplicated, found, checks)
    missing = tuple(s for i, s in enumerate(task.starts) if s not in seen and i not in checked)
    correct = not missing and not wrong and malformed == 0
    return LinksScore(correct, entries, missing, tuple(sorted(wrong)), malformed, duplicated, None, checks)


def _check_kind(task: LinksTask, index: int, nodes: tuple, records: list) -> str:
    written = {n for _, i, n, _, is_check in records if i == index and not is_check}
    right = nodes == task.paths[index]
    if not written:
        return "without an entry"
    if written == {nodes}:
        return "confirmed" if right else "missed"
    if right:
        return "corrected"
    return "unnecessary" if written == {task.paths[index]} else "wrong correction"


# -- what a split of the work costs, from the true costs (in engine steps: each worker's tokens, its end included)


def round_robin_steps(task: LinksTask, num_workers: int) -> int:
    """Worker ``i`` does items ``i, i + N, ...`` whole, in order; in find mode only the one that finds stops there
    (no worker knows what the others found)."""
    _check_int("num_workers", num_workers, 1, 64)
    costs, answer = task.costs(), task.answer_index
    totals = []
    for w in range(num_workers):
        total = 0
        for i in range(w, len(costs), num_workers):
            total += costs[i]
            if i == answer:
                break
        totals.append(total)
    return max(totals) + 1


def split_cancel_steps(task: LinksTask, num_workers: int) -> int:
    """The round-robin split whose client cancels the rest at the find: worker ``i`` does items ``i, i + N, ...``
    whole, in order (made in advance, nobody reads a co-worker), and in find mode the group ends in the step the
    find is written (any client cancels its other requests there; the engine's answer pattern ends a group
    there). In all mode nothing is cancelled: :func:`round_robin_steps`."""
    _check_int("num_workers", num_workers, 1, 64)
    answer = task.answer_index
    if answer is None:
        return round_robin_steps(task, num_workers)
    costs = task.costs()
    return sum(costs[i] for i in range(answer % num_workers, answer + 1, num_workers)) + 1


def ideal_steps(task: LinksTask, num_workers: int) -> int:
    """Claim as you go with no lag and no collisions: a free worker takes the next start in the prompt's order;
    in find mode everyone stops the moment the answer is written."""
    _check_int("num_workers", num_workers, 1, 64)
    free_at = [0] * num_workers
    answer = task.answer_index
    for i, cost in enumerate(task.costs()):
        w = min(range(num_workers), key=free_at.__getitem__)
        free_at[w] += cost
        if i == answer:
            return free_at[w] + 1
    return max(free_at) + 1


def longest_first_steps(task: LinksTask, num_workers: int) -> int:
    """All mode: the longest items first, each to the worker free first, by true cost (a bound no real split
    reaches: it needs the costs in advance). Find mode: the answer's own cost (someone who knew would go there)."""
    _check_int("num_workers", num_workers, 1, 64)
    costs = task.costs()
    if task.answer_index is not None:
        return costs[task.answer_index] + 1
    free_at = [0] * num_workers
    for cost in sorted(costs, reverse=True):
        w = min(range(num_workers), key=free_at.__getitem__)
        free_at[w] += cost
    return max(free_at) + 1


def makespan_bound(task: LinksTask, num_workers: int) -> int:
    """No split does better: the work shared evenly, or its longest item (find: the answer item)."""
    _check_int("num_workers", num_workers, 1, 64)
    costs = task.costs()
    if task.answer_index is not None:
        return costs[task.answer_index] + 1
    return max(-(-sum(costs) // num_workers), max(costs)) + 1


def _check_int(name: str, value, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{name}: an integer in [{low}, {high}]")
