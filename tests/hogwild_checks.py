"""Checks shared by the engine tests (offline engine, other attention paths, Ray, TP, the collaborators)."""

from __future__ import annotations

import json
import re
from pathlib import Path


def token_texts(tokenizer, tokens: list[int]) -> list[str]:
    """The text each token adds, detokenized incrementally as vLLM does (special tokens skipped; a token that
    ends inside a character adds nothing until the character is complete). From whole-prefix decodes."""
    out, prev = [], ""
    for i in range(len(tokens)):
        text = tokenizer.decode(tokens[: i + 1], skip_special_tokens=True)
        if text.endswith("\ufffd"):
            out.append("")
            continue
        out.append(text[len(prev):])
        prev = text
    return out


def step_ends_for(tokenizer, tokens: list[int], pattern: str) -> list[int]:
    """Token i ends a step iff the pattern matches text that token i completes, since the last end."""
    ends, since = [], ""
    for i, piece in enumerate(token_texts(tokenizer, tokens)):
        before, since = since, since + piece
        if any(m.end() > len(before) for m in re.finditer(pattern, since)):
            ends.append(i)
            since = ""
    return ends


def max_err(got: list[list[float]], expected: list[list[float]]) -> float:
    return max(abs(a - b) for g, e in zip(got, expected) for a, b in zip(g, e))


def training_forward_gaps(model, prompt, outputs, got: list[list[float]]) -> tuple[float, float]:
    """``(training forward, flat pass)``: how far the lock-step training forward's logprobs, and the flat pass's
    over each reader's view, are from ``got`` (an engine's or a server's), for the group of ``prompt`` token ids
    and each worker's ``outputs``."""
    import torch

    from vllm_hogwild.models.lockstep import TrainingGroup, flat_logprobs, group_logprobs

    group = TrainingGroup(tuple(prompt), tuple(map(tuple, outputs)))
    with torch.no_grad():
        exact = group_logprobs(model, group)
        flat = flat_logprobs(model, group)
    return max_err(got, exact), max_err(got, flat)


def check_trained_folder(collaborator, vocab) -> tuple[Path, dict]:
    """A shipped collaborator's folder (``collaborator.model_dir()``) holds the tokenizer its module builds and a
    config of the shape its training record names: ``(folder, config)``."""
    folder = collaborator.model_dir()
    assert json.loads((folder / "tokenizer.json").read_text()) == json.loads(collaborator.build_tokenizer().to_str())
    record = json.loads((folder / "training.json").read_text())
    config = json.loads((folder / "config.json").read_text())
    want = collaborator.model_config(vocab, record["num_layers"], record["hidden"]).to_dict()
    for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "head_dim",
                "max_position_embeddings", "tie_word_embeddings"):
        assert config[key] == want[key], key
    return folder, config


def header_ranges(tokenizer, prompt: list[int]) -> tuple[int, dict[str, tuple[int, int]]]:
    """``(prompt_end, headers)``: where the collab section headers sit at the tail of a stored prompt."""
    from vllm_hogwild.core.protocol_text import HEADER_ORDER, HEADERS

    headers, pos = {}, len(prompt)
    for name in reversed(HEADER_ORDER):
        size = len(tokenizer.encode(HEADERS[name], add_special_tokens=False))
        headers[name], pos = (pos - size, pos), pos - size
    return pos, headers


def collab_errors(oracle, tokenizer, prompt: list[int], tokens: list[list[int]], logprobs: list[list[float]],
                  step_end: str, finisher_worker: int | None = None,
                  finisher_tokens: range = range(0),
                  accept_steps: list[list[int]] | None = None) -> tuple[float, float, list[list[int]]]:
    """``(error, error without the headers, step ends)`` of a collab group's logprobs against the dense oracle.

    Step ends come from the text; text the engine forced (``finisher_tokens`` of the finisher's
    worker: its suffix and greedy tokens) never ends a step (the step end pattern must not occur in
    paragraph prefixes). The view's prompt part ends before the section headers, each header positioned where
    the view puts it.
    """
    ends = [[i for i in step_ends_for(tokenizer, t, step_end) if not (w == finisher_worker and i in finisher_tokens)]
            for w, t in enumerate(tokens)]
    prompt_end, headers = header_ranges(tokenizer, prompt)
    expected = oracle.logprobs(prompt, tokens, layout="combined", step_ends=ends, prompt_end=prompt_end,
                               headers=headers, accept_steps=accept_steps)
    wrong = oracle.logprobs(prompt, tokens, layout="combined", step_ends=ends, accept_steps=accept_steps)
    return max_err(logprobs, expected), max_err(logprobs, wrong), ends
