"""Hogwild Prometheus series on the server's ``/metrics``, beside vLLM's own.

The facts live in the engine core (the scheduler admits groups, counts their
prefill and what each worker reads); ``/metrics`` is served by the front end.
They travel on the plugin's own channel (:mod:`vllm_hogwild.core.stats_channel`):
the scheduler pushes a plain-data snapshot every step, and
:class:`HogwildStatLogger`, which the plugin adds to the front end's stat
loggers when Hogwild is on, pulls every waiting snapshot each time vLLM hands it
a step's stats. vLLM's own ``SchedulerStats`` are left exactly as vLLM made them.
``patches/06-scheduler-plugin-stats.patch`` is the upstream field that would
retire the channel.

Series (labels ``model_name`` and ``engine``, like vLLM's):

=========================================  =========  ==================================================
``hogwild:groups_running``                 gauge      groups admitted and not ended
``hogwild:groups_waiting``                 gauge      groups gathering their workers or waiting for room
``hogwild:kv_cache_free_blocks``           gauge      KV blocks free for new requests (vLLM's free queue,
                                                      prefix-cached blocks included)
``hogwild:workers_per_group``              histogram  ``n`` of each ended group
``hogwild:group_generation_tokens``        histogram  tokens all workers of a group generated
``hogwild:coworker_tokens_read``           histogram  per worker: co-worker tokens it attended, summed
                                                      over its decode steps (``_sum``: all workers)
``hogwild:prefill_tokens_saved_total``     counter    prompt tokens computed once for a group instead of
                                                      once per worker
``hogwild:group_latency_seconds``          histogram  first worker's arrival at the scheduler to group end
``hogwild:admission_wait_seconds``         histogram  first worker's arrival to the group's admission
``hogwild:groups_ended_total``             counter    groups ended (finished or aborted)
``hogwild:member_preemptions_total``       counter    a group's worker preempted alone (by design 0)
``hogwild:group_preemptions_total``        counter    groups preempted whole under KV pressure (``--hogwild-kv
                                                      on-demand``); each resumes by exact replay
``hogwild:replayed_tokens_total``          counter    tokens resumed groups re-fed (the prompt's cached
                                                      blocks excluded)
``hogwild:attention_info``                 gauge      1, labelled ``path``: the segment-attention path
                                                      the engine runs (``cpu-op``, ``torch``, ``triton``),
                                                      and ``isa``: the CPU op's vector path (``avx512``,
                                                      ``avx2``, ``generic``; ``none`` off ``cpu-op``)
=========================================  =========  ==================================================
"""

from __future__ import annotations

from typing import Any

from vllm.v1.metrics.loggers import AggregateStatLoggerBase

from vllm_hogwild.attention.paths import isa_of, path_of
from vllm_hogwild.core.options import runtime_of
from vllm_hogwild.core.stats_channel import StatsReceiver
from vllm_hogwild.core.log import get_logger

logger = get_logger(__name__)

PREFIX = "hogwild:"

_LATENCY_BUCKETS = [0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 2400]
_WAIT_BUCKETS = [0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300]
_WORKER_BUCKETS = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64]
_TOKEN_BUCKETS = [4**k for k in range(2, 12)]


def _unregister_ours() -> None:
    from prometheus_client import REGISTRY

    for collector in list(REGISTRY._collector_to_names):
        if getattr(collector, "_name", "").startswith(PREFIX):
            REGISTRY.unregister(collector)


class HogwildStatLogger(AggregateStatLoggerBase):
    """Turns the scheduler's snapshots into the Hogwild series (one label set per engine)."""

    def __init__(self, vllm_config, engine_indexes: list[int] | None = None) -> None:
        from prometheus_client import Counter, Gauge, Histogram

        _unregister_ours()  # a new engine in this process replaces the previous one's series
        self.engine_indexes = engine_indexes or [0]
        model_name = vllm_config.model_config.served_model_name
        labels = ["model_name", "engine"]

        def per_engine(metric):
            return {i: metric.labels(model_name, str(i)) for i in self.engine_indexes}

        def gauge(name, doc):
            return per_engine(Gauge(PREFIX + name, doc, labels, multiprocess_mode="mostrecent"))

        def counter(name, doc):
            return per_engine(Counter(PREFIX + name, doc, labels))

        def histogram(name, doc, buckets):
            return per_engine(Histogram(PREFIX + name, doc, labels, buckets=buckets))

        self.groups_running = gauge("groups_running", "Hogwild groups admitted and not ended.")
        self.groups_waiting = gauge("groups_waiting", "Hogwild groups gathering their workers or waiting for room.")
        self.free_blocks = gauge("kv_cache_free_blocks", "KV cache blocks free for new requests.")
        self.workers = histogram("workers_per_group", "Workers (n) of each ended Hogwild group.", _WORKER_BUCKETS)
        self.generation = histogram(
            "group_generation_tokens", "Tokens all workers of an ended Hogwild group generated.", _TOKEN_BUCKETS
        )
        self.reads = histogram(
            "coworker_tokens_read",
            "Per worker of an ended Hogwild group: co-worker tokens it attended, summed over its decode steps.",
            _TOKEN_BUCKETS,
        )
        self.prefill_saved = counter(
            "prefill_tokens_saved", "Prompt tokens computed once for a Hogwild group instead of once per worker."
        )
        self.latency = histogram(
            "group_latency_seconds", "A Hogwild group's first arrival at the scheduler to its end.", _LATENCY_BUCKETS
        )
        self.admission_wait = histogram(
            "admission_wait_seconds", "A Hogwild group's first arrival at the scheduler to its admission.",
            _WAIT_BUCKETS,
        )
        self.ended = counter("groups_ended", "Hogwild groups ended (finished or aborted).")
        self.preemptions = counter("member_preemptions", "A Hogwild group's worker preempted alone (by design never).")
        self.group_preemptions = counter("group_preemptions", "Hogwild groups preempted whole under KV pressure.")
        self.replayed = counter("replayed_tokens", "Tokens resumed Hogwild groups re-fed with their views.")
        info = Gauge(PREFIX + "attention_info",
                     "The Hogwild attention path this engine runs (label path; isa: the CPU op's vector path).",
                     [*labels, "path", "isa"], multiprocess_mode="mostrecent")
        path = path_of(vllm_config.additional_config) or "none"
        isa = isa_of(vllm_config.additional_config) or "none"
        for i in self.engine_indexes:
            info.labels(model_name, str(i), path, isa).set(1)
        self._seen = {i: {"member_preemptions": 0, "group_preemptions": 0, "replayed_tokens": 0}
                      for i in self.engine_indexes}
        self._channel = self._open_channel(vllm_config)

    @staticmethod
    def _open_channel(vllm_config):
        address = runtime_of(vllm_config.additional_config).get("stats")
        if not address:
            return None
        try:
            return StatsReceiver(address)
        except Exception as err:  # e.g. a second API server process of the same engine
            logger.warning("Hogwild metrics channel unavailable here (%s); Hogwild series stay empty", err)
            return None

    def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0) -> None:
        self._drain()

    def log(self) -> None:
        """vLLM's periodic stats call (every ``VLLM_LOG_STATS_INTERVAL`` seconds): the snapshot of an engine's
        last step travels on its own channel and can arrive after that step's outputs were recorded; once the
        engine is idle no output comes to drain it, so the periodic call does."""
        self._drain()

    def _drain(self) -> None:
        if self._channel is not None:
            for snap in self._channel.drain():
                self.apply(snap)

    def apply(self, snap: dict[str, Any]) -> None:
        """One engine's snapshot (:meth:`vllm_hogwild.core.stats.HogwildStats.snapshot`) into the series."""
        i = snap.get("engine", 0)
        if i not in self.groups_running:
            return
        self.groups_running[i].set(snap["groups_running"])
        self.groups_waiting[i].set(snap["groups_waiting"])
        self.free_blocks[i].set(snap["kv_free_blocks"])
        for key, series in (("member_preemptions", self.preemptions), ("group_preemptions", self.group_preemptions),
                            ("replayed_tokens", self.replayed)):
            new = snap.get(key, 0) - self._seen[i][key]  # the engine sends running totals
            if new > 0:
                series[i].inc(new)
                self._seen[i][key] = snap[key]
        for end in snap["ended"]:
            self.ended[i].inc()
            self.workers[i].observe(end["num_workers"])
            self.generation[i].observe(sum(end["output_lens"]))
            for reads in end["coworker_reads"]:
                self.reads[i].observe(reads)
            self.prefill_saved[i].inc(end["num_prefill_saved"])
            self.latency[i].observe(end["latency_s"])
            if end["admission_wait_s"] is not None:
                self.admission_wait[i].observe(end["admission_wait_s"])

    def log_engine_initialized(self) -> None:
        pass


