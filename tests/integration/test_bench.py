"""The benchmarks run end to end on a real engine (tiny random Llama: the machinery, not the figures)."""

from __future__ import annotations

import pytest

from tests.integration.conftest import make_llm, shutdown
from benchmarks import bench

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


@pytest.fixture(scope="module")
def llm(tiny_model):
    engine = make_llm(tiny_model, additional_config={"hogwild": {}})
    yield engine
    shutdown(engine)


def _run(llm, argv: list[str], tmp_path) -> dict:
    report = bench.run(bench.build_parser().parse_args(argv), llm)
    png = tmp_path / f"{argv[0]}.png"
    bench.plot(report, str(png))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    ratio_rows = len(report["ratio"]) if report["benchmark"] == "overhead" else 0  # one "Hogwild / stock" row each
    assert bench.markdown(report).count("\n") == len(report["results"]) + 1 + ratio_rows
    return report


def test_decode_reports_throughput_and_memory(llm, tmp_path) -> None:
    report = _run(llm, ["decode", "--workers", "2", "3", "--prompt-lens", "40", "--max-tokens", "8",
                        "--rounds", "2"], tmp_path)
    for r in report["results"]:
        # A rate is the median of (whole run - its first token alone) over the rounds, the two runs in turn (A B,
        # then B A) and a pair whose difference a hiccup made negative measured again, up to 3 times: a rate is
        # unknown only if every try of both rounds failed, where the whole run decodes 7 more steps.
        assert r["stock_decode_tok_s"] > 0 and r["hogwild_decode_tok_s"] > 0
        # The group holds the prompt once; N copies of the final view hold it N times and every lane N times.
        assert r["kv_blocks_copies"] > r["kv_blocks_group"] and r["memory_ratio"] > 1


def test_recompute_rounds_follow_k(llm, tmp_path) -> None:
    report = _run(llm, ["recompute", "--workers", "2", "--prompt-lens", "40", "--max-tokens", "8",
                        "--every", "1", "4"], tmp_path)
    assert [r["rounds"] for r in report["results"]] == [8, 2]
    assert all(r["hogwild_s"] > 0 and r["recompute_s"] > 0 for r in report["results"])


def test_overhead_times_both_engines_at_each_point(llm, tiny_model, tmp_path) -> None:
    import statistics

    # Two rounds: the engines alternate, stock, Hogwild, stock, Hogwild (a process each); each load twice per
    # engine process (``--repeats``): 4 rows per engine kind and point.
    report = _run(llm, ["overhead", "--model", str(tiny_model), "--groups", "2", "3", "--workers", "2", "--plain",
                        "3", "--max-tokens", "4", "--rounds", "2", "--repeats", "2"], tmp_path)
    rows = report["results"]
    assert [(r["kind"], r["groups"]) for r in rows] == [(kind, g) for g in (2, 3) for kind in ("stock", "hogwild")
                                                         for _ in range(4)]
    assert [r["sequences"] for r in rows] == [7] * 8 + [9] * 8
    assert all(r["steps"] >= 4 for r in rows) and set(report["ratio"]) == set(report["steady_ratio"]) == {2, 3}
    assert all(min(r["first_step_ms"], r["last_step_ms"], r["steady_step_ms"]) > 0 for r in rows)
    # The scheduler's own code beyond vLLM's own calls: the stock engine's is the timers' alone; the Hogwild
    # scheduler's hooks around vLLM's calls take more, at every point. Compared on medians over the alternated
    # engines' rows: stock's own time is a few microseconds between two timer reads per call (0.007 ms a steady
    # step, docs/benchmarks.md), too short a window for another job to land in often, and the hooks' work is
    # many times that (0.17-0.20 ms a steady step at 256 groups); each kind runs both early and late in the
    # test, so a load that comes or goes during it does not fall on one kind alone.
    assert all(r["own_ms_per_step"] >= 0 and r["own_steady_ms"] >= 0 for r in rows)
    for g in (2, 3):
        stock, hogwild = (statistics.median(r["own_steady_ms"] for r in rows if r["groups"] == g and r["kind"] == kind)
                          for kind in ("stock", "hogwild"))
        assert hogwild > stock, (g, hogwild, stock)
        assert report["own_ratio"][g] > 1


def test_speculative_compares_every_configuration_per_point_in_one_run(tmp_path) -> None:
    """In a process of its own: once the n-gram proposer ran, vLLM 0.32 cannot start another engine there.
    (The benchmarks' processes here take under 50 s each in a whole suite's run on 2 cores: their 900 s limits are
    hang guards, over 18 times that.)"""
    import json
    import os
    import subprocess
    import sys

    out = tmp_path / "spec.json"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.bench", "speculative", "--model", "tiny",
                           "--workers", "2", "--temperatures", "0.7", "--items", "6", "--max-tokens", "32",
                           "--rounds", "1", "--json", str(out)],
                          env=dict(os.environ), capture_output=True, text=True, timeout=900, cwd=bench.ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert [r["config"] for r in report["results"]] == [
        f"{kind}{spec}" for spec in ("", " + draft model", " + n-gram")
        for kind in ("stock", "hogwild", "fork/join", "stock n=1 greedy")]
    for row in report["results"]:
        if row["kind"] != "fork/join":  # (its trunk waits while the branches write, and its branches may end early)
            assert row["tokens_per_step"] >= row["workers"] - 1e-9  # at least one token per sequence and step
        if row["speculation"] is None:  # with speculation: None only when nothing was drafted
            assert row["acceptance"] is None
    # the model as its own draft: the greedy reference accepts its drafts
    greedy_draft = next(r for r in report["results"] if r["config"] == "stock n=1 greedy + draft model")
    assert greedy_draft["acceptance"] > 0.9 and greedy_draft["tokens_per_step"] > 2
    summary = report["summary"]
    assert [(s["speculation"], s["workers"], s["temperature"]) for s in summary] == [
        ("draft model", 2, 0.7), ("n-gram", 2, 0.7)]
    for s in summary:
        assert abs(s["vs_product"] * s["speculation_speedup"] * s["hogwild_speedup"] - s["combined_speedup"]) < 1e-9
    assert "| both / product |" in bench.markdown(report)


def test_verify_splits_a_speculative_step_by_part(tmp_path) -> None:
    """In a process of its own (the n-gram proposer). Stock rows run no segment attention; Hogwild rows do, inside
    the model forward, whose time holds both attention parts."""
    import json
    import os
    import subprocess
    import sys

    out = tmp_path / "verify.json"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.bench", "verify", "--model", "tiny",
                           "--items", "6", "--max-tokens", "24", "--rounds", "1", "--json", str(out)],
                          env=dict(os.environ), capture_output=True, text=True, timeout=900, cwd=bench.ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    rows = {r["config"]: r for r in report["results"]}
    assert list(rows) == list(bench.VERIFY_CONFIGS)
    for config, row in rows.items():
        parts = row["parts_ms"]
        assert set(parts) == {p for p, _, _ in bench.VERIFY_PARTS}
        assert parts["model forward"] >= parts["native attention"] + parts["segment attention"]
        assert parts["model forward"] + parts["segment plan"] + parts["sampler"] <= row["step_ms"]
        assert (parts["segment attention"] > 0) == (config != "stock"), (config, parts)
    assert "| segment plan ms |" in bench.markdown(report)


def test_split_accounts_for_a_decode_step(tmp_path) -> None:
    """The parts add up to the step; stock runs no segment attention, the group does. In a process of its own: the
    benchmark wraps vLLM's runner methods for good."""
    import json
    import os
    import subprocess
    import sys

    out = tmp_path / "split.json"
    # Three rounds: a part is the median over them of (the run's - its max_tokens=1 twin's), the two in turn
    # (A B, B A, A B), so a hiccup in one twin's run moves no median below the 11 decode steps' time.
    proc = subprocess.run([sys.executable, "-m", "benchmarks.bench", "split", "--model", "tiny", "--workers",
                           "2", "--prompt-len", "64", "--max-tokens", "12", "--rounds", "3", "--json", str(out),
                           "--plot", str(tmp_path / "split.png")],
                          env=dict(os.environ), capture_output=True, text=True, timeout=900, cwd=bench.ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    stock, hogwild = report["results"]
    assert (stock["kind"], hogwild["kind"]) == ("stock", "hogwild")
    for row in (stock, hogwild):
        assert abs(sum(row["split_ms"].values()) - row["step_ms"]) < 1e-6
        assert row["split_ms"]["weights and the rest of the model"] > 0 and row["split_ms"]["scheduler"] > 0
    assert stock["split_ms"]["segment attention (Hogwild rows)"] == 0
    assert hogwild["split_ms"]["segment attention (Hogwild rows)"] > 0
    assert "| **step** |" in bench.markdown(report)


def _fp8_runs_here() -> bool:
    import torch

    return torch.cpu._is_avx512_supported() or torch.cpu._is_amx_tile_supported()


def test_capacity_runs_every_configuration_at_every_size(tmp_path) -> None:
    """Each (size, cache dtype, configuration) is an engine in a process of its own; at the tight size on-demand
    groups are preempted and replayed, reserve never preempts and takes more engine steps. One size (a smoke
    run: the figures at sizes that do not preempt are the benchmark's, docs/benchmarks.md). Where vLLM runs an
    FP8 cache (AVX-512 or AMX), the same bytes as FP8 too: 4 times the blocks, every group at once, no
    preemption, fewer engine steps than float32's on-demand."""
    dtypes = ["auto", "fp8"] if _fp8_runs_here() else ["auto"]
    if len(dtypes) == 1:
        print("\nno FP8 rows: vLLM 0.32 runs an FP8 KV cache on the CPU only with AVX-512 or AMX")
    report = _run(None, ["capacity", "--groups", "4", "--workers", "2", "--max-tokens", "96", "--blocks", "6",
                         "--stop-every", "90", "--kv-cache-dtypes", *dtypes], tmp_path)
    rows = {(r["blocks"], r["kind"]): r for r in report["results"] if r["kv_cache_dtype"] == "auto"}
    assert list(rows) == [(6, k) for k in bench.CAPACITY_KINDS]
    assert all(r["steps_vs_largest"] == 1.0 for r in rows.values())
    assert rows[6, "stock"]["group_preemptions"] is None and rows[6, "stock"]["replayed_tokens"] is None
    tight = rows[6, "on-demand"]
    assert tight["group_preemptions"] >= 1 and tight["replayed_tokens"] > 0
    assert rows[6, "reserve"]["group_preemptions"] == 0 and rows[6, "reserve"]["replayed_tokens"] == 0
    assert tight["steps"] < rows[6, "reserve"]["steps"]
    if "fp8" in dtypes:
        fp8 = {r["kind"]: r for r in report["results"] if r["kv_cache_dtype"] == "fp8"}
        assert {r["blocks"] for r in fp8.values()} == {24} and list(fp8) == list(bench.CAPACITY_KINDS)
        assert fp8["on-demand"]["group_preemptions"] == 0 and fp8["on-demand"]["steps"] < tight["steps"]
        assert fp8["reserve"]["groups_held"] > rows[6, "reserve"]["groups_held"]
        assert "| fp8 | 24 |" in bench.markdown(report)


def test_capacity_of_fork_join_requests_on_demand_and_reserve(tmp_path) -> None:
    """The same load as fork/join requests (a trunk and 2 branch lanes each): no stock side; at a tight size
    on-demand requests are preempted and replayed, reserve never preempts and takes more engine steps."""
    report = _run(None, ["capacity", "--protocol", "multiverse", "--groups", "4", "--workers", "3",
                         "--max-tokens", "96", "--blocks", "8", "--stop-every", "90"], tmp_path)
    rows = {r["kind"]: r for r in report["results"]}
    assert list(rows) == ["on-demand", "reserve"] and report["protocol"] == "multiverse"
    assert rows["on-demand"]["group_preemptions"] >= 1 and rows["on-demand"]["replayed_tokens"] > 0
    assert rows["reserve"]["group_preemptions"] == 0
    assert rows["on-demand"]["steps"] < rows["reserve"]["steps"]


def test_forkjoin_compares_three_sides_on_the_same_token_counts(llm, tmp_path) -> None:
    report = _run(llm, ["forkjoin", "--parts", "2", "3", "--requests", "1", "--rounds", "1", "--max-tokens", "32",
                        "--context", "4", "--branch-end", "[jqyz]"], tmp_path)
    rows = {(r["parts"], r["side"]): r for r in report["summary"]}
    assert set(rows) == {(p, s) for p in (2, 3) for s in bench.FORKJOIN_SIDES}
    for parts in (2, 3):
        fj, seq, re = (rows[parts, s] for s in bench.FORKJOIN_SIDES)
        assert seq["sequential_steps"] == seq["tokens"] == fj["tokens"], "the same tokens, one after another"
        assert fj["sequential_steps"] < seq["sequential_steps"]
        assert re["prefilled_tokens"] > seq["prefilled_tokens"], "the join re-prefills the branches"
        assert fj["wall_vs_forkjoin"] == 1.0
    headers = {h["parts"]: h for h in report["headers"]}
    for parts in (2, 3):  # a lone request: its headers fed in one step each save steps against one token a step
        assert 0 < headers[parts]["fed_ahead"] < headers[parts]["one_a_step"], headers[parts]
