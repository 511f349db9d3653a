"""vLLM's Ray executor on a CPU-only machine, for tests: a shim, because the real thing refuses to run here.

vLLM 0.32 places one Ray actor per rank on a placement-group bundle of the
platform's Ray device key, and a platform without a key is refused
("current platform cpu does not support ray", ``v1/executor/ray_utils.py``).
The CPU platform has none, so stock vLLM cannot use
``distributed_executor_backend="ray"`` on a CPU at all. This shim gives the CPU
platform the key ``"GPU"`` and starts Ray with as many *logical* GPUs as the
engine has ranks (to Ray a GPU is a counted resource; nothing touches a GPU), in
this process and, through Ray's ``worker_process_setup_hook``, in every Ray
worker process before it runs anything.

Everything else is vLLM's and Ray's own code: the placement group, one actor per
rank, the plugin loading inside each actor, the compiled Ray graph that carries
every step's ``SchedulerOutput`` (with the Hogwild views) to the actors.
"""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def give_cpu_a_ray_device(key: str = "GPU") -> None:
    from vllm.platforms.cpu import CpuPlatform

    CpuPlatform.ray_device_key = key


def start_ray(num_ranks: int) -> None:
    """A local Ray instance with ``num_ranks`` logical GPUs; the CPU platform patched everywhere."""
    import ray

    give_cpu_a_ray_device()
    python_path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    ray.init(
        num_cpus=max(2, os.cpu_count() or 2),
        num_gpus=num_ranks,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={
            "worker_process_setup_hook": "tests.ray_cpu.give_cpu_a_ray_device",
            "env_vars": {"PYTHONPATH": python_path},
        },
    )


def stop_ray() -> None:
    import ray

    if ray.is_initialized():
        ray.shutdown()
    give_cpu_a_ray_device("")  # vLLM's own value
