"""A Hogwild group's final answer in the OpenAI server's responses.

For a request with an answer pattern (the ``collab`` protocol, or
``hogwild_answer_pattern``) both routes add one field, ``hogwild``:

- a whole response: ``{"id": ..., "choices": [...], "usage": ..., "hogwild": {...}}``;
- a stream: one last event before ``data: [DONE]``, with no choices and the
  same field (after vLLM's usage event, when the client asked for usage).

The field is ``{"answer": "42", "worker": 1, "name": "Bob", "source":
"worker"}``: the answer, the worker that wrote it (its choice index), its name
and whether it came from that worker's own steps (``worker``) or from the
finisher (``finisher``). ``answer`` and the rest are ``null`` when no worker
wrote one. The stock ``openai`` client exposes it as ``response.hogwild`` (a
dict, from ``model_extra``).
"""

from __future__ import annotations

import json
from typing import Any, AsyncIterator

from vllm_hogwild.core.protocol.collab import answer_of_texts
from vllm_hogwild.core.options import NAMED_PROTOCOLS, RequestOptions

FIELD = "hogwild"
NO_ANSWER = {"answer": None, "worker": None, "name": None, "source": None}


def answer_field(texts: list[str], pattern: str, named: bool) -> dict[str, Any]:
    found = answer_of_texts(texts, pattern, named=named)
    if found is None:
        return dict(NO_ANSWER)
    return {"answer": found.text, "worker": found.worker, "name": found.name, "source": found.source}


def with_answer(options: RequestOptions | None, result):
    """``result`` of ``create_completion`` / ``create_chat_completion`` with the answer field added.

    ``options``: the request's Hogwild options (``None``: not a Hogwild request).
    """
    if options is None or options.answer_pattern is None:
        return result
    named = options.protocol in NAMED_PROTOCOLS
    choices = getattr(result, "choices", None)
    if choices is not None:  # a whole response
        texts = [_choice_text(c) for c in sorted(choices, key=lambda c: c.index)]
        setattr(result, FIELD, answer_field(texts, options.answer_pattern, named))
        return result
    if hasattr(result, "__aiter__"):  # a stream of SSE events
        return _stream_with_answer(result, options.answer_pattern, named)
    return result  # an error response


def with_accept_steps(response, outputs, by_index: bool, steps: bool = True) -> None:
    """Each choice of a whole response gets ``hogwild: {"accept_steps": [...]}`` from its completion output
    (:mod:`vllm_hogwild.patches.outputs`), or a fork/join request's tree (:mod:`vllm_hogwild.serving.assembly`),
    with its tokens' accept steps when ``steps`` (the request asked for them). ``outputs``: in choice order, or
    matched by ``index``."""
    choices = getattr(response, "choices", None)
    if choices is None:
        return  # an error response
    if by_index:
        found = {o.index: o for o in outputs}
        pairs = [(c, found.get(c.index)) for c in choices]
    else:
        pairs = list(zip(choices, outputs)) if len(choices) == len(outputs) else []
    for choice, output in pairs:
        meta = getattr(output, "hogwild", None)
        if meta is not None and "protocol" in meta:  # a fork/join request's tree (serving/assembly.py)
            setattr(choice, FIELD, meta if steps else {k: v for k, v in meta.items() if k != "accept_steps"})
        elif meta is not None and "accept_steps" in meta:
            setattr(choice, FIELD, {"accept_steps": list(meta["accept_steps"])})


def _choice_text(choice) -> str:
    message = getattr(choice, "message", None)
    if message is not None:
        return message.content or ""
    return choice.text or ""


async def _stream_with_answer(events: AsyncIterator[str], pattern: str, named: bool) -> AsyncIterator[str]:
    texts: dict[int, str] = {}
    head: dict[str, Any] = {}
    async for event in events:
        if event.startswith("data: [DONE]"):
            last = {**head, "choices": [], FIELD: answer_field(
                [texts.get(i, "") for i in range(max(texts, default=-1) + 1)], pattern, named)}
            yield f"data: {json.dumps(last)}\n\n"
        elif event.startswith("data: "):
            try:
                chunk = json.loads(event[len("data: "):])
            except ValueError:
                chunk = None
            if isinstance(chunk, dict) and "choices" in chunk:
                head = head or {k: chunk[k] for k in ("id", "object", "created", "model") if k in chunk}
                for choice in chunk["choices"]:
                    delta = choice.get("delta")
                    piece = (delta or {}).get("content") if delta is not None else choice.get("text")
                    texts[choice["index"]] = texts.get(choice["index"], "") + (piece or "")
        yield event
