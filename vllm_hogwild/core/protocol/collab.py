"""The collaboration protocol's text in a request, and the answer and transcript of a group. Pure, no vLLM.

Where the ``collab`` protocol's text enters a request (the front end's hooks,
:mod:`vllm_hogwild.serving.requests`, call these; the engine core forces paragraph
prefixes and the finisher, :mod:`vllm_hogwild.core.protocol.driver`):

- **Chat** (``LLM.chat``, ``/v1/chat/completions``): the preamble becomes a
  system message (put in front of the conversation's own system message, if
  any), so the model's chat template renders it; the request remembers it, so
  that the prompt check does not add it twice.
- **Raw prompts** (``LLM.generate``, ``/v1/completions``): the preamble and a
  blank line go in front of the prompt's tokens, after a BOS token if the
  prompt starts with one; a blank line follows the prompt.
- **Both**: the section headers (:data:`vllm_hogwild.core.protocol_text.HEADERS`) are
  appended to the prompt's tokens, the own header last. Their K/V is computed
  with the prompt, once per group; views show the prompt up to the first
  header and reference each header where it belongs. The group's first
  token is sampled after the whole stored prompt; with ``collab`` it is the
  first token of a paragraph prefix, which the engine forces anyway.

The answer: :func:`answer` reads a finished group's final answer from its
``RequestOutput`` (offline) and :func:`answer_of_texts` from its texts; the
server puts the same record in the response (:mod:`vllm_hogwild.serving.responses`).
:func:`transcript` puts the workers' paragraphs back into the order in which they
joined the shared history.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any, Mapping, Sequence

from vllm_hogwild.core import protocol_text
from vllm_hogwild.core.options import PromptTail, RequestOptions

# -- requests -----------------------------------------------------------------


def with_preamble(conversation: Sequence[Mapping[str, Any]], options: RequestOptions, num_workers: int) -> list:
    """The conversation with the collaboration preamble as its (first) system message."""
    text = protocol_text.preamble(num_workers, options.task, options.person)
    messages = [dict(m) for m in conversation]
    if messages and messages[0].get("role") == "system" and isinstance(messages[0].get("content"), str):
        messages[0]["content"] = f"{text}\n\n{messages[0]['content']}"
    else:
        messages.insert(0, {"role": "system", "content": text})
    return messages


def extend_prompt(
    tokenizer, token_ids: Sequence[int], options: RequestOptions, num_workers: int, in_chat: bool
) -> tuple[list[int], PromptTail]:
    """The prompt's tokens with the preamble (raw prompts only) and the section headers."""

    def encode(text: str) -> list[int]:
        return list(tokenizer.encode(text, add_special_tokens=False))

    ids = list(token_ids)
    if not in_chat:
        bos = getattr(tokenizer, "bos_token_id", None)
        head = 1 if ids and bos is not None and ids[0] == bos else 0
        preamble = encode(protocol_text.preamble(num_workers, options.task, options.person) + "\n\n")
        ids = ids[:head] + preamble + ids[head:] + encode("\n\n")
    prompt_end = len(ids)
    ranges = {}
    for name in protocol_text.HEADER_ORDER:
        run = encode(protocol_text.HEADERS[name])
        ranges[name] = (len(ids), len(ids) + len(run))
        ids += run
    return ids, PromptTail(prompt_end, **ranges)


def extended_len(tokenizer, prompt_len: int, options: RequestOptions, num_workers: int, in_chat: bool) -> int:
    """The prompt length :func:`extend_prompt` gives, without the prompt's tokens."""
    ids, _ = extend_prompt(tokenizer, [], options, num_workers, in_chat)
    return prompt_len + len(ids)


# -- the answer ---------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    """A group's final answer: the text, who wrote it, and whether the finisher had to ask for it."""

    text: str
    worker: int
    name: str | None  # the worker's name (named and collab protocols)
    source: str  # "worker", or "finisher" when it follows the finisher's suffix

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def answer_of_texts(texts: Sequence[str], pattern: str, named: bool = True) -> Answer | None:
    """The first worker's (in worker order) first match of ``pattern`` in the group's texts
    (:func:`vllm_hogwild.core.protocol_text.first_match`), with who wrote it and how."""
    found = protocol_text.first_match(texts, pattern)
    if found is None:
        return None
    worker, match = found
    text = texts[worker]
    at = max((text.rfind(s, 0, match.end()) for s in protocol_text.FINISHER_SUFFIX.values()), default=-1)
    name = protocol_text.NAMES[worker] if named and worker < len(protocol_text.NAMES) else None
    return Answer(match.group(1).strip(), worker, name, "finisher" if at >= 0 else "worker")


def answer(output, pattern: str | None = None, task: str = "math") -> Answer | None:
    """The final answer of a finished Hogwild ``RequestOutput`` (one group), or ``None``.

    ``pattern`` is the request's ``answer_pattern``; by default the ``task``'s
    (``math``: ``\\boxed{...}``), as the ``collab`` protocol uses.
    """
    pattern = pattern or protocol_text.DEFAULT_ANSWER_PATTERN[task]
    texts = [c.text for c in sorted(output.outputs, key=lambda c: c.index)]
    return answer_of_texts(texts, pattern)


# -- the transcript -----------------------------------------------------------

def _prefix(worker: int) -> re.Pattern:
    """The paragraph prefix the engine forces for ``worker`` (a model may write other names' prefixes too)."""
    return re.compile(rf"\*\*{protocol_text.NAMES[worker]} \[(\d+)\]:\*\* ")


@dataclass(frozen=True)
class Paragraph:
    """One worker's paragraph of a transcript (the collab protocol's "step", as its prompt calls it)."""

    worker: int
    number: int  # counted from 1, as in the prefix
    text: str  # from its prefix to the next one (or the end)
    joined_at: int  # the token index (the group's engine step) whose feeding moved it into the history


def transcript(pieces: Sequence[Sequence[str]]) -> list[Paragraph]:
    """Every worker's paragraphs in the order they joined the shared history (named and collab protocols).

    Only a worker's own prefix, at a token boundary, starts one of its paragraphs:
    the engine forces nothing else, while a model may write other workers'
    prefixes into its own text.

    ``pieces[w][t]`` is the text of worker ``w``'s ``t``-th token (offline:
    each token of ``CompletionOutput.token_ids`` decoded alone; a server
    stream: each delta). A paragraph of a worker ends where its next paragraph prefix
    starts, and joins once the first token of that prefix has been fed, one
    engine step later; a worker's last paragraph joins when the worker stops.
    Paragraphs that join in the same engine step come in worker order, as in the
    engine.
    """
    paragraphs = []
    for w, toks in enumerate(pieces):
        text = "".join(toks)
        offsets, pos = [], 0
        for t in toks:
            offsets.append(pos)
            pos += len(t)
        starts = [m.start() for m in _prefix(w).finditer(text)]
        token_at = {off: i for i, off in enumerate(offsets)}
        bounds = [s for s in starts if s in token_at] or [0]
        if bounds[0] != 0:
            bounds.insert(0, 0)
        for k, a in enumerate(bounds):
            b = bounds[k + 1] if k + 1 < len(bounds) else len(text)
            joined = token_at[b] if b in token_at and b < len(text) else len(toks)
            m = _prefix(w).match(text, a)
            paragraphs.append(Paragraph(w, int(m.group(1)) if m else 0, text[a:b], joined))
    return sorted(paragraphs, key=lambda s: (s.joined_at, s.worker))


def render_transcript(paragraphs: Sequence[Paragraph]) -> str:
    return "".join(s.text if s.text.endswith("\n") else s.text + "\n\n" for s in paragraphs)

