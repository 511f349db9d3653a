"""The links collaborator: a small Llama trained to share :mod:`vllm_hogwild.tasks.links` tasks with its co-workers.

It is trained on what the engine computes for a Hogwild group in raw mode (``contiguous`` layout): every token's
K/V computed once, in its writer's own view at the step it was written, and read by co-workers at their view
positions (:func:`vllm_hogwild.models.lockstep.group_logits`, teacher forced over whole groups simulated in
lock-step). A co-worker's token written at step ``j`` is read from step ``j + 1``; workers that claim in the same
step collide and both do the item.

The policy it imitates (:func:`policy_target`), for worker ``w``'s next token, from what its view shows:

- find mode, a co-worker's find (``!``) in the view: its end of sequence; after its own find: the same;
- after its claim (a start's letter, ``"\\nb:"``): the start that letter names in the prompt's list;
- inside an entry: the path's next node (the link from its last node, read off the table), or, after the
  terminal, ``;`` (``!`` when the terminal is the one to find);
- between entries: the letter of a start nobody has claimed in the view, uniformly (a soft target over all of
  them), or its end of sequence when every start is claimed.

Nothing tells a worker its index or name: sampling breaks the symmetry (vLLM gives worker ``i`` the seed
``seed + i``). The tokenizer is byte-level BPE with fixed merges: every node is one token, ``" 12"``, and every
terminal ``" A"``; a listed start with its letter, ``" b=12"``, is one token, and a claim, ``"\\nb:"``, is one
token per letter (what a worker reads to know which starts are taken: a claim names one of at most 26 letters,
not one of 149 nodes, which a 4-layer model of width 128 told apart from the nodes of the links table no better
than 0.42 of a claim's probability after 2,500 steps; see ``docs/user_guide.md``); and every link the prompt can
list, ``"\\n12>45"``, is one token, so that
following a link is one attention lookup (the link token whose source is the path's last node) and not two (the
source's token, then the one after it: an induction head, which this 4-layer model did not learn in a thousand
steps on two cores, where it learns the one-token lookup in about six hundred; see ``docs/user_guide.md``). In
training a link token's embedding is the sum of its source's and its end's (:func:`link_parts`), so that what is
learned of one link carries to every other; the shipped weights hold the sums. The weights ship in
``vllm_hogwild/models/links-collaborator``, trained in phases by ``python -m vllm_hogwild.training.train_links``, the
later ones on the engine's own runs of the phase before (:func:`labeled_run`; the phases and their commands are in
``docs/user_guide.md`` and the folder's ``training.json``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Sequence

from vllm_hogwild.tasks import links as L
from vllm_hogwild.models.roman_collaborator import BOS, EOS, PAD, _byte_chars, bpe_tokenizer, write_tokenizer

TEMPERATURE, MIN_P = 1.0, 0.2  # how it is sampled: claims keep their spread, paths their argmax
MODEL_DIR = Path(__file__).resolve().parent / "links-collaborator"
COMMAND = "python -m vllm_hogwild.training.train_links"
MAX_TRAIN_ITEMS = 22  # the largest task training draws (paths)
_HEADS = (L.LINKS_HEAD, f"\n{L.STARTS_HEAD}", f"\n{L.FIND_HEAD}", f"\n{L.PATHS_HEAD}")


def model_dir() -> Path:
    """The folder of the shipped links collaborator (an HF folder vLLM loads as it is)."""
    return MODEL_DIR


@lru_cache(maxsize=1)
def _chars() -> tuple[str, ...]:
    return tuple(_byte_chars())


def _spelled(text: str) -> str:
    """``text`` in byte-level BPE's characters."""
    chars = _chars()
    return "".join(chars[b] for b in text.encode())


def _link_text(source: int, end) -> str:
    return f"\n{source}{L.LINK}{end}"


def _targets() -> list[str]:
    nodes = range(1, L.MAX_NODE + 1)
    links = [_spelled(_link_text(a, b)) for a in nodes for b in (*nodes, *L.TERMINALS)]
    claims = [_spelled(f"\n{letter}:") for letter in L.SLOTS]
    finds = [_spelled(f" {t}.") for t in L.TERMINALS]
    return ([_spelled(f" {n}") for n in nodes] + [_spelled(f" {t}") for t in L.TERMINALS]
            + [_spelled(h) for h in _HEADS] + links + claims + finds)


def _listed() -> list[tuple[str, str]]:
    """A listed start, ``" b=12"`` (its comma a token of its own): its letter's half and its node's half."""
    return [(_spelled(f" {letter}="), _spelled(f"{n}")) for letter in L.SLOTS for n in range(1, L.MAX_NODE + 1)]


@lru_cache(maxsize=1)
def build_tokenizer():
    """The tokenizer (``tokenizers.Tokenizer``): byte-level BPE over the whole text (no pre-split), whose merges
    spell exactly :func:`_targets` and the listed starts (:func:`_listed`, a letter's half joined to a node's)."""
    return bpe_tokenizer(_targets(), split_words=False, joined=_listed())


def save_tokenizer(folder: Path) -> None:
    write_tokenizer(folder, build_tokenizer(), max_len=4096, pretty=False)  # compact: 27,154 tokens and merges


@dataclass(frozen=True)
class LinksVocab:
    """The token ids the task uses."""

    size: int
    bos: int
    eos: int
    pad: int
    node: dict  # node or terminal -> " {node}" (a link's source or end, a start, on a path)
    claim: dict[int, int]  # a start's index in the list -> "\n{letter}:" (an entry's claim)
    path_end: int
    found: int

    @classmethod
    def build(cls, tok=None) -> "LinksVocab":
        tok = tok or build_tokenizer()

        def one(text: str) -> int:
            ids = tok.encode(text, add_special_tokens=False).ids
            if len(ids) != 1:
                raise AssertionError(f"tokenizer: {text!r} is {ids}")
            return ids[0]

        nodes = range(1, L.MAX_NODE + 1)
        node = {n: one(f" {n}") for n in nodes} | {t: one(f" {t}") for t in L.TERMINALS}
        return cls(tok.get_vocab_size(), tok.token_to_id(BOS), tok.token_to_id(EOS), tok.token_to_id(PAD),
                   node, {i: one(f"\n{letter}:") for i, letter in enumerate(L.SLOTS)}, one(L.PATH_END),
                   one(L.FOUND))

    @property
    def tokenizer(self):
        """The tokenizer these ids are of (a collaborator whose vocabulary extends this one's has its own)."""
        return build_tokenizer()

    roles = ("node", "claim", "start", "find")  # what a token of one node or letter stands for (ROLES)

    def role_texts(self, entity) -> dict[str, str]:
        """The tokens that stand for one node or terminal, by role: on a path, and (a terminal) to find."""
        return {"node": f" {entity}"} | ({} if isinstance(entity, int) else {"find": f" {entity}."})

    def link(self, source: int, end) -> int:
        """The token of the link ``source>end``."""
        return self.tokenizer.token_to_id(_spelled(_link_text(source, end)))

    @cached_property
    def index_of_claim(self) -> dict[int, int]:
        return {t: i for i, t in self.claim.items()}

    @cached_property
    def node_of(self) -> dict:
        return {i: n for n, i in self.node.items()}

    def prompt(self, task: L.LinksTask) -> list[int]:
        """The prompt's ids, as vLLM's tokenizer gives :func:`links.prompt` (BOS first)."""
        return [self.bos, *self.tokenizer.encode(task.prompt(), add_special_tokens=False).ids]


# -- the policy ---------------------------------------------------------------------------------------------


@dataclass
class Reader:
    """What the policy reads of a task: each node's link and the starts."""

    task: L.LinksTask
    vocab: LinksVocab

    @cached_property
    def next_of(self) -> dict:
        return {a: b for a, b in self.task.links}

    @cached_property
    def starts(self) -> tuple[int, ...]:
        return self.task.starts


def policy_target(reader: Reader, taken: set, found_by_other: bool, own: Sequence[int]) -> int | tuple[int, ...]:
    """The policy's next token for a worker whose view shows the starts ``taken`` (their indices in the list,
    claimed in any lane it reads, its own included), whether a co-worker's find is in it, and its own tokens
    ``own``: a token id, or a tuple of ids (a uniform choice)."""
    v, task = reader.vocab, reader.task
    if task.mode == "find" and (found_by_other or (own and own[-1] == v.found)):
        return v.eos
    if own and own[-1] not in (v.path_end, v.found):  # inside an entry: its path's next node, or its end
        last = own[-1]
        if last in v.index_of_claim:  # the start its letter names
            return v.node[reader.starts[v.index_of_claim[last]]]
        node = v.node_of[last]
        if isinstance(node, str):  # a terminal
            return v.found if node == task.target else v.path_end
        return v.node[reader.next_of[node]]
    free = tuple(v.claim[i] for i in range(len(reader.starts)) if i not in taken)
    return free or v.eos


def sample(target, rng: random.Random) -> int:
    return rng.choice(target) if isinstance(target, tuple) else target


class Visible:
    """What every view of a lock-step group shows at a step besides the reader's own lane: the starts claimed and
    the finds written before it (a co-worker's token written at step ``j`` is read from step ``j + 1``; the
    reader's own tokens are all before its next one)."""

    def __init__(self, vocab: LinksVocab, num_workers: int) -> None:
        self.vocab, self.taken, self.finders = vocab, set(), set()

    def add(self, worker: int, token: int) -> None:
        if token in self.vocab.index_of_claim:
            self.taken.add(self.vocab.index_of_claim[token])
        elif token == self.vocab.found:
            self.finders.add(worker)

    def found_by_other(self, worker: int) -> bool:
        return bool(self.finders - {worker})


def run_lockstep(num_workers: int, eos: int, max_steps: int, choose, add, done=None) -> list[list[int]]:
    """A group's lock-step run: each worker's output tokens (its end of sequence last, once it stopped). Each step,
    every live worker's token is ``choose(worker, its tokens so far)`` (in worker order, from what the views show
    before the step), then each is written, ``add(worker, token)`` (read from the next step); ``done()``, asked after
    each step, ends the run early (a client's cancel). The links, merges and checking collaborators' policies run
    through this one loop."""
    outputs: list[list[int]] = [[] for _ in range(num_workers)]
    for _ in range(max_steps):
        live = [w for w in range(num_workers) if not outputs[w] or outputs[w][-1] != eos]
        if not live:
            break
        chosen = [choose(w, outputs[w]) for w in live]
        for w, token in zip(live, chosen):  # written this step: read from the next
            outputs[w].append(token)
            add(w, token)
        if done is not None and done():
            break
    return outputs


def simulate(vocab: LinksVocab, task: L.LinksTask, num_workers: int, rng: random.Random, layout: str = "contiguous",
             max_steps: int = 600) -> list[list[int]]:
    """One group's lock-step run of the policy, sampled with ``rng``: each worker's output tokens (its end of
    sequence last, once it stopped). ``isolated``: nobody reads a co-worker."""
    if layout not in ("contiguous", "isolated"):
        raise ValueError("layout: contiguous or isolated")
    reader = Reader(task, vocab)
    shared = Visible(vocab, num_workers)
    own_visible = [Visible(vocab, num_workers) for _ in range(num_workers)]  # isolated: each reads itself only

    def view(w: int) -> Visible:
        return own_visible[w] if layout == "isolated" else shared

    def choose(w: int, own: list[int]) -> int:
        return sample(policy_target(reader, view(w).taken, view(w).found_by_other(w), own), rng)

    return run_lockstep(num_workers, vocab.eos, max_steps, choose, lambda w, token: view(w).add(w, token))


def text_of(vocab: LinksVocab, output: Sequence[int]) -> str:
    return vocab.tokenizer.decode([t for t in output if t != vocab.eos])


# -- training examples: whole groups, every output token labeled ---------------------------------------------------


def draw_size(rng: random.Random, max_items: int = 22) -> int:
    """A training task's paths: 1..``max_items``, the largest 11 seven times in ten (a late letter, ``t``, is in a
    task only when it is that large: drawn uniformly, a model forgot such letters and ended with them free)."""
    return rng.randint(1 if rng.random() < 0.3 else max(1, max_items - 10), max_items)


def draw(rng: random.Random, max_items: int = 22) -> tuple[L.LinksTask, int]:
    """A training task and its group size: :func:`draw_size` paths, either mode, 1..8 workers."""
    mode = rng.choice(L.MODES)
    task = L.make_task(draw_size(rng, max_items), rng.randrange(1 << 62), mode)
    return task, rng.choice((1, 1, 2, 2, 3, 4, 4, 5, 6, 8, 8))


def draw_like(rng: random.Random, task: L.LinksTask, max_items: int = 22) -> L.LinksTask:
    """Another training task of about ``task``'s size, either mode."""
    k = max(1, min(max_items, len(task.paths) + rng.randint(-2, 2)))
    return L.make_task(k, rng.randrange(1 << 62), rng.choice(L.MODES))


def labeled_group(vocab: LinksVocab, task: L.LinksTask, num_workers: int, rng: random.Random):
    """``(lockstep.TrainingGroup, targets)``: a simulated run and, for every worker and output token, the policy's target
    given the view the token was written from (:func:`labeled_run` of the policy's own run)."""
    return labeled_run(vocab, task, simulate(vocab, task, num_workers, rng))


def labeled_run(vocab: LinksVocab, task: L.LinksTask, outputs: Sequence[Sequence[int]]):
    """``(lockstep.TrainingGroup, targets)`` for a group's run the engine sampled (each worker's output tokens,
    token ``j`` written at step ``j``): the policy's target for every token from the view it was written from, or
    ``None`` where the policy has none (the token after a node the table has no link from, or after a letter no
    start has: the worker is already wrong there, and what follows is not taught)."""
    reader, seen = Reader(task, vocab), Visible(vocab, len(outputs))
    return label_lockstep(vocab.prompt(task), outputs, seen,
                          lambda w, own: policy_target(reader, seen.taken, seen.found_by_other(w), own))


def label_lockstep(prompt: Sequence[int], outputs: Sequence[Sequence[int]], seen, target):
    """``(lockstep.TrainingGroup, targets)``: ``target(worker, own tokens)`` for every output token, asked when
    ``seen`` (whose ``add(worker, token)`` takes each step's tokens after the step) shows what the token's view
    showed; ``None`` where it raises ``KeyError`` or ``IndexError`` (the worker is already wrong there)."""
    from vllm_hogwild.models.lockstep import TrainingGroup

    targets = [[] for _ in outputs]
    for j in range(max(len(o) for o in outputs)):
        for w, out in enumerate(outputs):
            if j < len(out):
                try:
                    targets[w].append(target(w, out[:j]))
                except (KeyError, IndexError):
                    targets[w].append(None)
        for w, out in enumerate(outputs):
            if j < len(out):
                seen.add(w, out[j])
    return TrainingGroup(tuple(prompt), tuple(tuple(o) for o in outputs)), targets


def link_parts(vocab: LinksVocab) -> tuple[list[int], list[int], list[int]]:
    """The link tokens, each one's source (0-based: node 1 is 0) and its end (nodes 1.. then the terminals, 0-based):
    what training factors each link token's embedding by."""
    ends = [*range(1, L.MAX_NODE + 1), *L.TERMINALS]
    ids, sources, to = [], [], []
    for a in range(1, L.MAX_NODE + 1):
        for k, b in enumerate(ends):
            ids.append(vocab.link(a, b))
            sources.append(a - 1)
            to.append(k)
    return ids, sources, to


ROLES = LinksVocab.roles  # " 12" or " C" on a path; "\nb:" a claim; " b=12" listed; " C." to find


def role_parts(vocab: LinksVocab) -> tuple[list[int], list[int], list[int]]:
    """Every token that stands for one node or terminal on a path or to find (:data:`ROLES` 0 and 3), its entity
    (nodes 1.. then the terminals, 0-based) and its role: what training factors these tokens' embeddings by (the
    entity's vector plus the role's)."""
    tok = vocab.tokenizer
    entities = [*range(1, L.MAX_NODE + 1), *L.TERMINALS]
    ids, which, roles = [], [], []
    for e, x in enumerate(entities):
        for role, text in vocab.role_texts(x).items():
            ids.append(tok.token_to_id(_spelled(text)))
            which.append(e)
            roles.append(vocab.roles.index(role))
    return ids, which, roles


def letter_parts(vocab: LinksVocab) -> tuple[list[int], list[int], list[int], list[int]]:
    """The tokens that carry a start's letter: the claims (``"\\nb:"``: the letter's vector plus the claim role's)
    and the listed starts (``" b=12"``: the letter's, the node's and the start role's). Returns ``(claim ids, their
    letters, listed ids, their letters)``, letters 0-based; a listed start's node is its entity
    (:func:`listed_nodes`)."""
    tok = vocab.tokenizer
    claims = [vocab.claim[i] for i in range(len(L.SLOTS))]
    listed, letters = [], []
    for i, letter in enumerate(L.SLOTS):
        for n in range(1, L.MAX_NODE + 1):
            listed.append(tok.token_to_id(_spelled(f" {letter}={n}")))
            letters.append(i)
    return claims, list(range(len(L.SLOTS))), listed, letters


def listed_nodes() -> list[int]:
    """The entity (0-based node) of each listed-start token, in :func:`letter_parts`' order."""
    return [n - 1 for _ in L.SLOTS for n in range(1, L.MAX_NODE + 1)]


def model_config(vocab: LinksVocab, num_layers: int = 4, hidden: int = 128):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab.size, hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=num_layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=4096,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, tie_word_embeddings=True,
        initializer_range=0.05, bos_token_id=vocab.bos, eos_token_id=vocab.eos, pad_token_id=vocab.pad,
        dtype="float32",
    )


def make_task(num_items: int, seed: int, mode: str) -> L.LinksTask:
    """A training task (:func:`vllm_hogwild.tasks.links.make_task`; find mode's target the goal)."""
    return L.make_task(num_items, seed, mode)


def task_of_run(record: dict) -> L.LinksTask:
    """A run file's task (:func:`vllm_hogwild.training.train_links.sample_runs`)."""
    return L.LinksTask(tuple(tuple(p) for p in record["paths"]), tuple(record["link_order"]), record["mode"],
                       record["target"])


def run_record(task: L.LinksTask) -> dict:
    return {"paths": task.paths, "link_order": task.link_order, "mode": task.mode, "target": task.target}


Vocab = LinksVocab
