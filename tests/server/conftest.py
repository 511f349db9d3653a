"""A real `vllm serve` subprocess on 127.0.0.1 for the server tests, started as a user types it."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

VLLM = Path(sys.executable).parent / "vllm"  # the console script the project's set-up installs
# A hang guard: a server starts in 50-70 s on 2 cores beside the other pytest worker (the server modules' set-up
# in a whole suite's run; a Ray Serve replica's replacement took 48 s); 900 s is over 12 times that.
STARTUP_TIMEOUT_S = 900


def server_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    # tests/conftest.py keeps engine cores in the test process; a server runs
    # them as in production, in their own process.
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    env["OMP_NUM_THREADS"] = "1"  # the thread count a server picks on this machine; offline references match it
    env.update(extra)
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """``vllm serve MODEL ARGS`` until :meth:`stop`; its log is kept in ``log_path``."""

    def __init__(self, model: Path | str, args: list[str], log_path: Path, name: str = "model") -> None:
        self.port = free_port()
        self.name = name
        self.log_path = log_path
        self.argv = [str(VLLM), "serve", str(model), *args, "--host", "127.0.0.1", "--port", str(self.port),
                     "--served-model-name", name, "--dtype", "float32", "--max-model-len", "2048",
                     "--enforce-eager"]
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen(self.argv, stdout=self._log, stderr=subprocess.STDOUT, env=server_env(),
                                     start_new_session=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float = STARTUP_TIMEOUT_S) -> "Server":
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(self.base_url + "/v1/models", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(1)
        raise TimeoutError(f"server not ready after {timeout} s:\n{self.log_tail()}")

    def log_tail(self, n: int = 60) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])

    def metrics(self) -> str:
        import httpx

        return httpx.get(self.base_url + "/metrics", timeout=10).text

    def metric(self, name: str, exposition: str | None = None) -> float:
        """One sample of ``name`` (labels ignored) in ``exposition`` (default: a scrape now); 0.0 when the series
        has no sample yet."""
        text = self.metrics() if exposition is None else exposition
        found = re.findall(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$", text, re.M)
        assert len(found) <= 1, f"{name}: {len(found)} samples"
        return float(found[0]) if found else 0.0

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)  # the server and the engine processes it started
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait()
        self._log.close()


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    from vllm_hogwild.models.default import prepare

    return prepare(verbose=False)
