"""Hogwild groups on vLLM's Ray executor, and over two tensor-parallel ranks (CPU, tiny random Llama).

The Ray executor needs a shim here (see ``tests/ray_cpu.py``: vLLM 0.32's CPU
platform has no Ray device key, so stock vLLM refuses Ray on a CPU). With it,
one Ray actor per rank runs vLLM's worker; every step's views travel inside the
``SchedulerOutput`` over Ray's compiled graph, as on a GPU cluster.

Tensor parallelism: the tiny model has 2 KV heads, so 2 ranks hold one KV head
each. Every rank receives the same views from the one scheduler and reads its
own heads with them; a rank that derived other views would break the oracle
match. It runs on 2 CPU cores (one per rank), and on a machine with 2+ GPUs the
same engine arguments give 2 GPU ranks.
"""

from __future__ import annotations

import os

import pytest

from tests.integration.conftest import make_llm, shutdown
from tests.integration.test_offline import (  # noqa: F401 (oracle: a fixture)
    CASES, check_one_worker_equals_plain, hogwild_params, oracle, prompt_ids, sampled_logprobs,
)

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

def oracle_errors(llm, oracle) -> list[float]:
    """The raw oracle cases of test_offline in one generate call: max |logprob - oracle| per group."""
    prompts = [{"prompt_token_ids": prompt_ids(p, seed=1000 + i)} for i, (_, p) in enumerate(CASES)]
    params = [hogwild_params(n, 48, seed=100 + i) for i, (n, _) in enumerate(CASES)]
    errors = []
    for prompt, out, (n, _) in zip(prompts, llm.generate(prompts, params, use_tqdm=False), CASES):
        assert len(out.outputs) == n
        tokens = [list(c.token_ids) for c in out.outputs]
        assert all(len(t) == 48 for t in tokens)
        expected = oracle.logprobs(prompt["prompt_token_ids"], tokens)
        got = [sampled_logprobs(c) for c in out.outputs]
        errors.append(max(abs(a - b) for g, e in zip(got, expected) for a, b in zip(g, e)))
    return errors


def where_workers_run(llm) -> list[dict]:
    def probe(worker) -> dict:
        import os

        import ray

        ctx = ray.get_runtime_context() if ray.is_initialized() else None
        return {"pid": os.getpid(), "worker": type(worker.worker).__name__,
                "actor": ctx.get_actor_id() if ctx is not None else None}

    return llm.collective_rpc(probe)


@pytest.fixture(scope="module")
def ray_llm(tiny_model):
    from tests.ray_cpu import start_ray, stop_ray

    os.environ.setdefault("VLLM_USE_RAY_COMPILED_DAG_CHANNEL_TYPE", "shm")
    start_ray(num_ranks=1)
    engine = make_llm(tiny_model, distributed_executor_backend="ray",
                      additional_config={"hogwild": {"max_workers": 4}})
    yield engine
    shutdown(engine)
    stop_ray()


def test_ray_executor_runs_the_plugin_in_a_ray_actor(ray_llm) -> None:
    [info] = where_workers_run(ray_llm)
    assert info["worker"] == "HogwildCPUWorker"
    assert info["actor"] is not None, "the model worker should be a Ray actor"
    assert info["pid"] != os.getpid()


def test_ray_executor_matches_the_dense_oracle(ray_llm, oracle) -> None:
    errors = oracle_errors(ray_llm, oracle)
    assert max(errors) <= 1e-4, errors


def test_ray_executor_one_worker_equals_plain_request(ray_llm) -> None:
    check_one_worker_equals_plain(ray_llm, max_tokens=24)


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="two tensor-parallel ranks need 2 CPU cores")
def test_two_tensor_parallel_ranks_match_the_dense_oracle(tiny_model, oracle, ray_llm, monkeypatch) -> None:
    """TP = 2 on vLLM's multiprocessing executor (the CPU's own TP path), beside the Ray engine."""
    from vllm import envs

    # One core per rank: vLLM binds a CPU worker's threads per NUMA node unless told, and
    # this machine has one node. vLLM caches its environment once an engine has started.
    envs.disable_envs_cache()
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0|1")
    engine = make_llm(tiny_model, tensor_parallel_size=2, distributed_executor_backend="mp",
                      additional_config={"hogwild": {"max_workers": 4}})
    try:
        infos = where_workers_run(engine)
        assert [i["worker"] for i in infos] == ["HogwildCPUWorker"] * 2
        assert len({i["pid"] for i in infos}) == 2
        errors = oracle_errors(engine, oracle)
        assert max(errors) <= 1e-4, errors
    finally:
        shutdown(engine)
        envs.disable_envs_cache()  # later engines read the restored binding
