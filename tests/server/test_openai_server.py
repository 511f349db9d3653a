"""`vllm serve <default model> --plugin hogwild`, called with the stock `openai` client over real HTTP and SSE.

One server for the module (started as a user types it, through the `vllm`
command). The offline results it must reproduce come from `LLM(...)` in a
separate process with the same environment (tests/server/offline_reference.py).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import pytest

from tests.server.conftest import Server, server_env

pytestmark = [pytest.mark.vllm, pytest.mark.server]

MAX_WORKERS = 4
PROMPT = "Alice and Bob split a list of chores between them. Alice:"
MESSAGES = [{"role": "user", "content": "Two friends plan a picnic. Suggest what each should bring."}]
SAMPLING = dict(temperature=0.8, top_p=0.95, top_k=50, max_tokens=12)
RAW = {"hogwild_layout": "contiguous", "hogwild_protocol": "raw"}
CASES = [(route, n) for route in ("completions", "chat") for n in (2, 4)]


def _case(route: str, n: int) -> dict:
    body = {"prompt": PROMPT} if route == "completions" else {"messages": MESSAGES}
    return {"route": route, "n": n, "seed": 1000 + n, **SAMPLING, **body,
            "extra_args": {"hogwild": {"layout": "contiguous", "protocol": "raw"}}}


@pytest.fixture(scope="module")
def served(default_model_dir, tmp_path_factory):
    """(server, offline results by (route, n)); the offline run overlaps the server's start-up."""
    tmp = tmp_path_factory.mktemp("server")
    server = Server(default_model_dir, ["--plugin", "hogwild", "--hogwild-max-workers", str(MAX_WORKERS)],
                    tmp / "server.log", name="smollm2")
    try:
        cases = [_case(route, n) for route, n in CASES]
        (tmp / "cases.json").write_text(json.dumps(cases))
        subprocess.run(  # a hang guard: this set-up, server included, takes about 65 s on 2 cores
            [sys.executable, "-m", "tests.server.offline_reference", str(default_model_dir),
             str(tmp / "cases.json"), str(tmp / "offline.json")],
            check=True, env=server_env(), timeout=900, capture_output=True,
        )
        offline = dict(zip(CASES, json.loads((tmp / "offline.json").read_text())))
        server.wait_ready()
        yield server, offline
    finally:
        server.stop()


@pytest.fixture(scope="module")
def server(served) -> Server:
    return served[0]


def client(server: Server):
    import openai

    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)


def async_client(server: Server):
    import openai

    return openai.AsyncOpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)


def _request(route: str, n: int, **kw):
    case = _case(route, n)
    body = {"prompt": case["prompt"]} if route == "completions" else {"messages": case["messages"]}
    return dict(model="smollm2", n=n, seed=case["seed"], temperature=SAMPLING["temperature"],
                top_p=SAMPLING["top_p"], max_tokens=SAMPLING["max_tokens"],
                extra_body={"top_k": SAMPLING["top_k"], "vllm_xargs": RAW}, **body, **kw)


def _create(c, route: str, **kw):
    return (c.completions if route == "completions" else c.chat.completions).create(**kw)


def _text(choice, route: str) -> str:
    return choice.text if route == "completions" else choice.message.content


def _delta(choice, route: str) -> str:
    return (choice.text if route == "completions" else choice.delta.content) or ""


@pytest.mark.parametrize("route,n", CASES)
def test_one_choice_per_worker_equal_to_offline(served, route, n) -> None:
    server, offline = served
    ref = offline[(route, n)]
    resp = _create(client(server), route, **_request(route, n))
    assert [c.index for c in resp.choices] == list(range(n))
    assert [_text(c, route) for c in resp.choices] == ref["texts"]
    assert all(c.finish_reason == "length" for c in resp.choices) == all(t == 12 for t in ref["num_tokens"])
    assert resp.usage.prompt_tokens == ref["prompt_tokens"]
    assert resp.usage.completion_tokens == sum(ref["num_tokens"])  # every worker's tokens
    assert resp.usage.total_tokens == ref["prompt_tokens"] + sum(ref["num_tokens"])


@pytest.mark.parametrize("route,n", CASES)
def test_streaming_delivers_every_worker_live(served, route, n) -> None:
    server, offline = served
    ref = offline[(route, n)]
    stream = _create(client(server), route, stream=True, stream_options={"include_usage": True},
                     **_request(route, n))
    texts, order, usage, finish = [""] * n, [], None, {}
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            if _delta(choice, route):
                texts[choice.index] += _delta(choice, route)
                order.append(choice.index)
            if choice.finish_reason is not None:
                finish[choice.index] = choice.finish_reason
    assert texts == ref["texts"]
    assert sorted(finish) == list(range(n))
    assert usage.completion_tokens == sum(ref["num_tokens"]) and usage.prompt_tokens == ref["prompt_tokens"]
    # Interleaved as produced: every worker has started before any has finished.
    first = [order.index(w) for w in range(n)]
    last = [len(order) - 1 - order[::-1].index(w) for w in range(n)]
    assert max(first) < min(last), order


def test_hogwild_and_plain_requests_side_by_side(server) -> None:
    c = client(server)
    plain_prompts = [f"Fact number {i} about the sea:" for i in range(8)]
    plain = dict(model="smollm2", temperature=0.0, max_tokens=16)
    alone = [c.completions.create(prompt=p, **plain).choices[0].text for p in plain_prompts]

    async def together():
        ac = async_client(server)
        hog = [ac.completions.create(**{**_request("completions", 2), "seed": s, "max_tokens": 16,
                                        "extra_body": {"vllm_xargs": RAW, "ignore_eos": True}})
               for s in range(8)]
        plains = [ac.completions.create(prompt=p, **plain) for p in plain_prompts]
        return await asyncio.gather(*hog, *plains)

    results = asyncio.run(together())
    hog, plains = results[:8], results[8:]
    for resp in hog:
        assert [ch.index for ch in resp.choices] == [0, 1]
        assert resp.usage.completion_tokens == 2 * 16
    assert [r.choices[0].text for r in plains] == alone


def test_disconnect_mid_stream_aborts_the_group_and_frees_its_blocks(server) -> None:
    n = 4
    c = client(server)
    c.completions.create(model="smollm2", prompt="warm up", max_tokens=2)
    before = server.metrics()
    free_before = server.metric("hogwild:kv_cache_free_blocks", before)
    ended_before = server.metric("hogwild:groups_ended_total", before)
    generated_before = server.metric("hogwild:group_generation_tokens_sum", before)
    processed_before = server.metric("vllm:generation_tokens_total", before)
    stream = c.completions.create(
        model="smollm2", prompt="Write a very long story about a dragon. " * 40, n=n, max_tokens=400,
        temperature=0.8, stream=True, logprobs=0, extra_body={"vllm_xargs": RAW, "ignore_eos": True},
    )
    received = [0] * n  # tokens, not chunks: a chunk carries every token of its worker since the last one
    for chunk in stream:
        for choice in chunk.choices:
            received[choice.index] += len(choice.logprobs.tokens)
        if sum(received) >= 10 * n:
            break
    at_close = server.metrics()
    assert server.metric("hogwild:kv_cache_free_blocks", at_close) < free_before  # the group holds blocks
    # Tokens the server had generated and processed when the client went: at least what it read, and more where
    # the server wrote ahead into the socket while a loaded client read slowly.
    seen = server.metric("vllm:generation_tokens_total", at_close) - processed_before
    assert seen >= sum(received)
    stream.close()  # the client goes away mid-stream
    closed = time.monotonic()
    # A hang guard, not a speed check: the group ends within seconds; a group that went on after the disconnect
    # is caught by the count of its steps below, not by this wait.
    while server.metric("hogwild:groups_ended_total") == ended_before and time.monotonic() < closed + 120:
        time.sleep(0.1)
    assert server.metric("hogwild:groups_ended_total") == ended_before + 1
    assert server.metric("hogwild:groups_running") == 0
    assert server.metric("hogwild:kv_cache_free_blocks") == free_before
    generated = server.metric("hogwild:group_generation_tokens_sum") - generated_before
    steps_after_disconnect = (generated - seen) / n  # the engine's own count, after the client went
    # The group stops long before its budget: how soon depends on when vLLM's API server notices the closed
    # socket, which grows with the machine's load (0-5 steps alone, 30 in one clean-clone run beside another
    # test module on 2 cores); the abort of the whole group and its blocks are the plugin's, checked above.
    print(f"\nsteps after the disconnect: {steps_after_disconnect:.0f} (ended within {time.monotonic() - closed:.1f} s)")
    assert 0 <= steps_after_disconnect <= (400 - seen / n) / 4, (generated, seen, received)


def test_the_attention_path_is_logged_once_and_labelled_in_metrics(server) -> None:
    import re

    # This machine builds the compiled CPU op, so the CPU's default path is cpu-op.
    found = re.findall(r'^hogwild:attention_info\{([^}]*)\} (\S+)$', server.metrics(), re.M)
    from vllm_hogwild.attention import cpu_ops

    isa = cpu_ops.choose()  # the widest vector path the op has here
    assert len(found) == 1 and 'path="cpu-op"' in found[0][0] and f'isa="{isa}"' in found[0][0], found
    assert float(found[0][1]) == 1.0, found
    log = server.log_path.read_text(errors="replace")
    assert len(re.findall(rf"Hogwild attention: cpu-op \({isa}\) \(\d+ layers\)", log)) == 1


BAD = [
    ({"n": 2, "extra_body": {"vllm_xargs": {"hogwild_layout": "spiral"}}}, "hogwild_layout"),
    ({"n": 2, "extra_body": {"vllm_xargs": {"hogwild_protocol": "chat"}}}, "hogwild_protocol"),
    ({"n": 2, "extra_body": {"vllm_xargs": {"hogwild_colour": "blue"}}}, "hogwild_colour"),
    ({"n": MAX_WORKERS + 1, "extra_body": {"vllm_xargs": RAW}}, "n"),
    ({"n": 2, "max_tokens": 1500, "extra_body": {"vllm_xargs": RAW}}, "max_tokens"),
    ({"n": 2, "extra_body": {"vllm_xargs": {"hogwild_protocol": "collab", "hogwild_task": "poetry"}}}, "hogwild_task"),
    ({"n": 2, "extra_body": {"vllm_xargs": {"hogwild_protocol": "multiverse"}}}, "n"),
    ({"extra_body": {"vllm_xargs": {"hogwild_protocol": "npr", "hogwild_branches": "all"}}}, "hogwild_branches"),
    ({"extra_body": {"vllm_xargs": {"hogwild_protocol": "npr", "hogwild_max_branches": MAX_WORKERS}}},
     "hogwild_max_branches"),
    ({"stop": ["."], "extra_body": {"vllm_xargs": {"hogwild_protocol": "npr"}}}, "stop"),
]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("route", ["completions", "chat"])
@pytest.mark.parametrize("bad,field", BAD, ids=[f for _, f in BAD])
def test_bad_field_is_a_400_naming_it_and_the_server_keeps_serving(server, route, stream, bad, field) -> None:
    import openai

    c = client(server)
    body = {"prompt": "Hi"} if route == "completions" else {"messages": MESSAGES}
    with pytest.raises(openai.BadRequestError) as info:  # raised before any stream starts
        _create(c, route, model="smollm2", temperature=0.8, stream=stream, **body, **bad)
    assert info.value.status_code == 400
    assert info.value.body["param"] == field
    assert info.value.body["message"].startswith(f"{field}: ")
    good = _create(c, route, **_request(route, 2))
    assert len(good.choices) == 2


def test_metrics_keep_vllm_series_and_add_hogwild_ones(server) -> None:
    c = client(server)
    n, t, block = 3, 6, 128  # vLLM's CPU block size
    prompt = "A long shared prompt for the whole group. " * 40
    before = {k: server.metric(k) for k in ("hogwild:prefill_tokens_saved_total", "hogwild:coworker_tokens_read_sum",
                                             "hogwild:workers_per_group_sum", "hogwild:groups_ended_total")}
    resp = c.completions.create(model="smollm2", prompt=prompt, n=n, max_tokens=t, temperature=0.8,
                                extra_body={"vllm_xargs": RAW, "ignore_eos": True})
    p = resp.usage.prompt_tokens
    assert p > 2 * block
    text = server.metrics()
    for name in ("vllm:num_requests_running", "vllm:kv_cache_usage_perc", "vllm:generation_tokens_total",
                 "hogwild:groups_running", "hogwild:groups_waiting", "hogwild:group_latency_seconds_bucket",
                 "hogwild:admission_wait_seconds_bucket", "hogwild:group_generation_tokens_bucket"):
        assert name in text, name
    delta = {k: server.metric(k) - v for k, v in before.items()}
    assert delta["hogwild:groups_ended_total"] == 1
    assert delta["hogwild:workers_per_group_sum"] == n
    # The prompt's full blocks are computed once; vLLM recomputes at least one
    # prompt token, so each further worker reuses the full blocks before it.
    assert delta["hogwild:prefill_tokens_saved_total"] == (n - 1) * block * ((p - 1) // block)
    # In lock-step each worker's decode step k (k = 1 .. t-1) reads k tokens of each co-worker.
    assert delta["hogwild:coworker_tokens_read_sum"] == n * (n - 1) * t * (t - 1) // 2


@pytest.mark.parametrize("script,expect", [
    ("openai_client.py", ["usage: prompt=", "time to first token", "HTTP 400: hogwild_layout: unknown layout"]),
    ("stream_view.py", ["worker 0:", "worker 1:", "group usage:"]),
    ("collab_tasks.py", ["--- worker 0 ---\n**Alice [1]:** ", "--- worker 1 ---\n**Bob [1]:** ", "final answer"]),
])
def test_examples_run_against_the_server(server, script, expect) -> None:
    from pathlib import Path

    path = Path(__file__).parents[2] / "examples" / script
    # A hang guard: an example's run of 8 tokens takes seconds.
    run = subprocess.run([sys.executable, str(path), "--base-url", server.base_url + "/v1", "--workers", "2",
                          "--max-tokens", "8"], capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert run.returncode == 0, run.stdout + run.stderr
    for text in expect:
        assert text in run.stdout, text


def test_named_protocol_in_combined_layout_through_the_server(server) -> None:
    stream = client(server).chat.completions.create(
        model="smollm2", messages=MESSAGES, n=2, max_tokens=24, temperature=0.8, seed=5, stream=True,
        extra_body={"vllm_xargs": {"hogwild_layout": "combined", "hogwild_protocol": "named"}})
    texts = ["", ""]
    for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
    assert texts[0].startswith("**Alice [1]:** ") and texts[1].startswith("**Bob [1]:** ")


QUESTION = "A shop sells pens at 3 dollars each and notebooks at 5 dollars each. Sam buys 4 pens and 2 notebooks. How many dollars does Sam pay?"
COLLAB = {"hogwild_protocol": "collab"}


def _texts_from_stream(stream, n: int, route: str) -> tuple[list[str], list]:
    texts, events = [""] * n, []
    for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] += _delta(choice, route)
        events.append(chunk)
    return texts, events


@pytest.mark.parametrize("route,n", [("chat", 2), ("completions", 4)])
def test_collab_group_returns_its_final_answer_whole_and_streamed(server, route, n) -> None:
    """The collab protocol (math): the answer is a field of the response, and the last event of a
    stream; both agree with the texts, and a worker or the finisher wrote it."""
    from vllm_hogwild.core.protocol.collab import answer_of_texts
    from vllm_hogwild.core.protocol_text import DEFAULT_ANSWER_PATTERN, NAMES, preamble

    c = client(server)
    body = {"messages": [{"role": "user", "content": QUESTION}]} if route == "chat" else {"prompt": QUESTION}
    kw = dict(model="smollm2", n=n, max_tokens=96, temperature=0.6, seed=7, extra_body={"vllm_xargs": COLLAB}, **body)
    whole = _create(c, route, **kw)
    texts = [_text(ch, route) for ch in sorted(whole.choices, key=lambda ch: ch.index)]
    for w, text in enumerate(texts):
        assert text.startswith(f"**{NAMES[w]} [1]:** ")
    field = whole.model_extra["hogwild"]
    found = answer_of_texts(texts, DEFAULT_ANSWER_PATTERN["math"])
    assert found is not None, texts  # the finisher asks for it when nobody wrote one
    assert field == {"answer": found.text, "worker": found.worker, "name": NAMES[found.worker], "source": found.source}
    # The prompt holds the preamble (as a system message in chat) and the section headers.
    plain = _create(c, route, model="smollm2", max_tokens=1, **body)
    assert whole.usage.prompt_tokens > plain.usage.prompt_tokens + len(preamble(n).split()) // 2
    assert "hogwild" not in (plain.model_extra or {})

    streamed, events = _texts_from_stream(_create(c, route, stream=True, **kw), n, route)
    assert streamed == texts  # same seed, same group
    assert events[-1].choices == [] and events[-1].model_extra["hogwild"] == field
    assert all("hogwild" not in (e.model_extra or {}) for e in events[:-1])



GOAL = ("Plan a picnic.\n<Parallel>\n<Goal>\n<Outline>\n1: the food</Outline>\n"
        "<Outline>\n2: the games</Outline>\n</Goal>")
FORK = {"hogwild_protocol": "multiverse", "hogwild_branch_end": "[.!?]", "hogwild_max_branches": 2}


@pytest.mark.parametrize("route", ["completions", "chat"])
def test_fork_join_request_whole_and_streamed(server, route) -> None:
    """One choice: the flat document (branches in order, the join header), its tree in `choice.hogwild`, usage
    counting every branch; streamed, the same text in the same order, each token once."""
    c = client(server)
    body = {"prompt": GOAL} if route == "completions" else {"messages": [{"role": "user", "content": GOAL}]}
    kw = dict(model="smollm2", seed=5, temperature=0.8, max_tokens=40, extra_body={"vllm_xargs": FORK}, **body)
    whole = _create(c, route, **kw)
    assert len(whole.choices) == 1
    choice = whole.choices[0]
    tree = choice.model_extra["hogwild"]
    text = _text(choice, route)
    if route == "completions":  # the prompt ends in the goal: the fork starts at once
        assert tree["forked"] and tree["fork_tokens"] == 0 and [r["branch"] for r in tree["branches"]] == ["1", "2"]
        branches = "".join(r["text"] for r in tree["branches"])
        assert text.startswith(branches) and text[len(branches):].startswith("<Conclusion>\n")
        assert tree["branches"][0]["text"].startswith("\n<Path>\n1:")
        assert whole.usage.completion_tokens == tree["num_tokens"]
    stream = _create(c, route, stream=True, stream_options={"include_usage": True}, **kw)
    streamed, finishes, usage, trees = "", [], None, []
    for chunk in stream:
        usage = chunk.usage or usage
        if (chunk.model_extra or {}).get("hogwild") is not None:  # the last event before [DONE]: the tree
            assert not chunk.choices
            trees.append(chunk.model_extra["hogwild"])
        for ch in chunk.choices:
            assert ch.index == 0
            streamed += _delta(ch, route) or ""
            if ch.finish_reason is not None:
                finishes.append(ch.finish_reason)
    assert streamed == text
    assert trees == [tree], "the stream's last event carries the same tree"
    assert finishes == [choice.finish_reason]
    assert usage.completion_tokens == whole.usage.completion_tokens
