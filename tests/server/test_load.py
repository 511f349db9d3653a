"""One real `vllm serve --plugin hogwild` (tiny random Llama) under load, and a killed engine.

The module's server has a deliberately small KV cache (72 blocks of 32 tokens, a little more than one 2,048-token context)
and room for more sequences than that cache holds, so that the load test's concurrency saturates the cache (groups take
their blocks as they grow, and some are preempted and replayed), and runs with ``--hogwild-client-patterns off``.
The tests run in file order: the load test, then the fault test, which kills the engine.
Hostile clients (fuzzing, patterns) have their own module, ``test_hostile_clients.py``.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import os
import re
import signal
import threading
import time

import pytest

from tests.server.conftest import Server
from vllm_hogwild.serving.loadtest import fairness, make_mix, markdown, run_load, summarize

pytestmark = [pytest.mark.vllm, pytest.mark.server]

NAME = "tiny"
KV_BLOCKS = 72


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from tests.integration.tiny_model import build_tiny_llama

    tmp = tmp_path_factory.mktemp("load")
    model = build_tiny_llama(tmp / "tiny-llama")
    srv = Server(model, ["--plugin", "hogwild", "--hogwild-max-workers", "4", "--block-size", "32",
                         "--num-gpu-blocks-override", str(KV_BLOCKS), "--max-num-seqs", "64",
                         "--hogwild-client-patterns", "off"],
                 tmp / "server.log", name=NAME)
    try:
        yield srv.wait_ready()
    finally:
        srv.stop()


def wait_idle(server: Server, timeout: float = 120.0) -> None:
    # A hang guard: the Hogwild gauges reach the front end on vLLM's stats call every 10 s at worst.
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        busy = (server.metric("vllm:num_requests_running") + server.metric("vllm:num_requests_waiting")
                + server.metric("hogwild:groups_running") + server.metric("hogwild:groups_waiting"))
        if busy == 0:
            return
        time.sleep(0.5)
    raise TimeoutError(f"server still busy after {timeout} s")


def free_blocks_when_idle(server: Server, settled) -> float:
    """The scheduler's free-block count once idle, as its last step reported it (a 1-token request first,
    so that a step has run since the last request ended). The engine's snapshot of that step travels on the
    plugin's own channel and may arrive after the step's outputs; the front end then takes it on vLLM's
    periodic stats call (every 10 s): read until ``settled(count)`` holds or 120 s (12 such calls) pass, and
    return the count."""
    import httpx

    wait_idle(server)
    httpx.post(server.base_url + "/v1/completions", json={"model": NAME, "prompt": "idle", "max_tokens": 1},
               timeout=60).raise_for_status()
    wait_idle(server)
    deadline = time.monotonic() + 120
    while not settled(free := server.metric("hogwild:kv_cache_free_blocks")) and time.monotonic() < deadline:
        time.sleep(0.5)
    return free


def requests_queued_over(server: Server, seconds: float = 0.3) -> float:
    """Requests (plain ones and group workers) that spent more than ``seconds`` in WAITING before their first
    step, from vLLM's own ``vllm:request_queue_time_seconds`` histogram (printed: how the load queued)."""
    text = server.metrics()
    name = "vllm:request_queue_time_seconds"
    total = server.metric(name + "_count", text)
    within = re.findall(rf'^{re.escape(name)}_bucket\{{[^}}]*le="{seconds}"[^}}]*\}} (\S+)$', text, re.M)
    assert len(within) == 1, f"{name}: no single bucket at le={seconds}"
    return total - float(within[0])


def test_300_mixed_requests_all_complete_or_cancel_and_no_block_leaks(server, tmp_path) -> None:
    free_at_start = free_blocks_when_idle(server, lambda free: KV_BLOCKS - 2 <= free <= KV_BLOCKS)
    assert KV_BLOCKS - 2 <= free_at_start <= KV_BLOCKS
    specs = make_mix(300, max_tokens=24, seed=0)
    queued_before = requests_queued_over(server)
    preempted_before = server.metric("vllm:num_preemptions_total")
    start = time.perf_counter()
    outcomes = asyncio.run(run_load(server.base_url + "/v1", NAME, specs, concurrency=48, deadline_s=240))
    wall = time.perf_counter() - start
    rows = summarize(outcomes)
    queued = requests_queued_over(server) - queued_before
    preempted = server.metric("vllm:num_preemptions_total") - preempted_before
    print(f"\n{markdown(rows)}\n300 requests in {wall:.1f} s; requests queued over 0.3 s {queued:.0f}; "
          f"preemptions {preempted:.0f} (group preemptions {server.metric('hogwild:group_preemptions_total'):.0f}); "
          f"plain p50 / group p50 = {fairness(rows, 'p50_s'):.2f}, p95 / p95 = {fairness(rows):.2f}")
    (tmp_path / "load.json").write_text(json.dumps(rows))

    # The load saturated the cache: the engine preempted (it does only when a step's blocks do not fit: the
    # cache was full, and the preempted requests queued again for room). Counted by the engine itself: a
    # /metrics poll during the load missed it on a loaded 2-core machine, and how long new requests queue
    # depends on how fast the engine runs (0 requests over 0.3 s in one clean-clone run, 380 and 526 in runs
    # alone).
    assert preempted > 0
    # Under pressure groups are preempted whole, never one worker alone.
    exposed = server.metrics()
    assert all(f"hogwild:{name}_total{{" in exposed for name in ("member_preemptions", "group_preemptions", "replayed_tokens"))
    assert server.metric("hogwild:member_preemptions_total") == 0
    # A client cancels after reading its spec's chunks; one whose whole answer came in fewer (vLLM merges a stream's
    # pending outputs while its client reads late, as 48 streams on a loaded 2-core machine may) has nothing left
    # to cancel: it completes.
    early = {o.spec.index for o in outcomes if o.spec.cancel_after is not None and o.status == "completed"
             and o.chunks < o.spec.cancel_after}
    for o in outcomes:
        expected = "cancelled" if o.spec.cancel_after is not None and o.spec.index not in early else "completed"
        assert o.status == expected, (o.spec, o.status, o.reason, o.chunks)
        if o.status == "completed":
            assert len(o.texts) == o.spec.n
    if early:
        print(f"streams that ended before their cancel point: {sorted(early)}")
    assert {r["kind"]: r["cancelled"] for r in rows[:3]} == {
        kind: sum(s.cancel_after is not None and s.kind == kind and s.index not in early for s in specs)
        for kind in ("plain", "hogwild-2", "hogwild-4")
    }

    # Every block is back in the pool once the server is idle (cancelled groups included).
    assert free_blocks_when_idle(server, lambda free: free == free_at_start) == free_at_start

    # Plain greedy requests gave under load what they give alone.
    import openai

    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="EMPTY", max_retries=0)
    plain = [o for o in outcomes if o.spec.kind == "plain"]
    assert len(plain) == 120
    for o in plain:
        alone = client.completions.create(model=NAME, prompt=o.spec.prompt, max_tokens=o.spec.max_tokens,
                                          temperature=0.0)
        assert alone.choices[0].text == o.texts[0], o.spec.index

    # Fairness (--hogwild-max-plain-wait): plain requests do not wait much longer than groups. Both classes run
    # in the one shuffled load, side by side in time, so whatever else loads the machine weighs on both; the
    # check compares medians (120 plain requests, about 160 group ones), not the p95 target (at most 1.25x: a
    # p95 of 120 requests on 2 loaded cores is noisy, and a target is the benchmark's,
    # benchmarks/load_fairness.py). The bound, plain p50 at most 1.5x the lowest group class's p50: measured
    # 0.87x with the rule (1.42 s against 1.62 s), 1.96x before it (5.81 s against 2.96 s for groups of 2,
    # which went ahead whenever they fitted). 1.5x leaves 1.7 times the measured ratio, and the behaviour
    # without the rule still fails it.
    assert fairness(rows, "p50_s") <= 1.5, markdown(rows)


def test_client_patterns_off_refuses_them_and_keeps_the_built_in_ones(server) -> None:
    import httpx

    for xargs, field in [({"hogwild_answer_pattern": "(a)"}, "hogwild_answer_pattern"),
                         ({"hogwild_layout": "combined", "hogwild_step_end": "x"}, "hogwild_step_end")]:
        resp = httpx.post(server.base_url + "/v1/completions", timeout=60, json={
            "model": NAME, "prompt": "hi", "n": 2, "max_tokens": 4, "vllm_xargs": xargs})
        assert resp.status_code == 400, resp.text
        error = resp.json()["error"]
        assert error["param"] == field and "built-in" in error["message"], error
    resp = httpx.post(server.base_url + "/v1/completions", timeout=60, json={
        "model": NAME, "prompt": "What is 2 + 2?", "n": 2, "max_tokens": 12, "vllm_xargs": {"hogwild_protocol": "collab"}})
    assert resp.status_code == 200 and "hogwild" in resp.json(), resp.text


# -- faults: the engine's worker process killed mid-load --------------------------------------------

def _tree(pid: int):
    import psutil

    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def test_killed_engine_worker_gives_clean_errors_and_no_zombies(server) -> None:
    import httpx
    import psutil

    wait_idle(server)
    # Orphans of the server are re-parented to this process, which reaps them below: a
    # container's PID 1 need not reap, and an exited process it left unreaped is no leak of ours.
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(36, 1)  # PR_SET_CHILD_SUBREAPER
    procs = _tree(server.proc.pid)
    names = {p.pid: " ".join(p.cmdline())[:80] for p in procs}
    assert len(procs) >= 2, names
    # The model worker: the deepest process (API server -> engine core -> worker).
    depth = {procs[0].pid: 0}
    for p in procs[1:]:
        chain, q = [], p
        while q.pid not in depth:
            chain.append(q)
            q = q.parent()
        for k, r in enumerate(reversed(chain), start=1):
            depth[r.pid] = depth[q.pid] + k
    worker = max(procs, key=lambda p: depth[p.pid])
    assert depth[worker.pid] == 2, {names[p.pid]: depth[p.pid] for p in procs}
    worker_name = worker.name()

    results: list[str] = []
    ended_at: dict[int, float] = {}  # when each stream's last byte reached this client
    streaming = threading.Semaphore(0)  # released once per stream that has received tokens

    def stream_one(i: int) -> None:
        # 4 groups of 2 x 1,000 tokens: one group's 2,000 tokens take 63 of the 72 blocks, so the groups share the
        # cache by preemption and replay, and the work (thousands of steps) outlasts any delay in the kill.
        body = {"model": NAME, "prompt": f"Request {i}: keep going.", "max_tokens": 1000, "n": 2, "stream": True,
                "ignore_eos": True, "vllm_xargs": {"hogwild_protocol": "raw", "hogwild_layout": "contiguous"}}
        try:
            with httpx.Client(base_url=server.base_url, timeout=60) as http:
                with http.stream("POST", "/v1/completions", json=body) as resp:
                    if resp.status_code != 200:
                        results.append(f"http {resp.status_code}: {resp.read()[:200]!r}")
                        return
                    text, released = "", False
                    for piece in resp.iter_text():
                        text += piece
                        if not released and '"text"' in text:
                            streaming.release()
                            released = True
                    ended_at[i] = time.monotonic()
                    ended = text.rstrip().endswith("data: [DONE]") and '"error"' not in text
                    if not ended:
                        results.append("error event or cut stream")
                        return
                    reasons = {}
                    for line in text.splitlines():
                        if line.startswith("data: {"):
                            for choice in json.loads(line[6:]).get("choices", []):
                                if choice.get("finish_reason"):
                                    reasons[choice["index"]] = choice["finish_reason"]
                    # a stream that ended normally is a group the engine completed before the kill
                    results.append("finished" if reasons == {0: "length", 1: "length"} else f"false success {reasons}")
        except httpx.HTTPError as err:
            results.append(type(err).__name__)

    threads = [threading.Thread(target=stream_one, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    # The limits below are hang guards, each at least 10 times what it waits for here: a stream's first tokens
    # within a second, every stream's end 0.1 s and the API server's exit 0.8 s after the kill (docs/deploying.md).
    for _ in range(2):  # two groups are decoding
        assert streaming.acquire(timeout=60), results
    start = time.monotonic()
    os.kill(worker.pid, signal.SIGKILL)
    for t in threads:
        t.join(90)
    elapsed = time.monotonic() - start
    assert not any(t.is_alive() for t in threads), "a client hung after the engine died"
    # A group that completed its 1,000 tokens before the kill ended normally, with both sequences at their
    # length; every request in flight ended with an error (an error event, a cut stream, or a 5xx for a request
    # whose stream had not begun), never a false success or a client error. The cache holds one whole group, so
    # the four end one after another, thousands of steps apart, and the kill falls while some are in flight. How
    # many finished first is not bounded here: on 2 cores this client may read a stream long after the server
    # wrote it (docs/deploying.md, hostile clients), and a CI run saw three finish.
    after_kill = {i: round(t - start, 2) for i, t in sorted(ended_at.items())}
    assert len(results) == 4, (results, after_kill)
    assert not any(r.startswith(("http 4", "false success")) for r in results), (results, after_kill)
    assert results.count("finished") < 4, (results, after_kill)
    print(f"\nworker {worker.pid} ({worker_name}) killed; the streams ended within {elapsed:.1f} s: {results} "
          f"(s after the kill, by stream: {after_kill})")

    # The server answers new requests with an error, or has exited; either way, within seconds.
    try:
        status = httpx.post(server.base_url + "/v1/completions", json={"model": NAME, "prompt": "hi", "max_tokens": 2},
                            timeout=30).status_code
        assert status >= 500
    except httpx.HTTPError:
        pass
    server.proc.wait(timeout=120)  # vLLM shuts its API server down when the engine dies
    print(f"the server exited with {server.proc.returncode} {time.monotonic() - start:.1f} s after the kill")
    deadline = time.monotonic() + 30
    while True:
        try:  # reap what was re-parented here
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        except ChildProcessError:
            pass
        left = [names[p.pid] for p in procs if psutil.pid_exists(p.pid)]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert not left, left
