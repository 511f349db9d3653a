"""One real `vllm serve --plugin hogwild` (tiny random Llama) against hostile clients.

- every Hogwild field, every JSON type, both routes, streamed or not: a 400 naming the field;
- a hypothesis fuzz of the Hogwild fields and their combinations with n, max_tokens, stop,
  logprobs, stream, temperature and seed: 200 or 400 (naming a field), never a 500;
- client patterns that backtrack exponentially in Python's ``re`` run beside plain requests
  without slowing them; a pattern Python's ``re`` crashes on is a 400 and the connection lives;
- a seeded request whose prefill is chunked (the step budget is 256 tokens), then a plain one.
"""

from __future__ import annotations

import json
import statistics
import time

import pytest

from tests.server.conftest import Server

pytestmark = [pytest.mark.vllm, pytest.mark.server]

NAME = "tiny"
HOSTILE = r"([\w ]+)+Z"  # legal, one group; exponential backtracking in Python's re on words without a Z
OPTIONS = ["layout", "protocol", "step_end", "answer_pattern", "redundancy_every", "task", "person", "finisher"]
KEYS = [f"hogwild_{name}" for name in OPTIONS] + ["hogwild_speed", "hogwild"]
VALUES = [None, True, 10**30, -5, 1.5, "", "x" * 100_000, "ünïcødé ✓", [1, "a"], {"a": 1}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from tests.integration.tiny_model import build_tiny_llama

    tmp = tmp_path_factory.mktemp("hostile")
    model = build_tiny_llama(tmp / "tiny-llama")
    srv = Server(model, ["--plugin", "hogwild", "--hogwild-max-workers", "4", "--block-size", "32",
                         "--max-num-batched-tokens", "256", "--max-num-seqs", "16"], tmp / "server.log", name=NAME)
    try:
        yield srv.wait_ready()
    finally:
        srv.stop()


def _body(route: str, case: dict) -> tuple[str, dict]:
    body = {"model": NAME, "max_tokens": 8, **case}
    if route == "completions":
        body.setdefault("prompt", "Split the work: count to five.")
        return "/v1/completions", body
    body["messages"] = [{"role": "user", "content": "Split the work: count to five."}]
    if isinstance(body.get("logprobs"), int) and not isinstance(body["logprobs"], bool):
        body["top_logprobs"], body["logprobs"] = body["logprobs"], True
    return "/v1/chat/completions", body


def _post(http, route: str, case: dict) -> tuple[int, str]:
    """POST the case on ``http`` (a keep-alive client); for a stream, read it to the end."""
    path, body = _body(route, case)
    with http.stream("POST", path, json=body) as resp:
        return resp.status_code, resp.read().decode(errors="replace")


def _names_a_field(text: str, fields) -> bool:
    error = json.loads(text)["error"]
    said = f"{error.get('param') or ''} {error.get('message') or ''}"
    return any(field in said for field in fields)


def _serves_plain(http) -> bool:
    status, text = _post(http, "completions", {"max_tokens": 3})
    return status == 200 and json.loads(text)["usage"]["completion_tokens"] == 3


def test_every_hogwild_field_of_every_json_type_is_a_400_naming_it(server) -> None:
    import httpx

    seen = 0
    with httpx.Client(base_url=server.base_url, timeout=60) as http:  # one connection for all of them
        for key in KEYS:
            for value in VALUES:
                for route in ("completions", "chat"):
                    for stream in (False, True):
                        case = {"n": 2, "stream": stream, "vllm_xargs": {key: value}}
                        status, text = _post(http, route, case)
                        assert status == 400, (key, repr(value)[:40], route, stream, text[:300])
                        assert _names_a_field(text, [key]), (key, text[:300])
                        assert len(text) < 5000  # a 100 kB value is not echoed back whole
                        seen += 1
        assert _serves_plain(http)  # the same connection still serves
    print(f"\n{seen} requests, every one a 400 naming its field")


# -- fuzz -------------------------------------------------------------------------------------------

def _strategies():
    from hypothesis import strategies as st

    anything = st.one_of(
        st.none(), st.booleans(), st.integers(-3, 5000), st.sampled_from([10**30, -(10**30), 2**63]),
        st.floats(allow_nan=False, width=32), st.text(max_size=8), st.just("x" * 100_000),
        st.text(alphabet=st.characters(min_codepoint=0x80), min_size=1, max_size=6),
        st.lists(st.integers(0, 3), max_size=2), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    )
    values = {
        "hogwild_layout": st.one_of(st.sampled_from(["contiguous", "combined", "interleaved", "isolated"]), anything),
        "hogwild_protocol": st.one_of(st.sampled_from(["raw", "named", "collab"]), anything),
        "hogwild_task": st.one_of(st.sampled_from(["math", "code", "general"]), anything),
        "hogwild_person": st.one_of(st.sampled_from(["first", "second"]), anything),
        "hogwild_finisher": st.one_of(st.integers(0, 8), anything),
        "hogwild_redundancy_every": st.one_of(st.integers(1, 64), anything),
        "hogwild_answer_pattern": st.one_of(st.sampled_from([r"Answer: (\d+)", HOSTILE, "(unclosed", "(" * 5000,
                                                             r"(a)\1", r"(?=a)(b)"]), anything),
        "hogwild_step_end": st.one_of(st.sampled_from(["\n\n", HOSTILE, r"(?<!a)b"]), anything),
        "hogwild_speed": anything,
        "hogwild": anything,
    }
    xargs = st.dictionaries(st.sampled_from(sorted(values)), st.nothing(), max_size=4).flatmap(
        lambda keys: st.fixed_dictionaries({k: values[k] for k in keys})
    )
    return st.fixed_dictionaries(
        {"route": st.sampled_from(["completions", "chat"]), "vllm_xargs": xargs},
        optional={
            "n": st.one_of(st.integers(-1, 6), st.text(max_size=3)),
            "max_tokens": st.one_of(st.integers(-2, 12), st.just(5000), st.none()),
            "stop": st.one_of(st.none(), st.text(max_size=3), st.lists(st.text(max_size=3), max_size=3), st.integers()),
            "logprobs": st.one_of(st.none(), st.booleans(), st.integers(0, 25)),
            "stream": st.booleans(),
            "temperature": st.one_of(st.floats(0, 2), st.just(-1.0)),
            "seed": st.integers(0, 2**31),
        },
    )


def test_fuzzed_hogwild_requests_get_200_or_400_naming_a_field_never_500(server) -> None:
    import httpx
    from hypothesis import HealthCheck, given, settings

    seen = {200: 0, 400: 0}

    @settings(max_examples=100, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(_strategies())
    def check(case: dict) -> None:
        case = dict(case)
        route = case.pop("route")
        if case.get("max_tokens") is None:
            case["max_tokens"] = 8  # the whole context per worker would only make the test slow
        with httpx.Client(base_url=server.base_url, timeout=120) as http:
            status, text = _post(http, route, case)
        assert status in (200, 400), (status, case, text[:500])
        if status == 400:
            fields = [*case, *case["vllm_xargs"], "prompt", "messages"]
            assert _names_a_field(text, fields), (case, text[:500])
        else:
            # A stream's failure arrives as an error event inside a 200: it must not be a 500 either.
            assert '"code": 500' not in text and '"code":500' not in text, (case, text[:500])
        seen[status] += 1

    check()
    assert seen[200] > 5 and seen[400] > 5, seen  # the strategies reach both kinds
    with httpx.Client(base_url=server.base_url, timeout=60) as http:
        assert _serves_plain(http)


# -- hostile patterns beside plain requests ----------------------------------------------------------

def _plain_latencies(server: Server, count: int, seed: int) -> list[float]:
    """Plain requests one after another, each with its own prompt, 16 tokens out."""
    import httpx

    out = []
    # A connection per request. One CI run saw a plain request's kept-alive connection closed with no response
    # (RemoteProtocolError) while the server served on (the module's later tests passed): a client starved on
    # these 2 cores coming back to the connection as the server closes it for idleness is the likely cause, and
    # httpx does not resend a POST. A fresh connection has no such race; a server that drops requests still fails.
    with httpx.Client(base_url=server.base_url, timeout=120, headers={"Connection": "close"}) as http:
        for i in range(count):
            start = time.perf_counter()
            status, _ = _post(http, "completions", {"prompt": f"Plain request {seed}.{i}: go on.", "max_tokens": 16,
                                                    "temperature": 0.0, "ignore_eos": True})
            assert status == 200
            out.append(time.perf_counter() - start)
    return out


HOSTILE_GROUPS = [
    {"hogwild_layout": "contiguous", "hogwild_answer_pattern": HOSTILE},
    {"hogwild_layout": "combined", "hogwild_step_end": HOSTILE},
]
ORDINARY_GROUPS = [{"hogwild_layout": "contiguous"}, {"hogwild_layout": "combined"}]  # the same groups, no pattern


def _group_loop(base_url: str, kinds: list[dict], started, stop, results) -> None:
    """One group after another (n=2, 96 tokens each, streamed or not) until ``stop``; every outcome, as
    ``(status, body, seconds)``, to ``results``. Runs in a process of its own: in the test's process its reads
    of the groups' streams would hold the plain requests' reads back (one GIL), which showed as plain latency."""
    import httpx

    outcomes = []
    with httpx.Client(base_url=base_url, timeout=300) as http:
        i = 0
        while not stop.is_set():
            text = " ".join(["words and spaces"] * 20)  # what the hostile pattern backtracks on in Python's re
            started.set()
            start = time.perf_counter()
            status, body = _post(http, "completions", {
                "prompt": text, "n": 2, "max_tokens": 96, "ignore_eos": True, "stream": i % 3 == 1,
                "vllm_xargs": kinds[i % len(kinds)]})
            outcomes.append((status, body, time.perf_counter() - start))
            i += 1
    results.put(outcomes)


def _beside(server: Server, kinds: list[dict], seed: int) -> tuple[list[float], list]:
    import multiprocessing
    import queue

    ctx = multiprocessing.get_context("spawn")
    started, stop, results = ctx.Event(), ctx.Event(), ctx.Queue()
    loop = ctx.Process(target=_group_loop, args=(server.base_url, kinds, started, stop, results), daemon=True)
    loop.start()
    try:
        # Hang guards, not speed checks: a spawned process starts in seconds here, a group ends in under one.
        assert started.wait(120), "the group loop never started"
        time.sleep(0.5)  # a group is decoding
        latencies = _plain_latencies(server, 3, seed)
        stop.set()
        try:
            outcomes = results.get(timeout=300)
        except queue.Empty:
            raise AssertionError("a group never ended") from None
    finally:
        loop.join(10)
        if loop.is_alive():
            loop.kill()
    return latencies, outcomes


def test_hostile_patterns_do_not_slow_plain_requests(server) -> None:
    """Plain requests beside groups whose patterns backtrack exponentially in Python's re (one such group froze
    a server before RE2), against the same plain requests beside the same groups without a pattern: the two
    sides alternate, A B B A (tests/timing.py), 6 rounds of 3 plain requests each, and their medians compare.
    On this 2-core machine any running group slows a plain request (the engine core, its worker, the API
    server and this client share the cores), so the comparison isolates what the client controls."""
    from tests.timing import alternating

    _plain_latencies(server, 2, seed=0)  # warm up
    alone = _plain_latencies(server, 6, seed=1)
    rounds = alternating({"ordinary": lambda r: _beside(server, ORDINARY_GROUPS, seed=10 + r),
                          "hostile": lambda r: _beside(server, HOSTILE_GROUPS, seed=20 + r)}, rounds=6)
    ordinary, hostile = ([x for latencies, _ in rounds[side] for x in latencies] for side in ("ordinary", "hostile"))
    groups = [seconds for _, done in rounds["ordinary"] for _, _, seconds in done]
    outcomes = [(status, body) for _, done in rounds["hostile"] for status, body, _ in done]
    a, o, h, g = (statistics.median(x) for x in (alone, ordinary, hostile, groups))
    print(f"\nplain request (16 tokens), median: {a:.3f} s alone, {o:.3f} s beside groups without patterns, "
          f"{h:.3f} s beside {len(outcomes)} hostile groups ({h / o:.2f}x); a group without patterns: {g:.3f} s "
          f"(median of {len(groups)}); plain requests over 0.2 s: {sum(x > 0.2 for x in ordinary)} and "
          f"{sum(x > 0.2 for x in hostile)} of {len(hostile)}")
    assert outcomes and all(status == 200 for status, _ in outcomes), [o[:2] for o in outcomes if o[0] != 200]
    for status, body in outcomes:  # every hostile group finished: both workers, whole budgets
        if body.startswith("{"):
            assert [c["finish_reason"] for c in json.loads(body)["choices"]] == ["length", "length"]
        else:
            assert body.rstrip().endswith("data: [DONE]") and '"error"' not in body
    # The bound: a plain request here may wait about one group's length beside any group, patterns or none
    # (stock vLLM's n=2 requests as often as Hogwild groups: 9 of 30 each, measured with this loop; the engine
    # core's and its worker's spin-waits take the cores), so either side's median may fall on a request that
    # waited or on one that did not: the hostile side's median may exceed the other's by a group's length with
    # no cost from the patterns. The bound, twice the sum of the ordinary median and a group's length (the
    # groups timed beside the same plain requests), grows with whatever else loads the machine, and the A B B A
    # order spreads a load that changes over the rounds on both sides: a loaded run whose lower quartiles failed
    # the 2x bound this test had on them (0.168 s against 0.079 s) is far within it. A pattern that costs engine
    # time on every step breaks it; Python's re on this text does not end a step at all (the requests time out).
    assert h <= 2 * (o + g), (f"plain latency (median) {h:.3f} s beside hostile groups vs {o:.3f} s beside the "
                              f"same groups without, a group {g:.3f} s")


def test_a_pattern_pythons_re_crashes_on_is_a_400_and_the_connection_lives(server) -> None:
    import httpx

    with httpx.Client(base_url=server.base_url, timeout=60) as http:
        for route in ("completions", "chat"):
            for stream in (False, True):
                case = {"n": 2, "stream": stream,
                        "vllm_xargs": {"hogwild_layout": "combined", "hogwild_step_end": "(" * 5000}}
                status, text = _post(http, route, case)
                assert status == 400 and _names_a_field(text, ["hogwild_step_end"]), text[:300]
                assert _serves_plain(http)  # on the same connection


def test_a_seeded_request_with_a_chunked_prefill_then_a_plain_one(server) -> None:
    """The step budget is 256 tokens: a 700-token prompt prefills in chunks. vLLM 0.32 on the CPU
    kills its engine on such a seeded request; this server answers it and serves on."""
    import httpx

    prompt = [100 + (37 * i) % 30000 for i in range(700)]
    with httpx.Client(base_url=server.base_url, timeout=120) as http:
        for case in ({"seed": 3}, {"seed": 4, "n": 2, "vllm_xargs": {"hogwild_layout": "contiguous"}},
                     {"seed": 5, "n": 3}):
            status, text = _post(http, "completions", {"prompt": prompt, "max_tokens": 6, "temperature": 1.0,
                                                       "ignore_eos": True, **case})
            assert status == 200, text[:300]
            assert [len(c["text"]) > 0 for c in json.loads(text)["choices"]] == [True] * case.get("n", 1)
        assert _serves_plain(http)
