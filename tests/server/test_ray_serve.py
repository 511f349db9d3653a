"""examples/ray_serve_app.py: two replicas of the Hogwild server on Ray Serve (local Ray, loopback, tiny model).

Real Ray Serve (its proxy, router, health checks and controller), real `vllm
serve --plugin hogwild` servers inside the replicas, the stock `openai` client
and httpx as callers. One application for the module; the fault test kills one
replica and waits for Ray Serve to replace it.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter

import pytest

from tests.server.conftest import free_port

pytestmark = [pytest.mark.vllm, pytest.mark.server]

NAME = "tiny"
RAW = {"hogwild_protocol": "raw", "hogwild_layout": "contiguous"}


@pytest.fixture(scope="module")
def app_url(tmp_path_factory):
    import ray
    from ray import serve

    from examples.ray_serve_app import app_builder
    from tests.integration.tiny_model import build_tiny_llama
    from tests.ray_cpu import ROOT

    model = build_tiny_llama(tmp_path_factory.mktemp("serve") / "tiny-llama")
    # The replicas' servers run as in production: engine cores in their own processes.
    saved = os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
    env = {"PYTHONPATH": str(ROOT), "VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1"}
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": env})
    port = free_port()
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        args = ["--hogwild-max-workers", "4", "--served-model-name", NAME, "--dtype", "float32",
                "--max-model-len", "2048", "--enforce-eager", "--block-size", "32"]
        serve.run(app_builder({"model": str(model), "replicas": 2, "vllm_args": args}), name="hogwild",
                  route_prefix="/")
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()
        if saved is not None:
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = saved


def post(url: str, body: dict, timeout: float = 120):
    import httpx

    return httpx.post(url + "/v1/completions", json={"model": NAME, **body}, timeout=timeout)


def test_groups_are_served_by_both_replicas_one_group_per_replica(app_url) -> None:
    from concurrent.futures import ThreadPoolExecutor

    body = {"prompt": "Split the list: apples, pears, plums.", "n": 2, "max_tokens": 16, "temperature": 0.8,
            "vllm_xargs": RAW}
    with ThreadPoolExecutor(12) as pool:
        responses = list(pool.map(lambda i: post(app_url, {**body, "seed": i}), range(24)))
    assert all(r.status_code == 200 for r in responses), [r.text[:200] for r in responses if r.status_code != 200]
    for r in responses:
        choices = r.json()["choices"]
        assert sorted(c["index"] for c in choices) == [0, 1]
        assert r.json()["usage"]["completion_tokens"] == 32  # both workers of the group, on the replica that answered
    where = Counter(r.headers["x-hogwild-replica"] for r in responses)
    assert len(where) == 2, where  # Ray Serve spread the load over both replicas


def test_streaming_and_bad_input_pass_through(app_url) -> None:
    import openai

    client = openai.OpenAI(base_url=app_url + "/v1", api_key="EMPTY", max_retries=0)
    indices = Counter()
    stream = client.completions.create(model=NAME, prompt="Count with me:", n=2, max_tokens=8, stream=True,
                                       temperature=0.8, seed=3, extra_body={"vllm_xargs": RAW})
    for chunk in stream:
        for choice in chunk.choices:
            indices[choice.index] += 1
    assert set(indices) == {0, 1}
    with pytest.raises(openai.BadRequestError, match="hogwild_layout"):
        client.completions.create(model=NAME, prompt="x", n=2, max_tokens=4,
                                  extra_body={"vllm_xargs": {"hogwild_layout": "diagonal"}})


def _replica_actor(replica_id: str):
    import ray

    for actor in ray.util.list_named_actors(all_namespaces=True):
        if actor["name"].startswith("SERVE_REPLICA") and actor["name"].endswith(replica_id):
            return ray.get_actor(actor["name"], namespace=actor["namespace"])
    raise LookupError(replica_id)


def _running_replicas() -> int:
    from ray import serve

    app = serve.status().applications["hogwild"]
    [deployment] = app.deployments.values()
    return deployment.replica_states.get("RUNNING", 0)


def test_killed_replica_is_replaced_its_clients_get_errors_the_other_keeps_serving(app_url) -> None:
    import httpx
    import psutil
    import ray

    t0 = time.monotonic()
    timeline: list[tuple[float, str]] = []

    def mark(event: str) -> None:
        timeline.append((time.monotonic() - t0, event))

    results: dict[int, tuple[str, str]] = {}  # i -> (replica, outcome)
    serving: dict[int, tuple[str, int]] = {}  # i -> (replica, its vLLM server's pid), from the headers
    ended: dict[int, float] = {}  # i -> when its outcome came
    started = threading.Barrier(9)

    def stream_one(i: int) -> None:
        body = {"model": NAME, "prompt": f"Request {i}: keep going.", "n": 2, "max_tokens": 600, "stream": True,
                "ignore_eos": True, "seed": i, "vllm_xargs": RAW}
        replica = "?"
        try:
            with httpx.Client(timeout=httpx.Timeout(120, read=60)) as http:
                with http.stream("POST", app_url + "/v1/completions", json=body) as resp:
                    replica = resp.headers.get("x-hogwild-replica", "?")
                    serving[i] = (replica, int(resp.headers.get("x-hogwild-server-pid", "0")))
                    started.wait(30)
                    text = "".join(resp.iter_text())
                    ok = resp.status_code == 200 and text.rstrip().endswith("data: [DONE]")
                    results[i] = (replica, "finished" if ok else "error: stream cut")
        except (httpx.HTTPError, threading.BrokenBarrierError) as err:
            results[i] = (replica, f"error: {type(err).__name__}")
        ended[i] = time.monotonic() - t0

    threads = [threading.Thread(target=stream_one, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    started.wait(60)
    mark("8 streams running")
    time.sleep(1)
    assert not results, results  # all eight still streaming
    load = Counter(serving.values())
    assert len(load) == 2, load  # both replicas hold streams
    (victim_id, server_pid), _ = load.most_common(1)[0]
    server_tree = [psutil.Process(server_pid), *psutil.Process(server_pid).children(recursive=True)]
    assert len(server_tree) >= 3, server_tree  # API server, engine core, model worker
    ray.kill(_replica_actor(victim_id), no_restart=True)
    mark(f"replica {victim_id[:8]} killed")
    # The limits from here on are hang guards, each over 10 times what it waits for on 2 busy cores
    # (docs/deploying.md): the other replica's streams end 12 s after the kill, the killed replica's processes
    # exit within seconds of it, a replacement starts in 48 s.
    for t in threads:
        t.join(150)
    assert not any(t.is_alive() for t in threads), "a client hung after its replica died"
    assert len(results) == 8, results
    victims = [i for i, (r, _) in results.items() if r == victim_id]
    mark(f"the killed replica's {len(victims)} clients had their errors (the last at this time)")
    timeline[-1] = (max(ended[i] for i in victims), timeline[-1][1])
    mark(f"the other replica's {8 - len(victims)} streams finished")
    timeline[-1] = (max(ended[i] for i in ended if i not in victims), timeline[-1][1])
    for i, (replica, outcome) in sorted(results.items()):
        if replica == victim_id:
            assert outcome.startswith("error"), (i, outcome)
        else:
            assert outcome == "finished", (i, replica, outcome)
    assert any(r != victim_id for r, _ in results.values()), "the other replica served none of the streams"

    # The other replica keeps serving while Ray Serve replaces the dead one.
    ok = post(app_url, {"prompt": "still there?", "n": 2, "max_tokens": 4, "vllm_xargs": RAW})
    assert ok.status_code == 200 and ok.headers["x-hogwild-replica"] != victim_id
    mark("the other replica answered")

    # The dead replica's vLLM server went down with it (parent-death signal), engine included.
    deadline = time.monotonic() + 90
    while left := [p.pid for p in server_tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]:
        assert time.monotonic() < deadline, f"the killed replica's vLLM processes {left} are still running"
        time.sleep(1)
    mark("the killed replica's vLLM server, engine core and worker exited")

    deadline = time.monotonic() + 600
    while _running_replicas() < 2 or len(set(_replica_ids(app_url))) < 2:
        assert time.monotonic() < deadline, "Ray Serve did not replace the replica"
        time.sleep(2)
    mark("Ray Serve runs 2 replicas again; both answer")
    print("\n" + "\n".join(f"{t:7.1f} s  {e}" for t, e in sorted(timeline)))
    print({i: r for i, r in sorted(results.items())})


def _replica_ids(app_url: str) -> list[str]:
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(8) as pool:
        responses = list(pool.map(lambda i: post(app_url, {"prompt": f"ping {i}", "max_tokens": 2}), range(16)))
    return [r.headers["x-hogwild-replica"] for r in responses if r.status_code == 200]
