"""The collaboration protocol's front-end pieces (pure): options, prompt extension, answers, transcript, SSE."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest

from vllm_hogwild.core.protocol.collab import (
    answer_of_texts,
    extend_prompt,
    extended_len,
    render_transcript,
    transcript,
    with_preamble,
)
from vllm_hogwild.core.options import COLLAB_DEFAULTS, HogwildOptionError, RequestOptions, RequestSpec, parse_request
from vllm_hogwild.core.protocol_text import DEFAULT_ANSWER_PATTERN, FINISHER_SUFFIX, HEADER_ORDER, HEADERS, preamble


class CharTokenizer:
    """One token per character; BOS is 1 (a stand-in: the real tokenizer runs in tests/integration)."""

    bos_token_id = 1

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return ([1] if add_special_tokens else []) + [ord(c) for c in text]


def decode(ids) -> str:
    return "".join(chr(i) for i in ids)


# -- options -------------------------------------------------------------------


def test_collab_fills_its_defaults_and_keeps_what_the_request_set() -> None:
    opts = parse_request({"hogwild": {"protocol": "collab"}})
    assert (opts.layout, opts.redundancy_every, opts.finisher) == (
        COLLAB_DEFAULTS["layout"], COLLAB_DEFAULTS["redundancy_every"], COLLAB_DEFAULTS["finisher"])
    assert opts.answer_pattern == DEFAULT_ANSWER_PATTERN["math"] and (opts.task, opts.person) == ("math", "second")
    opts = parse_request({"hogwild_protocol": "collab", "hogwild_task": "general", "hogwild_layout": "interleaved",
                          "hogwild_finisher": 0, "hogwild_redundancy_every": 0, "hogwild_answer_pattern": "A=(\\d)"})
    assert opts == RequestOptions("interleaved", "collab", None, "A=(\\d)", 0, "general", "second", 0)
    assert parse_request({"hogwild_protocol": "collab", "hogwild_task": "code"}).answer_pattern == \
        DEFAULT_ANSWER_PATTERN["code"]


@pytest.mark.parametrize("extra,field", [
    ({"hogwild_protocol": "collab", "hogwild_task": "poetry"}, "hogwild_task"),
    ({"hogwild": {"protocol": "collab", "person": "third"}}, "hogwild.person"),
    ({"hogwild_protocol": "collab", "hogwild_finisher": -1}, "hogwild_finisher"),
    ({"hogwild_protocol": "collab", "hogwild_finisher": True}, "hogwild_finisher"),
    ({"hogwild_protocol": "collab", "hogwild_layout": "contiguous"}, "hogwild_layout"),
    ({"hogwild_layout": "combined", "hogwild_task": "math"}, "hogwild_task"),
    ({"hogwild_layout": "combined", "hogwild_protocol": "named", "hogwild_finisher": 8}, "hogwild_finisher"),
    ({"hogwild_layout": "combined", "hogwild_redundancy_every": 8}, "hogwild_redundancy_every"),
])
def test_collab_errors_name_the_field(extra, field) -> None:
    with pytest.raises(HogwildOptionError) as info:
        parse_request(extra)
    assert info.value.parameter == field and str(info.value).startswith(f"{field}: ")


# -- the prompt ------------------------------------------------------------------


@pytest.mark.parametrize("bos", [True, False])
def test_a_raw_prompt_gets_the_preamble_in_front_and_the_headers_behind(bos) -> None:
    tok, opts = CharTokenizer(), parse_request({"hogwild_protocol": "collab", "hogwild_person": "first"})
    prompt = ([1] if bos else []) + [ord(c) for c in "What is 2+3?"]
    ids, tail = extend_prompt(tok, prompt, opts, 3, in_chat=False)
    headers = "".join(HEADERS[name] for name in HEADER_ORDER)
    assert decode(ids) == ("\x01" if bos else "") + preamble(3, "math", "first") + "\n\nWhat is 2+3?\n\n" + headers
    assert tail.prompt_end == len(ids) - len(headers)
    for name in HEADER_ORDER:
        start, end = getattr(tail, name)
        assert decode(ids[start:end]) == HEADERS[name]
    assert tail.own[1] == len(ids)  # the own header is last: the first step follows it
    spec = RequestSpec(opts, 3, tail)
    assert RequestSpec.from_wire(json.loads(json.dumps(spec.to_wire()))) == spec
    assert extended_len(tok, len(prompt), opts, 3, in_chat=False) == len(ids)


def test_a_chat_prompt_only_gets_the_headers() -> None:
    tok, opts = CharTokenizer(), parse_request({"hogwild_protocol": "collab"})
    prompt = [ord(c) for c in "<|im_start|>assistant\n"]
    ids, tail = extend_prompt(tok, prompt, opts, 2, in_chat=True)
    assert ids[: len(prompt)] == prompt and tail.prompt_end == len(prompt)
    assert extended_len(tok, len(prompt), opts, 2, in_chat=True) == len(ids)


def test_the_preamble_becomes_the_first_system_message() -> None:
    opts = parse_request({"hogwild_protocol": "collab", "hogwild_task": "code"})
    user = [{"role": "user", "content": "Sort a list."}]
    out = with_preamble(user, opts, 4)
    assert out == [{"role": "system", "content": preamble(4, "code")}, *user]
    own = [{"role": "system", "content": "Be brief."}, *user]
    out = with_preamble(own, opts, 4)
    assert out[0]["content"] == preamble(4, "code") + "\n\nBe brief." and own[0]["content"] == "Be brief."


# -- the answer ------------------------------------------------------------------


def test_the_answer_names_its_writer_and_whether_the_finisher_asked() -> None:
    pattern = DEFAULT_ANSWER_PATTERN["math"]
    assert answer_of_texts(["no", "so \\boxed{22}."], pattern).to_dict() == {
        "text": "22", "worker": 1, "name": "Bob", "source": "worker"}
    late = "**Alice [4]:** hmm" + FINISHER_SUFFIX["math"] + "21}"
    assert answer_of_texts([late, "nothing"], pattern).source == "finisher"
    assert answer_of_texts(["a", "b"], pattern) is None
    assert answer_of_texts(["\\boxed{1}"], pattern, named=False).name is None


# -- the transcript --------------------------------------------------------------


def test_the_transcript_orders_steps_as_they_joined() -> None:
    alice = ["**Alice [1]:** ", "one", ".\n\n", "**Alice [2]:** ", "three", " four"]
    bob = ["**Bob [1]:** ", "two", " **Alice [9]:** ", ".\n\n", "**Bob [2]:** ", "x"]  # Bob copies a prefix
    carol = ["**Carol [1]:** ", "done", "."]  # stopped early
    steps = transcript([alice, bob, carol])
    assert [(s.worker, s.number, s.joined_at) for s in steps] == [
        (0, 1, 3), (2, 1, 3), (1, 1, 4), (0, 2, 6), (1, 2, 6)]  # the same group step: worker order
    assert steps[2].text == "**Bob [1]:** two **Alice [9]:** .\n\n"
    assert render_transcript(steps).startswith("**Alice [1]:** one.\n\n**Carol [1]:** done.\n\n**Bob [1]:**")


# -- the server's answer field ---------------------------------------------------


def _events(chunks: list[dict]):
    async def gen():
        for chunk in chunks:
            yield f"data: {json.dumps(chunk)}\n\n"
        yield "data: [DONE]\n\n"
    return gen()


def test_a_stream_ends_with_the_answer_event() -> None:
    from vllm_hogwild.serving.responses import with_answer

    head = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m"}
    chunks = [{**head, "choices": [{"index": 0, "text": "**Alice [1]:** \\box"}]},
              {**head, "choices": [{"index": 1, "text": "**Bob [1]:** hm"}]},
              {**head, "choices": [{"index": 0, "text": "ed{5}"}]},
              {**head, "choices": [], "usage": {"total_tokens": 9}}]
    options = parse_request({"hogwild_protocol": "collab"})

    async def collect():
        return [e async for e in with_answer(options, _events(chunks))]

    events = asyncio.run(collect())
    assert events[-1] == "data: [DONE]\n\n" and len(events) == len(chunks) + 2
    last = json.loads(events[-2][len("data: "):])
    assert last == {**head, "choices": [], "hogwild": {"answer": "5", "worker": 0, "name": "Alice", "source": "worker"}}


def test_a_whole_response_gets_the_field_and_other_requests_do_not() -> None:
    from vllm_hogwild.serving.responses import with_answer

    class Response(SimpleNamespace):
        pass

    def response(texts):
        return Response(choices=[SimpleNamespace(index=i, text=t) for i, t in enumerate(texts)])

    collab = parse_request({"hogwild_protocol": "collab"})
    assert with_answer(collab, response(["a", "b"])).hogwild == {
        "answer": None, "worker": None, "name": None, "source": None}
    raw = parse_request({"hogwild_layout": "contiguous"})
    assert not hasattr(with_answer(raw, response(["\\boxed{1}"])), "hogwild")
    assert not hasattr(with_answer(None, response(["\\boxed{1}"])), "hogwild")  # a plain request
