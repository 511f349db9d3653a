"""The main job (``python -m vllm_hogwild.tools.demo``, what ``./run.sh`` runs), the SmolLM2 demo behind its flag and
the offline collab example, as users run them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

ROOT = Path(__file__).parents[2]


def _run(args: list[str]) -> str:
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    # A hang guard: an example runs in under 50 s on 2 cores (each test did in a whole suite's run), 600 s is 12 times.
    run = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=600, cwd=ROOT, env=env,
                         stdin=subprocess.DEVNULL)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    return run.stdout


def test_the_main_job_shows_four_workers_building_on_each_other_beside_the_split() -> None:
    out = _run(["-m", "vllm_hogwild.tools.demo"])
    assert "--- 1 worker (a plain request) ---" in out and "--- 4 workers (raw mode, contiguous) ---" in out
    assert out.count("answer: correct;") == 2 and "Dave   takes " in out  # names padded to 5
    assert re.search(r"the rest as (Alice|Bob|Carol|Dave)'s path for .+? goes on", out), out[-3000:]
    summary = re.search(r"^4 workers: (\d+) steps against (\d+) for one worker \S+ and (\d+) for a split made in "
                        r"advance, with or without a cancel", out, re.M)
    assert summary, out[-3000:]
    group, one, split = map(int, summary.groups())
    # In all mode no client can cancel anything: the split is the baseline, and reading co-workers' paths beats it
    # on the demo's task (over 64 tasks the ratio is the benchmark's, docs/benchmarks.md)
    assert group < 0.6 * one and group < split, summary.group(0)
    # Quiet: the demo's own lines only; vLLM's logs (and the plugin's) are in the file it names first.
    logs = re.match(r"\(vLLM's logs: (\S+); --verbose shows them here\)\n", out)
    assert logs, out[:500]
    assert not re.search(r"^(INFO|WARNING|DEBUG|ERROR|\(EngineCore)", out, re.M), out
    text = Path(logs.group(1)).read_text()
    assert "INFO" in text and "vllm" in text.lower(), text[:2000]
    Path(logs.group(1)).unlink()


def test_the_links_and_roman_demos_stay_behind_their_flags() -> None:
    for flag, prog in (("--links", "demo --links"), ("--roman", "demo --roman")):
        out = _run(["-m", "vllm_hogwild.tools.demo", flag, "--help"])
        assert out.startswith(f"usage: python -m vllm_hogwild.tools.{prog}"), out[:300]


def test_the_smollm2_demo_records_a_collaborating_pair(tmp_path) -> None:
    record = tmp_path / "run.md"
    out = _run(["-m", "vllm_hogwild.tools.demo", "--smollm2", "--max-tokens", "80", "--markdown", str(record)])
    text = record.read_text()
    assert text in out  # the same record on stdout
    assert "protocol `collab`" in text and "## The shared history, in the order the steps joined it" in text
    assert "- tokens per worker: Alice " in text and ", Bob " in text
    assert "- final answer: " in text and "- steps: " in text
    assert "**Alice [1]:** " in text and "**Bob [1]:** " in text


def test_the_math_example_runs_two_and_four_workers() -> None:
    out = _run(["examples/collab_math.py", "--workers", "2", "4", "--max-tokens", "64"])
    assert "===== 2 workers:" in out and "===== 4 workers:" in out
    assert out.count("\nfinal answer: ") == 2
    assert "**Dave [1]:** " in out
