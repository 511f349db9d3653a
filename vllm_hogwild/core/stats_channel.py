"""The plugin's own channel for its metrics, from the engine core to the front end.

vLLM sends the front end one ``SchedulerStats`` per step, whose fields are all
vLLM's (a ``KV connector`` dict among them, which other code reads as "a
connector is in use"); a plugin has no field of its own there. So the
scheduler pushes its snapshot (:meth:`~vllm_hogwild.core.stats.HogwildStats.snapshot`,
plain data as JSON) on a ZeroMQ PUSH socket to an IPC address the switch chose
for this engine (``additional_config["hogwild_runtime"]["stats"]``), and the
front end's :class:`~vllm_hogwild.serving.metrics.HogwildStatLogger` pulls it.
Sends never block: with nobody listening (an offline ``LLM`` without stats) a
snapshot is dropped. ``patches/06-scheduler-plugin-stats.patch`` is the
upstream field that would retire this channel.
"""

from __future__ import annotations

import json
import os
import tempfile
import uuid
from typing import Any

HIGH_WATER_MARK = 1000  # snapshots queued for a slow reader before new ones are dropped


def new_address() -> str:
    """A fresh IPC address for one engine's channel."""
    return f"ipc://{os.path.join(tempfile.gettempdir(), f'vllm-hogwild-stats-{uuid.uuid4().hex}')}"


class StatsSender:
    def __init__(self, address: str, engine_index: int = 0) -> None:
        import zmq

        self.engine_index = engine_index
        self._socket = zmq.Context.instance().socket(zmq.PUSH)
        self._socket.setsockopt(zmq.SNDHWM, HIGH_WATER_MARK)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.IMMEDIATE, 1)  # queue only for a connected reader
        self._socket.connect(address)
        self._again = zmq.Again

    def send(self, snapshot: dict[str, Any]) -> bool:
        """Push one snapshot; False when nobody reads (it is dropped)."""
        try:
            self._socket.send(json.dumps({"engine": self.engine_index, **snapshot}).encode(), flags=1)  # NOBLOCK
            return True
        except self._again:
            return False

    def close(self) -> None:
        self._socket.close(linger=0)


class StatsReceiver:
    def __init__(self, address: str) -> None:
        import zmq

        self._socket = zmq.Context.instance().socket(zmq.PULL)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.bind(address)
        self._again = zmq.Again

    def drain(self) -> list[dict[str, Any]]:
        """Every snapshot waiting, oldest first, without blocking."""
        out = []
        while True:
            try:
                out.append(json.loads(self._socket.recv(flags=1)))  # NOBLOCK
            except self._again:
                return out

    def close(self) -> None:
        self._socket.close(linger=0)
