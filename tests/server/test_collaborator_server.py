"""`vllm serve <the trained collaborator> --plugin hogwild`, called with the stock `openai` client.

One server for the module. Every answer is checked (:func:`vllm_hogwild.tasks.roman.check`), and a group of
4 that reads each other finishes in fewer steps than one worker, through both routes, whole and streamed.
"""

from __future__ import annotations

import pytest

from tests.server.conftest import Server
from vllm_hogwild.tasks import roman
from vllm_hogwild.models import solve
from vllm_hogwild.models.roman_collaborator import model_dir

pytestmark = [pytest.mark.vllm, pytest.mark.server]

TASKS = roman.make_tasks(3, seed=21, min_items=16, max_items=22)
SAMPLING = dict(temperature=solve.TEMPERATURE, max_tokens=solve.budget(22))
XARGS = {"hogwild_layout": "contiguous", "hogwild_protocol": "raw"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("collaborator-server")
    server = Server(model_dir(), ["--plugin", "hogwild", "--hogwild-max-workers", "8"], tmp / "server.log",
                    name="collaborator")
    try:
        yield server.wait_ready()
    finally:
        server.stop()


def _client(server: Server):
    import openai

    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)


def _extra(seed: int) -> dict:
    return {"min_p": solve.MIN_P, "vllm_xargs": XARGS, "seed": seed}


def _tokens(tokenizer, texts: list[str]) -> int:
    """A group's sequential steps: its longest worker's tokens (the end of sequence is the step after)."""
    return max(len(tokenizer.encode(t, add_special_tokens=False)) for t in texts) + 1


def test_completions_four_workers_answer_in_fewer_steps(server) -> None:
    from vllm_hogwild.models.roman_collaborator import build_tokenizer

    tok = build_tokenizer()
    client = _client(server)
    steps = {1: [], 4: []}
    for i, task in enumerate(TASKS):
        for n in steps:
            resp = client.completions.create(model="collaborator", prompt=roman.prompt(task), n=n, **SAMPLING,
                                             extra_body=_extra(i))
            texts = [c.text for c in sorted(resp.choices, key=lambda c: c.index)]
            assert roman.check(task, texts).correct, texts
            steps[n].append(_tokens(tok, texts))
    print("sequential steps:", steps)
    assert sum(steps[4]) <= 0.5 * sum(steps[1])


@pytest.mark.parametrize("route", ["completions", "chat"])
def test_streamed_group_is_the_whole_one(server, route: str) -> None:
    client = _client(server)
    task = TASKS[0]
    if route == "completions":
        def call(**kw):
            return client.completions.create(model="collaborator", prompt=roman.prompt(task), n=4, **SAMPLING,
                                             extra_body=_extra(7), **kw)

        def whole_texts(resp):
            return [c.text for c in sorted(resp.choices, key=lambda c: c.index)]

        def delta(choice):
            return choice.text
    else:
        def call(**kw):
            return client.chat.completions.create(
                model="collaborator", messages=[{"role": "user", "content": roman.prompt(task)}], n=4, **SAMPLING,
                extra_body=_extra(7), **kw)

        def whole_texts(resp):
            return [c.message.content for c in sorted(resp.choices, key=lambda c: c.index)]

        def delta(choice):
            return choice.delta.content or ""
    whole = whole_texts(call())
    streamed = [""] * 4
    for chunk in call(stream=True):
        for choice in chunk.choices:
            streamed[choice.index] += delta(choice)
    assert streamed == whole
    score = roman.check(task, whole)
    assert score.correct and all(score.claims(w) for w in range(4)), whole  # every worker took a share
