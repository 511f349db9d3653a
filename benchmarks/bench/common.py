"""What every benchmark shares: engines, prompts, sampling, step counters, timing, side processes."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from vllm_hogwild.core.machine import machine

ROOT = Path(__file__).resolve().parents[2]  # the checkout: side processes run ``python -m benchmarks.bench`` there
__all__ = ["ROOT", "machine"]


def engine(model: str | None, max_model_len: int, hogwild: bool = True, dtype: str = "float32",
            enforce_eager: bool = True, **kw):
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the scheduler's stats are read in-process
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
    from vllm import LLM

    from vllm_hogwild.models.default import prepare
    from vllm_hogwild.models.tiny import build_tiny_llama

    # A prompt is prefilled in one step: vLLM 0.32 on CPU fails a seeded request whose prefill is
    # chunked in a stock engine (it rewinds the request's CPU generator, which has no offset).
    kw.setdefault("max_num_batched_tokens", max(max_model_len, 4096))
    model = str(build_tiny_llama()) if model == "tiny" else model or str(prepare())
    kw.setdefault("additional_config", {"hogwild": {}} if hogwild else {})
    return LLM(model=model, dtype=dtype, enforce_eager=enforce_eager, seed=0, max_model_len=max_model_len, **kw)


def kv_bytes_per_token(model: str | None) -> int:
    """A float32 KV cache's bytes per token of ``model`` (a folder, 'tiny' or None: the default model), from its
    config: layers x KV heads x head dim x 2 (K and V) x 4."""
    import json
    from pathlib import Path

    from vllm_hogwild.models.default import prepare
    from vllm_hogwild.models.tiny import build_tiny_llama

    folder = Path(str(build_tiny_llama()) if model == "tiny" else model or str(prepare()))
    cfg = json.loads((folder / "config.json").read_text())
    heads = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    return cfg["num_hidden_layers"] * cfg.get("num_key_value_heads", heads) * head_dim * 2 * 4


def check_kv_room(model: str | None, blocks: int, block_size: int, what: str, advice: str) -> None:
    """Fail at once, naming what to pass, when ``blocks`` KV blocks of ``model`` would not fit this machine's
    available memory (half of it: the model, the engine and its tensors need the rest)."""
    need = blocks * block_size * kv_bytes_per_token(model)
    available = _available_bytes()
    if available is not None and need > available // 2:
        raise SystemExit(f"{what}: every sequence at once needs {blocks} KV blocks of {block_size} tokens, "
                         f"{need / 2**30:.1f} GiB, and this machine has {available / 2**30:.1f} GiB available; "
                         f"pass {advice}")


def _available_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def scheduler_of(llm):
    return llm.llm_engine.engine_core.engine_core.scheduler


def prompt(length: int, salt: int) -> dict:
    # Distinct token ids per run: nothing is served from the prefix cache.
    return {"prompt_token_ids": [(1000 + 7919 * salt + 31 * i) % 40000 + 100 for i in range(length)]}


def timed(llm, prompts, params) -> tuple[float, list]:
    t = time.perf_counter()
    out = llm.generate(prompts, params, use_tqdm=False)
    return time.perf_counter() - t, out


def params(n: int, max_tokens: int, seed: int, hogwild: dict | None):
    from vllm import SamplingParams

    return SamplingParams(n=n, temperature=1.0, seed=seed, max_tokens=max_tokens, ignore_eos=True,
                          extra_args={"hogwild": hogwild} if hogwild is not None else None)


def count_steps(llm) -> list[int]:
    """Engine steps that ran tokens, counted from now (the scheduler's ``schedule`` wrapped on the instance)."""
    scheduler, counter = scheduler_of(llm), [0]
    original = scheduler.schedule

    def schedule(*args, **kwargs):
        output = original(*args, **kwargs)
        counter[0] += bool(output.total_num_scheduled_tokens)
        return output

    scheduler.schedule = schedule
    return counter


def attention_of(llm) -> str:
    """The engine's Hogwild attention path as its start-up line names it: ``cpu-op (avx512)``, ..."""
    from vllm_hogwild.attention.paths import describe

    return describe(llm.llm_engine.vllm_config.additional_config)


def side_rows(argv: list[str], expected: int, what: str) -> list[dict]:
    """Run one side of a benchmark (``python -m benchmarks.bench <side> ...``) in a process of its own
    (two engines in one process share vLLM's global parallel state, and shutting one down breaks the other);
    its JSON rows, each printed as it comes."""
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-m", "benchmarks.bench", *argv], capture_output=True, text=True,
                         timeout=3600, cwd=ROOT)
    rows = [json.loads(line) for line in run.stdout.splitlines() if line.startswith('{"kind"')]
    if run.returncode != 0 or len(rows) != expected:
        raise RuntimeError(f"{what} failed:\n{run.stdout[-2000:]}{run.stderr[-3000:]}")
    for row in rows:
        print(json.dumps(row), flush=True)
    return rows


def _timed(fn, record):
    """``fn``, with the seconds of each call handed to ``record``."""
    def wrapper(*a, **kw):
        t = time.perf_counter()
        try:
            return fn(*a, **kw)
        finally:
            record(time.perf_counter() - t)
    return wrapper


class timing:
    """Time a scheduler's ``schedule`` and ``update_from_output`` (this instance) while in the block: the sums,
    the steps, and each call (``schedule_each``, ``update_each``, in order)."""

    def __init__(self, scheduler) -> None:
        self.scheduler = scheduler
        self.spent = {"schedule": 0.0, "update": 0.0, "steps": 0, "schedule_each": [], "update_each": []}

    def __enter__(self) -> dict:
        s, spent = self.scheduler, self.spent
        self.own = {name: s.__dict__.get(name) for name in ("schedule", "update_from_output")}  # instance attributes

        def record(key: str):
            def add(dt: float) -> None:
                spent[key] += dt
                spent[key + "_each"].append(dt)
                spent["steps"] += key == "schedule"
            return add

        s.schedule, s.update_from_output = (_timed(s.schedule, record("schedule")),
                                            _timed(s.update_from_output, record("update")))
        return spent

    def __exit__(self, *exc) -> None:
        # As it was: an instance attribute put back, the class's method found again (not a bound copy of what the
        # class had during the block: ``vllm_timing`` wraps the class's).
        for name, before in self.own.items():
            if before is None:
                delattr(self.scheduler, name)
            else:
                setattr(self.scheduler, name, before)


class vllm_timing:
    """Time vLLM's own ``Scheduler.schedule`` and ``update_from_output`` (the class's methods, which vLLM's
    scheduler runs and a Hogwild scheduler calls through ``super()``) while in the block: each call, in order.
    A scheduler's time beyond them is its own code's; the plugin's hooks that vLLM's code calls from inside
    them (a worker's end, the lane hasher) count as vLLM's."""

    def __init__(self) -> None:
        self.spent = {"schedule_each": [], "update_each": []}

    def __enter__(self) -> dict:
        from vllm.v1.core.sched.scheduler import Scheduler

        self.cls, self.originals = Scheduler, (Scheduler.schedule, Scheduler.update_from_output)
        Scheduler.schedule = _timed(self.originals[0], self.spent["schedule_each"].append)
        Scheduler.update_from_output = _timed(self.originals[1], self.spent["update_each"].append)
        return self.spent

    def __exit__(self, *exc) -> None:
        self.cls.schedule, self.cls.update_from_output = self.originals


def steps_against_workers(ax, report: dict, title: str) -> None:
    """A plot's axes of mean sequential steps against workers: log x, ticked at the worker counts that ran."""
    ax.set(xscale="log", xlabel="workers", ylabel="mean sequential decode steps", title=title)
    ticks = sorted({r["workers"] for r in report["results"]})
    ax.set_xticks(ticks, labels=[str(t) for t in ticks])  # 1 2 4 8, not powers of ten
    ax.minorticks_off()
