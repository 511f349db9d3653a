"""The fork/join collaborator: the Roman-numerals task as a Multiverse-style request that forks and joins.

The model reads the prompt (:func:`prompt`: the task, then ``<Parallel>``) and
writes a goal with one outline per group of numbers: ``k = min(4, K)`` groups,
the list dealt out in prompt order (number i goes to group i mod k)::

    <Goal>
    <Outline>
    1: 12 21</Outline>
    <Outline>
    2: 38 9</Outline>
    </Goal>

At ``</Goal>`` the engine forks (``hogwild_protocol: multiverse``): branch j
starts with the forced header ``\\n<Path>\\nj:``, reads the text before the
fork and itself (never a sibling), and converts its outline's numbers in an
order it samples, ending with ``\\n</Path>``. At the join the engine forces
``<Conclusion>\\n``; the text after it reads every branch and names the number
each path started with, in path order (``First: 21 9``), then ends. That
conclusion is decided by the branches' sampling, not by the prompt: it is
right only if the join reads every branch (:func:`check`).

Training examples are whole requests laid out as the engine lays them
(:func:`tree`): every token at its view position, a branch's tokens seeing the
text before the fork and its own branch only, the text after the join seeing
everything, with the branches all starting at the fork point and the
conclusion after the longest. That is the engine's view of every lane at every
step, exactly (isolated branches: a token's K/V depends on its own view only).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Sequence

from vllm_hogwild.tasks import roman
from vllm_hogwild.models.roman_collaborator import CLAIM_WEIGHT, MODEL_DIR, Vocab, build_tokenizer, put_target

MAX_PATHS = 4
FORKJOIN_MODEL_DIR = MODEL_DIR.parent / "collaborator-multiverse"


def model_dir():
    """The folder of the shipped fork/join collaborator (an HF folder vLLM loads as it is)."""
    return FORKJOIN_MODEL_DIR
GOAL_HEAD = "\n<Parallel>"
CONCLUSION_HEAD = "First:"
HEADER = "\n<Path>\n{j}:"  # the Multiverse family's branch header (forced by the engine)
JOIN_HEADER = "<Conclusion>\n"  # forced by the engine at the join
BRANCH_END = "\n</Path>"
_FIRST = re.compile(r"First:((?:\s+\d{1,3})*)\s*$")


def prompt(task: roman.Task) -> str:
    return f"{roman.PROMPT_HEAD} {' '.join(map(str, task.items))}{GOAL_HEAD}"


def groups(task: roman.Task) -> list[tuple[int, ...]]:
    k = min(MAX_PATHS, task.num_items)
    return [task.items[j::k] for j in range(k)]


def goal(task: roman.Task) -> str:
    outlines = "".join(f"\n<Outline>\n{j + 1}:" + "".join(f" {n}" for n in g) + "</Outline>"
                       for j, g in enumerate(groups(task)))
    return f"\n<Goal>{outlines}\n</Goal>"


@dataclass(frozen=True)
class Request:
    """One fork/join request's text, part by part (what the model writes and what the engine forces)."""

    task: roman.Task
    orders: tuple[tuple[int, ...], ...]  # each branch's numbers, in the order it did them

    def branch(self, j: int) -> str:
        return "".join(roman.entry(n) for n in self.orders[j]) + BRANCH_END

    def conclusion(self) -> str:
        return CONCLUSION_HEAD + "".join(f" {o[0]}" for o in self.orders)


def sample_request(task: roman.Task, rng: random.Random) -> Request:
    return Request(task, tuple(tuple(rng.sample(g, len(g))) for g in groups(task)))


@dataclass
class ForkJoinScore:
    correct: bool  # the numerals (every branch together) and the conclusion
    numerals: roman.Score
    conclusion_correct: bool
    forked: bool


def check(task: roman.Task, branch_texts: Sequence[str], conclusion: str, forked: bool = True) -> ForkJoinScore:
    """Score a request: its branches' entries against the task, its conclusion against the branches.

    ``branch_texts``: each branch's text after its header (in path order); ``conclusion``: the text after the
    join header.
    """
    cleaned = [t.replace(BRANCH_END.strip(), "").strip() for t in branch_texts]
    numerals = roman.check(task, [" " + t for t in cleaned] or [""])
    firsts = [roman.parse(" " + t)[0][:1] for t in cleaned]
    match = _FIRST.match(conclusion.strip())
    said = [int(n) for n in match.group(1).split()] if match else None
    ok = said is not None and all(f for f in firsts) and said == [f[0][0] for f in firsts]
    return ForkJoinScore(numerals.correct and ok and forked, numerals, ok, forked)


# -- training examples: whole requests as trees ------------------------------------------------------------


@dataclass
class Tree:
    """A request laid out as the engine reads it: for each token, its view position, the part it belongs to
    (``part``: -1 the text before the fork, j branch j, -2 the text after the join) and its target (None: no
    loss: the engine forces the next token, or ends the sequence)."""

    ids: list[int]
    positions: list[int]
    part: list[int]
    targets: list


def tree(vocab: Vocab, tok, request: Request) -> Tree:
    def enc(text: str) -> list[int]:
        return tok.encode(text, add_special_tokens=False).ids

    task = request.task
    ids = vocab.prompt_head + tuple(vocab.item[n] for n in task.items)
    prefix = list(ids) + enc(GOAL_HEAD)
    p = len(prefix)
    goal_ids = enc(goal(task))
    out = Tree(prefix + goal_ids, list(range(p + len(goal_ids))), [-1] * (p + len(goal_ids)),
               [None] * (p - 1) + goal_ids + [None])
    p0 = len(out.ids)
    longest, end = 0, enc(BRANCH_END)
    for j, order in enumerate(request.orders):
        head, body = enc(HEADER.format(j=j + 1)), enc(request.branch(j))
        targets = branch_targets(vocab, groups(task)[j], order, end)
        assert len(targets) == len(body)
        out.ids += head + body
        out.positions += list(range(p0, p0 + len(head) + len(body)))
        out.part += [j] * (len(head) + len(body))
        out.targets += [None] * (len(head) - 1) + targets + [None]  # after its last token the engine ends it
        longest = max(longest, len(head) + len(body))
    join, concl = enc(JOIN_HEADER), enc(request.conclusion())
    at = p0 + longest
    out.ids += join + concl
    out.positions += list(range(at, at + len(join) + len(concl)))
    out.part += [-2] * (len(join) + len(concl))
    out.targets += [None] * (len(join) - 1) + concl + [vocab.eos]
    return out


def branch_targets(vocab: Vocab, numbers: Sequence[int], order: Sequence[int], end: Sequence[int]) -> list:
    """The policy's target after each prefix of a branch's text (``order``'s entries, then ``end``): a new line
    after the header and after each entry, then a uniform choice over its numbers not done yet (``</`` of the
    branch's end when none is left), the fixed next token elsewhere."""
    out, done = [], set()
    for n in order:
        out += [vocab.newline, tuple(vocab.claim[m] for m in numbers if m not in done)]
        done.add(n)
        out.extend(vocab.entry[n][2:])
    return out + list(end)


def mask(tree_: Tree):
    """``[L, L]`` bool: which token each token reads (the engine's views: isolated branches)."""
    import torch

    part = torch.tensor(tree_.part)
    n = len(part)
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    q, k = part[:, None], part[None, :]
    sees = (k == -1) | (q == k) | (q == -2)
    return causal & sees


def batch(vocab: Vocab, trees: Sequence[Tree], lookup_weight: float = CLAIM_WEIGHT):
    """``(ids [B, L], positions [B, L], mask [B, 1, L, L], target [B, L, V], loss weight [B, L])``; a listed
    number that the goal copies or the conclusion names is weighted ``lookup_weight`` (the lookups are what is
    slow to learn; a first phase with weight 1 plateaued)."""
    import torch

    length = max(len(t.ids) for t in trees)
    b = len(trees)
    listed = set(vocab.item.values())
    ids = torch.full((b, length), vocab.pad, dtype=torch.long)
    pos = torch.zeros(b, length, dtype=torch.long)
    attn = torch.zeros(b, 1, length, length, dtype=torch.bool)
    target = torch.zeros(b, length, vocab.size)
    lmask = torch.zeros(b, length)
    for i, t in enumerate(trees):
        n = len(t.ids)
        ids[i, :n] = torch.tensor(t.ids)
        pos[i, :n] = torch.tensor(t.positions)
        pos[i, n:] = torch.arange(length - n) + max(t.positions) + 1
        attn[i, 0, :n, :n] = mask(t)
        attn[i, 0, n:, :] = torch.ones(length - n, length, dtype=torch.bool).tril(n)  # pads read anything
        for j, tgt in enumerate(t.targets):
            if tgt is not None:
                put_target(target, lmask, i, j, tgt)
                if tgt in listed:  # a number the goal copies or the conclusion reads
                    lmask[i, j] = lookup_weight
    return ids, pos, attn, target, lmask


def examples(vocab: Vocab, seed: int):
    """An endless stream of training trees: 1..28 numbers, branch orders sampled."""
    rng = random.Random(seed)
    tok = build_tokenizer()
    while True:
        k = rng.randint(1, 28)
        task = roman.Task(tuple(rng.sample(range(1, roman.MAX_NUMBER + 1), k)))
        yield tree(vocab, tok, sample_request(task, rng))
