"""Replicas of `vllm serve MODEL --plugin hogwild` behind one OpenAI-compatible endpoint, on Ray Serve.

Run it with the config next to it (two replicas of the default model)::

    .venv/bin/serve run examples/ray_serve.yaml

or with arguments of your own::

    .venv/bin/serve run examples.ray_serve_app:app_builder model=/path/to/model replicas=2

then call ``http://127.0.0.1:8000/v1`` with any OpenAI client, Hogwild fields
included (``vllm_xargs``), streaming or not.

How it works:

- Each replica starts the real vLLM OpenAI server (``vllm serve MODEL --plugin
  hogwild ...``) as its own child process on a free loopback port and forwards
  every request Ray Serve hands it to that server, streams included. Everything
  vLLM's server does (validation, HTTP 400s, the ``hogwild`` answer field,
  metrics) is therefore exactly what one server does.
- Ray Serve routes: its proxy gives each request to a replica chosen by its
  own router (of two random replicas, the one with fewer requests in flight),
  and ``max_ongoing_requests`` caps a replica's share. One HTTP request is one
  Hogwild group, so a group always lives on one replica.
- Every response carries ``x-hogwild-replica`` (the replica's id) and
  ``x-hogwild-server-pid`` (its vLLM server's process), so a client or a test
  can see where it ran.
- A replica whose server has exited fails its health check, and Ray Serve
  replaces it. The server is started with a parent-death signal, so a replica
  that is killed takes its server (and the server its engine) down with it.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
from fastapi import FastAPI, Request
from ray import serve
from starlette.background import BackgroundTask
from starlette.responses import Response, StreamingResponse

api = FastAPI()

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "content-encoding", "date", "server"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the replica process dies (Linux prctl PR_SET_PDEATHSIG)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)
    except OSError:
        pass


def _vllm_command() -> list[str]:
    script = Path(sys.executable).parent / "vllm"
    return [str(script)] if script.exists() else [sys.executable, "-m", "vllm.entrypoints.cli.main"]


@serve.deployment(
    num_replicas=2,
    max_ongoing_requests=64,
    health_check_period_s=2,
    health_check_timeout_s=30,
    graceful_shutdown_timeout_s=5,
    ray_actor_options={"num_cpus": 0},
)
@serve.ingress(api)
class HogwildServer:
    def __init__(self, model: str, vllm_args: list[str] | None = None, startup_timeout_s: float = 900) -> None:
        self.port = _free_port()
        self.replica = serve.get_replica_context().replica_id.unique_id
        argv = [*_vllm_command(), "serve", model, "--plugin", "hogwild", "--host", "127.0.0.1",
                "--port", str(self.port), *(vllm_args or [])]
        self.proc = subprocess.Popen(argv, preexec_fn=_die_with_parent)
        self.base_url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + startup_timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vllm serve exited with {self.proc.returncode} during start-up")
            try:
                if httpx.get(self.base_url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self._stop()
                raise TimeoutError(f"vllm serve not ready after {startup_timeout_s} s")
            time.sleep(1)
        self.client = httpx.AsyncClient(base_url=self.base_url, timeout=None)

    @api.api_route("/{path:path}", methods=["GET", "POST"])
    async def forward(self, path: str, request: Request) -> Response:
        headers = {k: v for k, v in request.headers.items() if k.lower() in ("content-type", "authorization", "accept")}
        upstream = self.client.build_request(request.method, "/" + path, params=request.query_params,
                                             content=await request.body(), headers=headers)
        resp = await self.client.send(upstream, stream=True)
        out_headers = {k: v for k, v in resp.headers.items() if k.lower() not in HOP_BY_HOP}
        out_headers["x-hogwild-replica"] = self.replica
        out_headers["x-hogwild-server-pid"] = str(self.proc.pid)
        if resp.headers.get("content-type", "").startswith("text/event-stream"):
            # Closing the upstream response when the client goes away makes vLLM abort the request.
            return StreamingResponse(resp.aiter_raw(), status_code=resp.status_code, headers=out_headers,
                                     background=BackgroundTask(resp.aclose))
        body = await resp.aread()
        await resp.aclose()
        return Response(body, status_code=resp.status_code, headers=out_headers)

    def check_health(self) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(f"vllm serve exited with {self.proc.returncode}")
        httpx.get(self.base_url + "/health", timeout=10).raise_for_status()

    def _stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __del__(self) -> None:
        self._stop()


def app_builder(args: dict) -> serve.Application:
    """``serve run examples.ray_serve_app:app_builder model=... replicas=2 [gpus_per_replica=1] [vllm_args='...']``.

    ``gpus_per_replica`` (default 0, for CPU nodes): Ray gives each replica that many
    GPUs (``CUDA_VISIBLE_DEVICES``), which its vLLM server inherits; with
    ``tensor_parallel_size`` in ``vllm_args`` it should equal that size.
    """
    model = args.get("model") or os.environ.get("HOGWILD_MODEL")
    if not model:
        from vllm_hogwild.models.default import prepare

        model = str(prepare(verbose=False))
    vllm_args = args.get("vllm_args", [])
    if isinstance(vllm_args, str):
        vllm_args = vllm_args.split()
    replicas = int(args.get("replicas", 2))
    if replicas < 1:
        raise ValueError(f"replicas: must be at least 1, got {replicas}")
    gpus = float(args.get("gpus_per_replica", 0))
    if gpus < 0:
        raise ValueError(f"gpus_per_replica: must be at least 0, got {gpus}")
    return HogwildServer.options(num_replicas=replicas, ray_actor_options={"num_cpus": 0, "num_gpus": gpus}).bind(
        model, list(vllm_args))
