"""The collaborator: a small Llama trained to share a Roman-numerals task with its co-workers.

What it is trained on is what the engine shows each worker of a Hogwild group
in raw mode: the layout's view (``contiguous``, or ``interleaved`` with
``step_end=";"``), built by the engine's own view code
(:func:`vllm_hogwild.core.views.spans.build_views`, :class:`vllm_hogwild.core.protocol.paragraphs.ParagraphTracker`)
for trajectories simulated in lock-step, with the positions the engine gives
(view positions follow one another from 0). A co-worker's token k is visible
from engine step k+1, so workers that claim in the same step collide.

The policy it imitates, at every position of a view (the position's prefix is
all it may use, as the model's causal attention):

- after ``Answers:`` or after an entry's ``;``: a new line;
- after that new line: one of the prompt's numbers that no entry in the prefix
  has claimed, uniformly (a soft target over all of them), or its end of
  sequence when every number is claimed. Ending is one choice in the same
  softmax as the claims (a number left outbids it), not a decision of its own;
- inside an entry: the entry's next token (`` =``, the numeral's letters, ``;``).

What breaks the workers' symmetry is sampling: vLLM gives worker i the seed
``seed + i``, so workers that read the same view draw different numbers. Two
workers that claim in the same step both do the number (a duplicated item).

The tokenizer is byte-level BPE with fixed merges (no training): every number
1..99 after a space is one token (the prompt's list), every number 1..99 at
the start of a line another (an entry's claim), a numeral is its first letter
after a space then one token per letter. That a claim and a listed number are
different tokens is what lets a small model learn quickly which numbers are
left: the listed ones, less the claimed ones, each a kind of token it can
attend to. The weights ship in ``vllm_hogwild/models/collaborator``
(:func:`model_dir`); ``python -m vllm_hogwild.training.train`` rebuilds them.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Sequence

from vllm_hogwild.tasks import roman
from vllm_hogwild.core.protocol.paragraphs import ParagraphTracker
from vllm_hogwild.core.views.spans import build_views

BOS, EOS, PAD = "<s>", "</s>", "<pad>"
TEMPERATURE, MIN_P = 1.0, 0.2  # how the collaborator is sampled: the claims keep their spread, numerals their argmax
TRAIN_LAYOUTS = ("contiguous", "interleaved")
STEP_END = ";"  # each entry is a paragraph of the layouts with a shared history
MODEL_DIR = Path(__file__).resolve().parent / "collaborator"
CHAT_TEMPLATE = "{{ bos_token }}{% for message in messages %}{{ message['content'] }}{% endfor %}"
# Words the prompt uses whole (anything else still encodes, byte by byte).
_WORDS = ("Roman", "Ġnumerals", "Answers", "ĠAnswers", "Ġ=", "ĠI", "ĠV", "ĠX", "ĠL",
          "</", "Goal", "Outline", "Path", "Conclusion", "Parallel", "First")  # the last line: fork/join's tags


def model_dir() -> Path:
    """The folder of the shipped collaborator (an HF folder vLLM loads as it is). The same model serves Hogwild
    groups (this module) and fork/join requests (:mod:`vllm_hogwild.models.collaborator_forkjoin`)."""
    return MODEL_DIR


# -- tokenizer ----------------------------------------------------------------------------------------------


def _byte_chars() -> list[str]:
    """GPT-2's byte-to-unicode table: the 256 characters byte-level BPE spells bytes with."""
    visible = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(
        range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in visible:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def _targets() -> list[str]:
    # Numbers after a space first: their merges must outrank those of numbers alone ("Ġ12" is
    # ("Ġ", "1") then ("Ġ1", "2"); ("1", "2") ranked first would leave "Ġ" and "12").
    return [f"Ġ{n}" for n in range(100)] + [str(n) for n in range(100)] + list(_WORDS)


@lru_cache(maxsize=1)
def build_tokenizer():
    """The tokenizer (``tokenizers.Tokenizer``): byte-level BPE whose merges spell exactly :func:`_targets`."""
    return bpe_tokenizer(_targets())


def bpe_tokenizer(targets, split_words: bool = True, joined=()):
    """Byte-level BPE whose merges spell exactly ``targets`` (in byte-level characters), each built left to right:
    (prefix, next character). ``joined``: pairs ``(left, right)`` whose concatenation is a token too, merged from
    the two halves (each built left to right, after every target: a text the targets spell keeps its tokens), so
    that ``m`` lefts and ``n`` rights cost about ``m * n`` tokens and not a chain of prefixes each. ``split_words``:
    the usual pre-split into words; without it merges span the whole text (a token may start with a new line). BOS
    first when encoding with special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    vocab = {BOS: 0, EOS: 1, PAD: 2}
    for ch in _byte_chars():
        vocab[ch] = len(vocab)
    merges = []

    def spell(target: str) -> None:
        for i in range(2, len(target) + 1):
            piece = target[:i]
            if piece not in vocab:
                merges.append((target[:i - 1], target[i - 1]))
                vocab[piece] = len(vocab)

    for target in targets:
        spell(target)
    for left, right in joined:
        spell(left)
        spell(right)
    for left, right in joined:
        if left + right not in vocab:
            merges.append((left, right))
            vocab[left + right] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = (pre_tokenizers.ByteLevel(add_prefix_space=False) if split_words
                         else pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([BOS, EOS, PAD])
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", special_tokens=[(BOS, 0)])
    return tok


def save_tokenizer(folder: Path) -> None:
    write_tokenizer(folder, build_tokenizer(), max_len=2048)


def write_tokenizer(folder: Path, tok, max_len: int, pretty: bool = True) -> None:
    """``tokenizer.json`` and a ``tokenizer_config.json`` vLLM and transformers load as they are."""
    tok.save(str(folder / "tokenizer.json"), pretty=pretty)
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": BOS, "eos_token": EOS, "pad_token": PAD,
        "model_max_length": max_len, "clean_up_tokenization_spaces": False, "chat_template": CHAT_TEMPLATE,
    }, indent=1) + "\n")


@dataclass(frozen=True)
class Vocab:
    """The token ids the task uses."""

    size: int
    bos: int
    eos: int
    pad: int
    item: dict[int, int]  # number -> id of " {number}" (the prompt's list)
    claim: dict[int, int]  # number -> id of "{number}" at a line's start (an entry's claim)
    entry: dict[int, tuple[int, ...]]  # number -> ids of "\n{number} = {numeral};"
    newline: int
    prompt_head: tuple[int, ...]  # BOS "Roman numerals:" (then the items)
    answer_head: tuple[int, ...]  # "\nAnswers:"

    @classmethod
    def build(cls, tok=None) -> "Vocab":
        tok = tok or build_tokenizer()

        def ids(text: str) -> tuple[int, ...]:
            return tuple(tok.encode(text, add_special_tokens=False).ids)

        numbers = range(1, roman.MAX_NUMBER + 1)
        item = {n: ids(f" {n}")[0] for n in numbers}
        entry = {n: ids(roman.entry(n)) for n in numbers}
        newline = ids("\n")[0]
        claim = {n: entry[n][1] for n in numbers}
        for n, e in entry.items():
            if e[0] != newline or len(e) != 4 + len(roman.to_roman(n)) or len(set(claim.values())) != len(claim):
                raise AssertionError(f"tokenizer: entry {n} is {e}")
        return cls(tok.get_vocab_size(), tok.token_to_id(BOS), tok.token_to_id(EOS), tok.token_to_id(PAD), item,
                   claim, entry, newline, (tok.token_to_id(BOS), *ids(roman.PROMPT_HEAD)),
                   ids("\n" + roman.ANSWER_HEAD))

    @cached_property
    def number_of(self) -> dict[int, int]:
        """A claim's token id -> its number."""
        return {i: n for n, i in self.claim.items()}

    def prompt(self, task: roman.Task) -> list[int]:
        """The prompt's ids: what vLLM's tokenizer gives :func:`roman.prompt` (BOS first)."""
        return [*self.prompt_head, *(self.item[n] for n in task.items), *self.answer_head]


# -- the policy ---------------------------------------------------------------------------------------------


END_RULES = ("in-claim", "after-entry")  # where the policy ends: see policy_targets


def policy_targets(vocab: Vocab, task: roman.Task, generated: Sequence[int],
                   end_rule: str = "in-claim") -> list[int | tuple[int, ...]]:
    """The policy's target after every prefix ``[prompt][generated[:i]]``, for i = 0..len(generated).

    Each target is a token id, or a tuple of ids (a uniform choice over the
    unclaimed numbers' claim tokens). ``generated`` is a view's text after the
    prompt: any lanes' text one after another, as the view lays it.
    ``end_rule``: ``in-claim`` (the shipped model's) ends where a claim would
    come, when none is left; ``after-entry`` ends instead of the new line
    (the rule of the first two training phases, see ``training.json``).
    """
    claimed = set()
    current, at = None, 0  # the entry being written (None: between entries) and the index of its next token

    def between():  # after "Answers:" or ";"
        if end_rule == "after-entry" and all(n in claimed for n in task.items):
            return vocab.eos
        return vocab.newline

    out = [between()]
    for token in generated:
        number = vocab.number_of.get(token)
        if number is not None:  # a claim (claim tokens appear only where an entry starts)
            claimed.add(number)
            current, at = number, 2
        elif token == vocab.newline:
            current, at = None, 1  # a new entry: its claim is next
        elif current is not None:
            at += 1
            if at >= len(vocab.entry[current]):
                current, at = None, 0
        if current is None and at == 1:  # a claim, or the end when every listed number is claimed
            out.append(tuple(vocab.claim[n] for n in task.items if n not in claimed) or (vocab.eos,))
        elif current is None:
            out.append(between())
        else:
            out.append(vocab.entry[current][at])
    return out


def sample_target(target, rng: random.Random) -> int:
    return rng.choice(target) if isinstance(target, tuple) else target


# -- lock-step simulation with the engine's views --------------------------------------------------------------


@dataclass
class Trajectory:
    task: roman.Task
    layout: str
    prompt: list[int]
    outputs: list[list[int]]  # each worker's sampled tokens (its end of sequence last, once it stopped)
    views: list[list[tuple[int, list[int]]]]  # views[step] = [(worker, the view's tokens)] of the live workers

    @property
    def num_steps(self) -> int:
        return max(len(o) for o in self.outputs)


def simulate(vocab: Vocab, task: roman.Task, num_workers: int, layout: str, rng: random.Random,
             act=None, max_steps: int = 400, keep_views: bool = True, end_rule: str = "in-claim") -> Trajectory:
    """One group's lock-step run; ``act(views) -> tokens`` picks the workers' next tokens (default: the
    policy, sampled with ``rng``). Views are the engine's (raw protocol; ``step_end=';'``)."""
    if layout not in (*TRAIN_LAYOUTS, "isolated"):
        raise ValueError(f"layout: one of {(*TRAIN_LAYOUTS, 'isolated')}")
    prompt = vocab.prompt(task)
    p = len(prompt)
    outputs: list[list[int]] = [[] for _ in range(num_workers)]
    stopped: list[int | None] = [None] * num_workers  # tokens fed before its end of sequence
    tracker = ParagraphTracker(num_workers, p, STEP_END) if layout == "interleaved" else None
    decode = build_tokenizer().decode if tracker is not None else None
    all_views = []
    for step in range(max_steps):
        live = [w for w in range(num_workers) if stopped[w] is None]
        if not live:
            break
        lens = [p + (step if stopped[w] is None else stopped[w]) for w in range(num_workers)]
        kwargs = {}
        if tracker is not None:
            if tracker.pending:
                tracker.join(lens)
            kwargs = {"history": tracker.history, "paragraph_starts": tracker.paragraph_starts}
        views = build_views(layout, p, lens, readers=live, **kwargs)
        lanes = [prompt + o for o in outputs]
        tokens = [[lanes[s.lane][i] for s in v.spans for i in range(s.start, s.end)] for v in views]
        if keep_views:
            all_views.append(list(zip(live, tokens)))
        if act is None:
            chosen = [sample_target(policy_targets(vocab, task, t[p:], end_rule)[-1], rng) for t in tokens]
        else:
            chosen = act(tokens)
        for w, token in zip(live, chosen):
            outputs[w].append(token)
            if token == vocab.eos:
                stopped[w] = step
                if tracker is not None:
                    tracker.stop(w, p + step)
            elif tracker is not None:
                tracker.on_sampled(w, p + step, decode([token]))
    return Trajectory(task, layout, prompt, outputs, all_views)


def texts_of(vocab: Vocab, trajectory: Trajectory) -> list[str]:
    decode = build_tokenizer().decode
    return [decode([t for t in o if t != vocab.eos]) for o in trajectory.outputs]


# -- training examples ----------------------------------------------------------------------------------------


def random_example_source(seed: int):
    """Draws ``(task, num_workers, layout)`` for training: 1..28 numbers, 1..8 workers."""
    rng = random.Random(seed)

    def draw():
        k = rng.randint(1, 28)
        task = roman.Task(tuple(rng.sample(range(1, roman.MAX_NUMBER + 1), k)))
        n = rng.choice((1, 1, 2, 2, 3, 4, 4, 5, 6, 8))
        layout = "interleaved" if n > 1 and rng.random() < 0.3 else "contiguous"
        return task, n, layout
    return rng, draw


def examples(vocab: Vocab, seed: int, views_per_run: int = 3, end_rule: str = "in-claim"):
    """An endless stream of ``(tokens, prompt_len, targets)``: views of simulated runs, every position after the
    prompt's last token labeled with the policy's target for its prefix."""
    rng, draw = random_example_source(seed)
    while True:
        task, n, layout = draw()
        run = simulate(vocab, task, n, layout, rng, end_rule=end_rule)
        flat = [(s, w, t) for s, step in enumerate(run.views) for w, t in step]
        for _ in range(views_per_run):
            _, _, tokens = rng.choice(flat)
            p = len(run.prompt)
            yield tokens, p, policy_targets(vocab, task, tokens[p:], end_rule)


CLAIM_WEIGHT = 4.0  # a claim's loss counts this many times a fixed token's: the numerals are learned long before


def batch(vocab: Vocab, items: Sequence[tuple[list[int], int, list]]):
    """``(input_ids [B, L], target [B, L, V], loss weight [B, L])``: float targets, soft at claims."""
    import torch

    length = max(len(t) for t, _, _ in items)
    ids = torch.full((len(items), length), vocab.pad, dtype=torch.long)
    target = torch.zeros(len(items), length, vocab.size)
    mask = torch.zeros(len(items), length)
    for b, (tokens, p, targets) in enumerate(items):
        ids[b, :len(tokens)] = torch.tensor(tokens)
        for i, tgt in enumerate(targets):  # targets[i] follows position p - 1 + i
            pos = p - 1 + i
            if pos >= len(tokens):
                break
            put_target(target, mask, b, pos, tgt)
    return ids, target, mask


def put_target(target, weight, b: int, pos: int, tgt) -> None:
    """Row ``b``'s target at ``pos``: one token, or a uniform choice (a tuple) weighted :data:`CLAIM_WEIGHT`."""
    if isinstance(tgt, tuple):
        target[b, pos, list(tgt)] = 1.0 / len(tgt)
        weight[b, pos] = CLAIM_WEIGHT
    else:
        target[b, pos, tgt] = 1.0
        weight[b, pos] = 1.0


def model_config(vocab: Vocab, num_layers: int = 4, hidden: int = 128):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab.size, hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=num_layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=2048,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, tie_word_embeddings=True,
        initializer_range=0.05, bos_token_id=vocab.bos, eos_token_id=vocab.eos, pad_token_id=vocab.pad,
        dtype="float32",
    )
