"""The merges collaborator: a small Llama trained to share :mod:`vllm_hogwild.tasks.merges` tasks with its co-workers
and to finish a path by reference where a co-worker's path already went on.

Trained as the links collaborator is (:mod:`.links_collaborator`: raw mode, ``contiguous`` layout, every token's
K/V in its writer's view, :func:`vllm_hogwild.models.lockstep.group_logits`), on its tokenizer extended by two
kinds of token:

- a **reference** ``" 7="``: the node and the task's :data:`~vllm_hogwild.tasks.merges.REFERENCE` as one token
  (the text, and so the checker, are the merges task's). The decision is made where the node is written, one
  token earlier than a separate ``=`` would be: the link from the path's last node names the node (a lookup in
  the prompt, as the links collaborator learned), and whether some entry in the view has written it is a second
  lookup of that node's token among the lanes. A separate ``=`` would ask the model, after writing the node, to
  tell the token it just wrote from another occurrence of it: an induction-like match that a 4-layer model did
  not learn on the links task (``docs/user_guide.md``);
- a **count** ``"\\nFind: 3"`` (find mode): how many starts reach the goal, one token (the line's ``" to Z."``
  are tokens of their own).

The policy it imitates (:func:`policy_target`), for a worker's next token, from what its view shows:

- after a claim: the start; after a node: the next node by its link, or that node's reference when some lane in
  the view has written that node as a node (it goes on past it there: every path through a node goes on the same
  way); after a terminal: ``;`` (``!`` the goal in find mode);
- between entries: a uniform choice among the starts nobody has claimed in the view, or its end of sequence.

Find mode counts nothing: the workers go on as in all mode, and the group ends when its client cancels it, in the
step after the entries hold every start the prompt's count names (:func:`vllm_hogwild.tasks.merges.written_finds`,
read from the texts alone), as the split with cancel's client does. Whether an entry that ends by reference reaches
the goal is the end of the entry it refers to, which may itself end by reference or be unwritten yet: a chain of
lookups the phases that asked the model to count (phases 1 to 5) did not teach it, so their groups ended early
(``docs/user_guide.md``).

The baselines (:mod:`vllm_hogwild.tasks.merges_policy`) write references the same way, a token each.

The weights ship in ``vllm_hogwild/models/merges-collaborator``, trained in phases from the links collaborator by
``python -m vllm_hogwild.training.train_links --collaborator merges``: whether a reference is due was learned only
once one head was asked to look at the written node (``--presence``, :mod:`vllm_hogwild.training.presence`); the
later phases train on the engine's own runs as well (the phases, their commands and what each could do after are
in ``docs/user_guide.md`` and the folder's ``training.json``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Sequence

from vllm_hogwild.tasks import links as L
from vllm_hogwild.tasks import merges as M
from vllm_hogwild.models import links_collaborator as LC
from vllm_hogwild.models.roman_collaborator import bpe_tokenizer, write_tokenizer

TEMPERATURE, MIN_P = LC.TEMPERATURE, LC.MIN_P
MODEL_DIR = Path(__file__).resolve().parent / "merges-collaborator"
COMMAND = "python -m vllm_hogwild.training.train_links --collaborator merges"
MAX_TRAIN_ITEMS = 24  # the largest task training draws (starts)


def model_dir() -> Path:
    """The folder of the shipped merges collaborator (an HF folder vLLM loads as it is)."""
    return MODEL_DIR


def _reference_text(node: int) -> str:
    return f" {node}{M.REFERENCE}"


@lru_cache(maxsize=1)
def build_tokenizer():
    """The links collaborator's tokenizer (:func:`.links_collaborator.build_tokenizer`) and, merged last, every
    node's reference (``" 7"`` then ``"="``) and every count (``"\\nFind:"`` then ``" 3"``)."""
    spelled = LC._spelled
    references = [spelled(_reference_text(n)) for n in range(1, L.MAX_NODE + 1)]
    counts = [(spelled(f"\n{L.FIND_HEAD}"), spelled(f" {k}")) for k in range(1, M.MAX_ITEMS + 1)]
    return bpe_tokenizer(LC._targets() + references, split_words=False, joined=LC._listed() + counts)


def save_tokenizer(folder: Path) -> None:
    write_tokenizer(folder, build_tokenizer(), max_len=4096, pretty=False)


@dataclass(frozen=True)
class MergesVocab(LC.LinksVocab):
    """The links collaborator's ids and the references and counts."""

    reference: dict  # node -> " {node}="
    count: dict  # starts reaching the goal -> "\nFind: {k}"

    @classmethod
    def build(cls, tok=None) -> "MergesVocab":
        tok = tok or build_tokenizer()
        base = LC.LinksVocab.build(tok)

        def one(text: str) -> int:
            ids = tok.encode(text, add_special_tokens=False).ids
            if len(ids) != 1:
                raise AssertionError(f"tokenizer: {text!r} is {ids}")
            return ids[0]

        fields = {k: getattr(base, k) for k in ("size", "bos", "eos", "pad", "node", "claim", "path_end", "found")}
        return cls(**fields, reference={n: one(_reference_text(n)) for n in range(1, L.MAX_NODE + 1)},
                   count={k: one(f"\n{L.FIND_HEAD} {k}") for k in range(1, M.MAX_ITEMS + 1)})

    @property
    def tokenizer(self):
        return build_tokenizer()

    roles = LC.LinksVocab.roles + ("reference",)

    def role_texts(self, entity) -> dict[str, str]:
        return super().role_texts(entity) | ({"reference": _reference_text(entity)} if isinstance(entity, int) else {})

    @cached_property
    def node_of_reference(self) -> dict[int, int]:
        return {i: n for n, i in self.reference.items()}

    @cached_property
    def ends(self) -> frozenset:
        """The tokens that end an entry: ``;``, ``!`` and every reference."""
        return frozenset((self.path_end, self.found, *self.reference.values()))


# -- the policy ---------------------------------------------------------------------------------------------


@dataclass
class MergesReader:
    """What the policy reads of a task: each node's link, the starts, and (find) how many reach the goal."""

    task: M.MergesTask
    vocab: MergesVocab

    @cached_property
    def next_of(self) -> dict:
        return dict(self.task.links)

    @cached_property
    def starts(self) -> tuple[int, ...]:
        return self.task.starts

    @cached_property
    def to_find(self) -> int | None:
        return len(self.task.answer) if self.task.mode == "find" else None


class MergesVisible:
    """What every view of a lock-step group shows at a step besides the reader's own open entry: the starts
    claimed, the nodes written as nodes (each goes on past there), and the finished entries of starts that reach
    the goal (a co-worker's token written at step ``j`` is read from step ``j + 1``)."""

    def __init__(self, reader: MergesReader, num_workers: int) -> None:
        self.reader, self.vocab = reader, reader.vocab
        self.taken: set[int] = set()
        self.written: set[int] = set()
        self.found: set[int] = set()
        self.open: list[int | None] = [None] * num_workers  # each lane's open entry (its start's index)

    def add(self, worker: int, token: int) -> None:
        v = self.vocab
        if token in v.index_of_claim:
            self.taken.add(v.index_of_claim[token])
            self.open[worker] = v.index_of_claim[token]
        elif token in v.ends:
            index, self.open[worker] = self.open[worker], None
            if (index is not None and index < len(self.reader.task.paths)
                    and self.reader.task.paths[index][-1] == L.GOAL and self.reader.to_find is not None):
                self.found.add(index)
        elif isinstance(v.node_of.get(token), int):
            self.written.add(v.node_of[token])


def policy_target(reader: MergesReader, seen: MergesVisible, own: Sequence[int]) -> int | tuple[int, ...]:
    """The policy's next token for a worker whose view shows ``seen`` and its own tokens ``own``: a token id, or a
    tuple of ids (a uniform choice)."""
    v = reader.vocab
    if own and own[-1] not in v.ends:  # inside an entry
        last = own[-1]
        if last in v.index_of_claim:
            return v.node[reader.starts[v.index_of_claim[last]]]
        node = v.node_of[last]
        if isinstance(node, str):  # a terminal
            return v.found if reader.to_find is not None and node == L.GOAL else v.path_end
        nxt = reader.next_of[node]
        if isinstance(nxt, int) and nxt in seen.written:
            return v.reference[nxt]
        return v.node[nxt]
    free = tuple(v.claim[i] for i in range(len(reader.starts)) if i not in seen.taken)
    return free or v.eos


def simulate(vocab: MergesVocab, task: M.MergesTask, num_workers: int, rng: random.Random,
             layout: str = "contiguous", max_steps: int = 1200) -> list[list[int]]:
    """One group's lock-step run of the policy, sampled with ``rng``: each worker's output tokens (its end of
    sequence last; find mode: cut where the client cancels the group). ``isolated``: nobody reads a co-worker."""
    if layout not in ("contiguous", "isolated"):
        raise ValueError("layout: contiguous or isolated")
    reader = MergesReader(task, vocab)
    shared = MergesVisible(reader, num_workers)
    own = [MergesVisible(reader, num_workers) for _ in range(num_workers)]
    everyone = MergesVisible(reader, num_workers)  # every lane: what the cancelling client reads

    def view(w: int) -> MergesVisible:
        return own[w] if layout == "isolated" else shared

    def add(w: int, token: int) -> None:
        view(w).add(w, token)
        everyone.add(w, token)

    def cancelled() -> bool:  # find mode: the client cancels the group once the texts hold the count's finds
        return reader.to_find is not None and len(everyone.found) >= reader.to_find

    return LC.run_lockstep(num_workers, vocab.eos, max_steps,
                           lambda w, mine: LC.sample(policy_target(reader, view(w), mine), rng), add, cancelled)


def text_of(vocab: MergesVocab, output: Sequence[int]) -> str:
    return LC.text_of(vocab, output)


# -- training examples ----------------------------------------------------------------------------------------


def draw_size(rng: random.Random, max_items: int = MAX_TRAIN_ITEMS) -> int:
    """A training task's starts: as :func:`.links_collaborator.draw_size` draws a links task's paths."""
    return LC.draw_size(rng, max_items)


def make_task(num_items: int, seed: int, mode: str) -> M.MergesTask:
    return M.make_task(num_items, seed, mode)


def draw(rng: random.Random, max_items: int = MAX_TRAIN_ITEMS) -> tuple[M.MergesTask, int]:
    task = M.make_task(draw_size(rng, max_items), rng.randrange(1 << 62), rng.choice(M.MODES))
    return task, rng.choice((1, 1, 2, 2, 3, 4, 4, 5, 6, 8, 8))


def draw_like(rng: random.Random, task: M.MergesTask, max_items: int = MAX_TRAIN_ITEMS) -> M.MergesTask:
    k = max(1, min(max_items, len(task.paths) + rng.randint(-2, 2)))
    return M.make_task(k, rng.randrange(1 << 62), rng.choice(M.MODES))


def labeled_group(vocab: MergesVocab, task: M.MergesTask, num_workers: int, rng: random.Random):
    return labeled_run(vocab, task, simulate(vocab, task, num_workers, rng))


def labeled_run(vocab: MergesVocab, task: M.MergesTask, outputs: Sequence[Sequence[int]]):
    """``(lockstep.TrainingGroup, targets)``: the policy's target for every token of a group's run from the view
    it was written from (``None`` where the worker is already wrong)."""
    reader = MergesReader(task, vocab)
    seen = MergesVisible(reader, len(outputs))
    return LC.label_lockstep(vocab.prompt(task), outputs, seen, lambda w, own: policy_target(reader, seen, own))


def task_of_run(record: dict) -> M.MergesTask:
    """A run file's task (:func:`vllm_hogwild.training.train_links.sample_runs`)."""
    return M.MergesTask(tuple(tuple(p) for p in record["paths"]), tuple(record["link_order"]), record["mode"])


def run_record(task: M.MergesTask) -> dict:
    return {"paths": task.paths, "link_order": task.link_order, "mode": task.mode}


link_parts, role_parts, letter_parts, listed_nodes = LC.link_parts, LC.role_parts, LC.letter_parts, LC.listed_nodes
model_config = LC.model_config
_spelled = LC._spelled
Vocab = MergesVocab
