"""The checking collaborator's vocabulary and policy: the links task (:mod:`vllm_hogwild.tasks.links`) with checks of
a co-worker's entry that a reader can see is wrong. No weights ship for it yet.

Its tokenizer is the links collaborator's (:func:`.links_collaborator.build_tokenizer`) with one token more per
letter, the check claim ``"\\nb?"`` (:data:`vllm_hogwild.tasks.links.CHECK`): a check of b's entry, followed by b's
path written again, which replaces b's entries in the checker. The policy it would imitate (:func:`policy_target`),
for a worker's next token, from what its view shows:

- inside an entry or a check: the links collaborator's (the start its letter names, the next node by its link,
  ``;`` after the terminal; find mode ``!`` at the goal);
- between entries: a uniform choice among the starts nobody has claimed in the view; when every start is claimed
  (all mode), a uniform choice among the checks due: a co-worker's finished entry whose path shares a node with
  another start's finished entry or check (paths never share one, so one of the two is wrong) and that nobody has
  claimed to check; else its end of sequence. Find mode checks nothing.

Nothing tells a worker its index. :func:`simulate` runs the policy in lock-step with errors put in (a next node
taken from another path, with a given chance a link): runs of a policy that never errs hold nothing to check.
This is the policy :func:`vllm_hogwild.tasks.links_review.checked_replay` plays on from the engine's runs.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Sequence

from vllm_hogwild.tasks import links as L
from vllm_hogwild.models import links_collaborator as LC
from vllm_hogwild.models.roman_collaborator import bpe_tokenizer, write_tokenizer

TEMPERATURE, MIN_P = LC.TEMPERATURE, LC.MIN_P
MAX_TRAIN_ITEMS = LC.MAX_TRAIN_ITEMS
COMMAND = "python -m vllm_hogwild.training.train_links --collaborator checks"
MODEL_DIR = Path(__file__).resolve().parent / "checks-collaborator"
TABLE_REPEATS = 3  # training's tables: every link listed three times (from the second phase; the first's: twice)
ERROR_RATES = (0.0, 0.003, 0.01, 0.02)  # training's policy runs: the chance a next node is another path's (drawn a batch)
GROUP_SIZES = (1, 2, 2, 3, 4, 4, 4, 5, 6, 8, 8, 8)  # a single worker checks nothing (only a co-worker's entries)


def _check_text(letter: str) -> str:
    return f"\n{letter}{L.CHECK}"


@lru_cache(maxsize=1)
def build_tokenizer():
    """The links collaborator's tokenizer and, merged last, every letter's check claim (``"\\nb?"``)."""
    return bpe_tokenizer(LC._targets() + [LC._spelled(_check_text(x)) for x in L.SLOTS], split_words=False,
                         joined=LC._listed())


def save_tokenizer(folder) -> None:
    write_tokenizer(folder, build_tokenizer(), max_len=4096, pretty=False)


def model_dir() -> Path:
    """Where the checking collaborator's folder goes once trained (an HF folder vLLM loads as it is)."""
    return MODEL_DIR


_spelled = LC._spelled


@dataclass(frozen=True)
class ChecksVocab(LC.LinksVocab):
    """The links collaborator's ids and the check claims."""

    check: dict[int, int]  # a start's index in the list -> "\n{letter}?"

    @classmethod
    def build(cls, tok=None) -> "ChecksVocab":
        tok = tok or build_tokenizer()
        base = LC.LinksVocab.build(tok)
        ids = {}
        for i, letter in enumerate(L.SLOTS):
            got = tok.encode(_check_text(letter), add_special_tokens=False).ids
            if len(got) != 1:
                raise AssertionError(f"tokenizer: {_check_text(letter)!r} is {got}")
            ids[i] = got[0]
        fields = {k: getattr(base, k) for k in ("size", "bos", "eos", "pad", "node", "claim", "path_end", "found")}
        return cls(**fields, check=ids)

    @property
    def tokenizer(self):
        return build_tokenizer()

    roles = LC.LinksVocab.roles + ("check",)  # a check claim "\nb?": its letter's vector plus the check role's

    @cached_property
    def index_of_check(self) -> dict[int, int]:
        return {t: i for i, t in self.check.items()}


class ChecksVisible:
    """What every view of a lock-step group shows at a step besides the reader's own open entry: the starts
    claimed, the checks claimed, every finished entry and check (its lane, its start's index, its nodes) and the
    finds (a co-worker's token written at step ``j`` is read from step ``j + 1``)."""

    def __init__(self, vocab: ChecksVocab, num_workers: int) -> None:
        self.vocab = vocab
        self.taken: set[int] = set()
        self.checking: set[int] = set()
        self.finished: list[tuple[int, int, tuple, bool]] = []  # (lane, index, nodes, a check)
        self.finders: set[int] = set()
        self.open: list[tuple[int, list, bool] | None] = [None] * num_workers

    def add(self, worker: int, token: int) -> None:
        v = self.vocab
        if token in v.index_of_claim or token in v.index_of_check:
            is_check = token in v.index_of_check
            index = v.index_of_check[token] if is_check else v.index_of_claim[token]
            (self.checking if is_check else self.taken).add(index)
            self.open[worker] = (index, [], is_check)
        elif token in (v.path_end, v.found):
            if token == v.found:
                self.finders.add(worker)
            if self.open[worker] is not None:
                index, nodes, is_check = self.open[worker]
                self.finished.append((worker, index, tuple(nodes), is_check))
            self.open[worker] = None
        elif self.open[worker] is not None and token in v.node_of:
            self.open[worker][1].append(v.node_of[token])

    def found_by_other(self, worker: int) -> bool:
        return bool(self.finders - {worker})

    def shared_nodes(self) -> set:
        """The nodes (terminals too) that finished entries or checks of two starts or more pass through: paths
        share none, so one of those entries is wrong."""
        starts_of: dict = {}
        for _, index, nodes, _ in self.finished:
            for node in nodes:
                starts_of.setdefault(node, set()).add(index)
        return {node for node, starts in starts_of.items() if len(starts) > 1}

    def checks_due(self, worker: int) -> list[int]:
        """The starts (indices) whose entry the worker would check: a co-worker's finished entry sharing a node with
        another start's finished entry or check, nobody's check claimed."""
        shared = self.shared_nodes()
        return sorted({index for lane, index, nodes, is_check in self.finished
                       if not is_check and lane != worker and index not in self.checking
                       and any(n in shared for n in nodes)})


def policy_target(reader: LC.Reader, seen: ChecksVisible, worker: int, own: Sequence[int]) -> int | tuple[int, ...]:
    """The policy's next token: a token id, or a tuple of ids (a uniform choice)."""
    v, task = reader.vocab, reader.task
    if task.mode == "find" and (seen.found_by_other(worker) or (own and own[-1] == v.found)):
        return v.eos
    if own and own[-1] not in (v.path_end, v.found):  # inside an entry or a check
        last = own[-1]
        if last in v.index_of_claim or last in v.index_of_check:
            index = v.index_of_claim[last] if last in v.index_of_claim else v.index_of_check[last]
            return v.node[reader.starts[index]]
        node = v.node_of[last]
        if isinstance(node, str):
            return v.found if node == task.target else v.path_end
        return v.node[reader.next_of[node]]
    free = tuple(v.claim[i] for i in range(len(reader.starts)) if i not in seen.taken)
    if free:
        return free
    due = () if task.mode == "find" else tuple(v.check[i] for i in seen.checks_due(worker))
    return due or v.eos


def simulate(vocab: ChecksVocab, task: L.LinksTask, num_workers: int, rng: random.Random, error_rate: float = 0.0,
             max_steps: int = 800) -> list[list[int]]:
    """One group's lock-step run of the policy: each worker's output tokens (its end of sequence last). With
    ``error_rate``, each next node is, with that chance, a node of another path instead (the path then goes on
    from there, as the links collaborator's "joins another path" errors do)."""
    if not 0.0 <= error_rate < 1.0:
        raise ValueError("error_rate: in [0, 1)")
    reader = LC.Reader(task, vocab)
    seen = ChecksVisible(vocab, num_workers)
    others = [[n for j, p in enumerate(task.paths) if j != i for n in p[1:]] for i in range(len(task.paths))]

    def choose(w: int, own: list[int]) -> int:
        token = LC.sample(policy_target(reader, seen, w, own), rng)
        open_ = seen.open[w]
        if (error_rate and open_ is not None and open_[1] and token in vocab.node_of
                and others[open_[0]] and rng.random() < error_rate):
            token = vocab.node[rng.choice(others[open_[0]])]
        return token

    return LC.run_lockstep(num_workers, vocab.eos, max_steps, choose, seen.add)


def labeled_run(vocab: ChecksVocab, task: L.LinksTask, outputs: Sequence[Sequence[int]]):
    """``(lockstep.TrainingGroup, targets)``: the policy's target for every token of a group's run from the view
    it was written from (``None`` where the worker is already wrong)."""
    reader, seen = LC.Reader(task, vocab), ChecksVisible(vocab, len(outputs))
    return LC.label_lockstep(vocab.prompt(task), outputs, seen, lambda w, own: policy_target(reader, seen, w, own))


def text_of(vocab: ChecksVocab, output: Sequence[int]) -> str:
    return LC.text_of(vocab, output)


# -- what the trainer (:mod:`vllm_hogwild.training.train_links`, ``--collaborator checks``) draws -------------------

Vocab = ChecksVocab
model_config = LC.model_config
draw_size = LC.draw_size
task_of_run = LC.task_of_run  # a run file's link order holds its repeats


def make_task(num_items: int, seed: int, mode: str) -> L.LinksTask:
    """A training task: the links task with its table listed :data:`TABLE_REPEATS` times."""
    return L.make_task(num_items, seed, mode, TABLE_REPEATS)


def run_record(task: L.LinksTask) -> dict:
    return LC.run_record(task) | {"repeats": task.repeats}


def draw(rng: random.Random, max_items: int = MAX_TRAIN_ITEMS) -> tuple[L.LinksTask, int]:
    """A training task and its group size: :func:`draw_size` paths, all mode three times in four (find mode checks
    nothing), :data:`GROUP_SIZES` workers."""
    mode = "all" if rng.random() < 0.75 else "find"
    return make_task(draw_size(rng, max_items), rng.randrange(1 << 62), mode), rng.choice(GROUP_SIZES)


def draw_like(rng: random.Random, task: L.LinksTask, max_items: int = MAX_TRAIN_ITEMS) -> L.LinksTask:
    """Another training task of about ``task``'s size and its mode."""
    k = max(1, min(max_items, len(task.paths) + rng.randint(-2, 2)))
    return make_task(k, rng.randrange(1 << 62), task.mode)


def labeled_group(vocab: ChecksVocab, task: L.LinksTask, num_workers: int, rng: random.Random):
    """``(lockstep.TrainingGroup, targets)``: a lock-step run of the policy with errors put in (a chance from
    :data:`ERROR_RATES`), every token labeled with the policy's target from its view (an error's own token with
    the node it should have been; what follows an error on its path is the path it joined, as the engine's
    errors go on)."""
    outputs = simulate(vocab, task, num_workers, rng, error_rate=rng.choice(ERROR_RATES))
    return labeled_run(vocab, task, outputs)


def check_parts(vocab: ChecksVocab) -> tuple[list[int], list[int]]:
    """The check claims and their letters (0-based): what training factors their rows by (the letter's vector plus
    the check role's)."""
    return [vocab.check[i] for i in range(len(L.SLOTS))], list(range(len(L.SLOTS)))
