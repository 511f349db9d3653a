"""Reading a links group's texts (:mod:`vllm_hogwild.tasks.links`) beyond right or wrong: its errors by kind, a
majority vote per start over isolated workers, and the checking policy played on from a run. Pure: no torch, no
vLLM."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass
from typing import Sequence

from vllm_hogwild.tasks.links import CHECK, LinksScore, LinksTask, check, entry, parse, parse_checked

ERROR_KINDS = ("wrong start", "joins another path", "wrong next node", "wrong end", "missing", "malformed")


def error_kinds(task: LinksTask, texts: Sequence[str], score: LinksScore | None = None) -> dict[str, int]:
    """What went wrong in a group's texts, by kind (every kind of :data:`ERROR_KINDS`, zero where none): each
    finished entry whose path is not its start's, by where it first leaves that path (at its start; onto a node
    or terminal of another path; or onto a node on no path), each right path ended by the wrong mark (``!`` for a
    path that is not the find, or ``;`` for the find), the starts nobody finished (all mode), and the malformed
    texts (a worker's text with any malformed character counts once). The entries are counted before any check
    replaced them (what the checks did: :meth:`LinksScore.checks_by_kind`); texts without checks are right
    exactly when every count is zero. ``score``: :func:`check` of the texts, where the caller has it already."""
    score = score or check(task, texts)
    on_path = {node: i for i, path in enumerate(task.paths) for node in path}
    kinds = dict.fromkeys(ERROR_KINDS, 0)
    for e in score.entries:
        index = task.starts.index(e.start)
        path = task.paths[index]
        if e.nodes == path:
            kinds["wrong end"] += e.found != (task.mode == "find" and path[-1] == task.target)
            continue
        k = next((j for j, (a, b) in enumerate(zip(e.nodes, path)) if a != b), min(len(e.nodes), len(path)))
        if k == 0:
            kinds["wrong start"] += 1
        elif k < len(e.nodes) and on_path.get(e.nodes[k], index) != index:
            kinds["joins another path"] += 1
        else:
            kinds["wrong next node"] += 1
    kinds["missing"] = len(score.missing)
    for text in texts:  # characters that are no entry or check, or one of a letter no start has
        got, bad = parse_checked(text, allow_unfinished=task.mode == "find")
        kinds["malformed"] += bool(bad or any(record[0] >= len(task.paths) for record in got))
    return kinds


@dataclass(frozen=True)
class Vote:
    """A majority vote per start over workers who did not read each other (all mode)."""

    correct: bool  # every start's voted path is its path
    answers: tuple  # each start's voted path (the starts' order), or None: no entry, or a tie between paths
    wrong: tuple[int, ...] = ()  # starts whose vote is a wrong path, a tie, or nothing
    ties: int = 0


def vote(task: LinksTask, texts: Sequence[str]) -> Vote:
    """Each start's answer is the path most workers' finished entries give it (a worker's first entry for a start
    counts, once); a tie between the most-written paths gives none. What a client that runs N isolated requests
    and votes gets, read from their texts."""
    if not isinstance(task, LinksTask):
        raise ValueError("task: a LinksTask")
    if task.mode != "all":
        raise ValueError("task: a vote is per start, in all mode")
    if isinstance(texts, str) or not isinstance(texts, Sequence) or not texts:
        raise ValueError("texts: a non-empty sequence of strings, one per worker")
    counts: list[Counter] = [Counter() for _ in task.paths]
    for text in texts:
        seen = set()
        for index, nodes, _ in parse(text)[0]:
            if index < len(task.paths) and index not in seen:
                seen.add(index)
                counts[index][nodes] += 1
    answers, wrong, ties = [], [], 0
    for index, count in enumerate(counts):
        top = count.most_common(2)
        tie = len(top) == 2 and top[0][1] == top[1][1]
        ties += tie
        answer = top[0][0] if top and not tie else None
        answers.append(answer)
        if answer != task.paths[index]:
            wrong.append(task.paths[index][0])
    return Vote(not wrong, tuple(answers), tuple(wrong), ties)


def checked_replay(task: LinksTask, texts: Sequence[str], rng: random.Random) -> tuple[list[str], int] | None:
    """The checking policy played on from a group's run (all mode): ``(texts, sequential steps)``, or None where
    a text is malformed (its steps are not known from it).

    Each worker's text is its run as written, a token a node (its claim, the start and the path, the end), and
    where it ended the policy goes on in its place, perfectly, reading what every lane holds (a co-worker's
    token from the step after it was written): while a start is unclaimed, it claims one (uniformly) and writes
    its path; else it checks a co-worker's finished entry whose path shares a node with another start's finished
    entry or check (paths never share one, so one of the two is wrong) and that nobody has claimed to check
    (uniformly among them): ``"\\nb?"`` and the path followed again, which replaces b's entries (:func:`check`);
    else it ends. What a model that learned the policy would reach from the same runs, its checks never wrong:
    the computed bound beside the trained model."""
    if not isinstance(task, LinksTask) or task.mode != "all":
        raise ValueError("task: a LinksTask in all mode")
    if isinstance(texts, str) or not isinstance(texts, Sequence) or not texts:
        raise ValueError("texts: a non-empty sequence of strings, one per worker")
    done = []  # (first step, last step, index, nodes, worker, a check) of every entry and check
    free = []
    for worker, text in enumerate(texts):
        got, bad = parse(text)
        if bad or any(index >= len(task.paths) for index, _, _ in got):
            return None
        step = 0
        for index, nodes, _ in got:
            done.append((step, step + len(nodes) + 1, index, nodes, worker, False))
            step += len(nodes) + 2
        free.append(step)
    added = [""] * len(texts)
    ended = [None] * len(texts)
    step = min(free)
    while any(e is None for e in ended):
        for w in range(len(texts)):
            if ended[w] is not None or free[w] != step:
                continue
            begun = {d[2] for d in done if d[0] < step}
            open_starts = [i for i in range(len(task.paths)) if i not in begun]
            if open_starts:
                index, is_check = rng.choice(open_starts), False
            else:
                finished = [d for d in done if d[1] < step]
                on = Counter(node for node, _ in {(n, d[2]) for d in finished for n in d[3]})
                claimed = {d[2] for d in done if d[5] and d[0] < step}
                suspects = sorted({d[2] for d in finished if not d[5] and d[4] != w and d[2] not in claimed
                                   and any(on[n] > 1 for n in d[3])})
                if not suspects:
                    ended[w] = step + 1  # its end of sequence
                    continue
                index, is_check = rng.choice(suspects), True
            path = task.paths[index]
            done.append((step, step + len(path) + 1, index, path, w, is_check))  # its claim, path and end
            added[w] += entry(index, path).replace(":", CHECK, 1) if is_check else entry(index, path)
            free[w] = step + len(path) + 2
        step += 1
    return [text + more for text, more in zip(texts, added)], max(ended)
