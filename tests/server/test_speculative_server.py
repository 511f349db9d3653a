"""`vllm serve --plugin hogwild --speculative-config '{"method": "ngram", ...}'` with the stock `openai` client.

A group decodes with n-gram speculation through the server; asked for them
(``hogwild_accept_steps``), whole responses carry each choice's accept steps on
both routes; a stream that asks for them gets a 400 naming the field; plain
requests run beside; fork/join requests with isolated and with hogwild branches
run (the tree with its accept steps when asked). The exactness of what the steps describe is checked
offline against the dense oracle (tests/integration/test_speculative.py).
"""

from __future__ import annotations

import json

import pytest

from tests.server.conftest import Server

pytestmark = [pytest.mark.vllm, pytest.mark.server]

NAME = "tiny"
SPEC = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 4}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from tests.integration.tiny_model import build_tiny_llama

    tmp = tmp_path_factory.mktemp("spec-server")
    model = build_tiny_llama(tmp / "tiny-llama")
    srv = Server(model, ["--plugin", "hogwild", "--hogwild-max-workers", "4", "--block-size", "32",
                         "--speculative-config", json.dumps(SPEC)], tmp / "server.log", name=NAME)
    try:
        yield srv.wait_ready()
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=server.base_url + "/v1", api_key="none", timeout=120, max_retries=0)


def test_completion_group_carries_accept_steps_when_asked(client) -> None:
    prompt = "one two three one two three one two three one two three"
    resp = client.completions.create(model=NAME, prompt=prompt, n=2, max_tokens=24, temperature=0.02, seed=3,
                                     extra_body={"ignore_eos": True, "vllm_xargs": {"hogwild_accept_steps": True}})
    assert len(resp.choices) == 2
    for choice in resp.choices:
        steps = choice.model_extra["hogwild"]["accept_steps"]
        assert len(steps) == 24 and steps == sorted(steps)
    plain = client.completions.create(model=NAME, prompt=prompt, n=2, max_tokens=8, temperature=0.02, seed=3,
                                      extra_body={"vllm_xargs": {"hogwild_layout": "contiguous"}})
    assert all("hogwild" not in (c.model_extra or {}) for c in plain.choices)  # not asked: not sent


def test_chat_group_carries_accept_steps_when_asked(client) -> None:
    resp = client.chat.completions.create(
        model=NAME, messages=[{"role": "user", "content": "Count: 1 2 3 1 2 3 1 2 3"}], n=2, max_tokens=16,
        temperature=0.02, seed=4, extra_body={"ignore_eos": True, "vllm_xargs": {"hogwild_accept_steps": True}})
    assert sorted(c.index for c in resp.choices) == [0, 1]
    for choice in resp.choices:
        steps = choice.model_extra["hogwild"]["accept_steps"]
        assert len(steps) == 16 and steps == sorted(steps)


def test_a_stream_asking_for_accept_steps_is_a_400_naming_the_field(client) -> None:
    import openai

    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=NAME, prompt="hi", n=2, max_tokens=4, temperature=0.5, stream=True,
                                  extra_body={"vllm_xargs": {"hogwild_accept_steps": True}})
    assert "hogwild_accept_steps" in str(info.value)
    out = client.completions.create(model=NAME, prompt="hi", max_tokens=4, temperature=0.0)  # still serving
    assert out.choices[0].text is not None


GOAL = ("Count them.\n<Parallel>\n<Goal>\n<Outline>\n1: even cases</Outline>\n<Outline>\n2: odd cases</Outline>\n"
        "</Goal>")  # the fork starts at once (the random model writes no goal)


@pytest.mark.parametrize("stream", [False, True])
def test_fork_join_with_hogwild_branches_runs_with_speculation(client, stream) -> None:
    """Hogwild branches (each reading its siblings' accepted tokens) under speculation: whole, the tree with each
    token's accept step; streamed, the request ends."""
    xargs = {"hogwild_protocol": "multiverse", "hogwild_branch_end": "[jqyz]", "hogwild_branches": "hogwild"}
    if stream:
        finish = [c.finish_reason for chunk in client.completions.create(
            model=NAME, prompt=GOAL, max_tokens=40, temperature=0.7, seed=5, stream=True,
            extra_body={"vllm_xargs": xargs}) for c in chunk.choices if c.finish_reason]
        assert len(finish) == 1
        return
    resp = client.completions.create(model=NAME, prompt=GOAL, max_tokens=40, temperature=0.7, seed=5,
                                     extra_body={"vllm_xargs": {**xargs, "hogwild_accept_steps": True}})
    tree = resp.choices[0].model_extra["hogwild"]
    assert tree["forked"] and tree["branches_mode"] == "hogwild" and len(tree["branches"]) == 2
    assert len(tree["accept_steps"]) == tree["num_tokens"]


def test_fork_join_with_isolated_branches_runs_with_speculation(client) -> None:
    """Whole: the tree, with each token's accept step when asked (one per token of the document, each lane's
    non-decreasing); streamed: the request ends."""
    xargs = {"hogwild_protocol": "multiverse", "hogwild_branch_end": "[jqyz]"}
    resp = client.completions.create(model=NAME, prompt=GOAL, max_tokens=40, temperature=0.7, seed=4,
                                     extra_body={"vllm_xargs": {**xargs, "hogwild_accept_steps": True}})
    tree = resp.choices[0].model_extra["hogwild"]
    assert tree["forked"] and len(tree["branches"]) == 2
    assert len(tree["accept_steps"]) == tree["num_tokens"]
    not_asked = client.completions.create(model=NAME, prompt=GOAL, max_tokens=40, temperature=0.7, seed=4,
                                          extra_body={"vllm_xargs": xargs})
    assert "accept_steps" not in not_asked.choices[0].model_extra["hogwild"]
    finish = [c.finish_reason for chunk in client.completions.create(
        model=NAME, prompt=GOAL, max_tokens=40, temperature=0.7, seed=4, stream=True,
        extra_body={"vllm_xargs": xargs}) for c in chunk.choices if c.finish_reason]
    assert finish in (["length"], ["stop"]), finish


def test_plain_and_streamed_groups_run_beside_speculation(client) -> None:
    text, finish = {}, {}
    for chunk in client.completions.create(model=NAME, prompt="a b a b a b", n=2, max_tokens=12, temperature=0.3,
                                           stream=True, extra_body={"ignore_eos": True,
                                                                    "vllm_xargs": {"hogwild_layout": "contiguous"}}):
        for c in chunk.choices:
            text[c.index] = text.get(c.index, "") + (c.text or "")
            if c.finish_reason:
                finish[c.index] = c.finish_reason
    assert finish == {0: "length", 1: "length"}
    plain = client.completions.create(model=NAME, prompt="a b a b", max_tokens=6, temperature=0.0)
    assert plain.choices[0].finish_reason in ("length", "stop")
    # top_k and top_p reach the rejection sampler (vLLM 0.32's CPU sampler died on top_k without the plugin's fix)
    group = client.completions.create(model=NAME, prompt="a b a b a b", n=2, max_tokens=12, temperature=0.7,
                                      top_p=0.9, extra_body={"top_k": 5, "ignore_eos": True,
                                                             "vllm_xargs": {"hogwild_layout": "contiguous"}})
    assert [c.finish_reason for c in group.choices] == ["length", "length"]
