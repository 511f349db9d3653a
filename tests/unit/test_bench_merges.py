"""``bench answer --task merges --computed`` (no engine: every row is computed from the true costs): a smoke run of
its rows, records and plot. The merges collaborator's own rows come from the engine (tests/integration)."""

from __future__ import annotations

import json

from benchmarks import bench
from vllm_hogwild.tasks import merges_policy as P


def test_every_baseline_and_control_is_a_named_record(tmp_path) -> None:
    out = tmp_path / "merges.json"
    args = bench.build_parser().parse_args(["answer", "--task", "merges", "--mode", "all", "--workers", "1", "2",
                                            "4", "--tasks", "6", "--computed", "--json", str(out)])
    report = bench.run(args)
    rows = {(r["workers"], r["layout"]): r for r in report["results"]}
    named = set(P.BASELINES) | {"policy (simulated)"}
    assert set(rows) == {(n, x) for n in (1, 2, 4) for x in named} | {
        (n, x) for n in (2, 4) for x in ("isolated (simulated)", "interleaved (simulated)")}
    for n in (2, 4):  # every baseline right (the checker expands references); reuse beats the split's own reuse
        assert all(rows[n, x]["accuracy"] == 1.0 for x in named)
        assert rows[n, "ideal reuse policy"]["mean_sequential_steps"] < rows[n, "round-robin split"][
            "mean_sequential_steps"]
        assert rows[n, "isolated (simulated)"]["steps_vs_one_worker"] >= 0.95
    assert report["runs"].startswith("none") and report["model"] is None and report["attention"] is None
    assert 0.4 <= report["merges"]["merging_share"] <= 1
    table = bench.markdown(report)
    assert "| 4 | split + cancel |" in table and "vs ideal reuse" in table


def test_find_mode_sets_the_split_with_cancel_below_the_split_that_runs_every_share(tmp_path) -> None:
    bench.main(["answer", "--task", "merges", "--mode", "find", "--workers", "4", "--tasks", "8", "--computed",
                "--json", str(tmp_path / "f.json"), "--plot", str(tmp_path / "f.png")])
    assert (tmp_path / "f.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = json.loads((tmp_path / "f.json").read_text())
    rows = {r["layout"]: r["mean_sequential_steps"] for r in report["results"]}
    assert rows["split + cancel"] < rows["round-robin split"]
    assert rows["ideal reuse policy"] <= rows["split + cancel"]
