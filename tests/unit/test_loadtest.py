"""The load test's request mix and report (pure; the server run is tests/server/test_load.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_hogwild.serving.loadtest import Outcome, fairness, make_mix, markdown, percentile, summarize

ROOT = Path(__file__).resolve().parents[2]


def test_mix_has_the_documented_shares_and_is_seeded() -> None:
    specs = make_mix(300, max_tokens=24, seed=0)
    kinds = [s.kind for s in specs]
    assert (kinds.count("plain"), kinds.count("hogwild-2"), kinds.count("hogwild-4")) == (120, 90, 90)
    assert sum(s.stream for s in specs) == 150
    cancelled = [s for s in specs if s.cancel_after is not None]
    assert cancelled and all(s.stream and s.kind != "plain" for s in cancelled)
    for kind in ("hogwild-2", "hogwild-4"):  # one streamed request in five of each Hogwild kind
        streamed = sum(s.stream and s.kind == kind for s in specs)
        assert sum(s.kind == kind for s in cancelled) == streamed // 5
    assert make_mix(300, seed=0) == specs and make_mix(300, seed=1) != specs
    assert [s.n for s in specs[:3]] == [{"plain": 1, "hogwild-2": 2, "hogwild-4": 4}[s.kind] for s in specs[:3]]


def test_request_bodies() -> None:
    specs = make_mix(10, seed=0)
    plain = next(s for s in specs if s.kind == "plain")
    group = next(s for s in specs if s.kind != "plain")
    assert plain.body()["temperature"] == 0.0 and "extra_body" not in plain.body()
    assert group.body()["n"] == group.n and group.body()["extra_body"]["vllm_xargs"]["hogwild_protocol"] == "raw"


def test_summary_counts_outcomes_and_latency_percentiles() -> None:
    specs = make_mix(10, seed=0)
    outcomes = [Outcome(s, "completed", float(i + 1)) for i, s in enumerate(specs)]
    outcomes[0] = Outcome(specs[0], "error", 0.5, reason="APIStatusError 500")
    outcomes[1] = Outcome(specs[1], "timeout", 180.0, reason="no answer within 180 s")
    rows = summarize(outcomes)
    total = rows[-1]
    assert total["kind"] == "all" and total["requests"] == 10
    assert total["completed"] == 8 and total["errored"] == 2
    assert total["errors"] == {"APIStatusError 500": 1, "no answer within 180 s": 1}
    assert total["p50_s"] == pytest.approx(percentile([float(i + 1) for i in range(2, 10)], 50))
    assert sum(r["requests"] for r in rows[:-1]) == 10
    assert "APIStatusError 500: 1" in markdown(rows)
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0], 50) == 3.0



def _rows(plain: tuple[float, float], two: tuple[float, float], four: tuple[float, float]) -> list[dict]:
    """``summarize``-shaped rows with the given (p50, p95) per kind."""
    return [{"kind": kind, "p50_s": p50, "p95_s": p95, "errored": 0}
            for kind, (p50, p95) in (("plain", plain), ("hogwild-2", two), ("hogwild-4", four), ("all", (1, 1)))]


def test_fairness_is_plain_over_the_lowest_group_class_at_either_percentile() -> None:
    rows = _rows(plain=(1.5, 2.4), two=(2.0, 3.0), four=(3.0, 2.0))
    assert fairness(rows) == pytest.approx(1.2) and fairness(rows, "p50_s") == pytest.approx(0.75)
    assert fairness(_rows(plain=(1.0, 1.0), two=(0.0, 0.0), four=(0.0, 0.0))) == 0.0  # no group completed


def test_the_fairness_benchmark_reports_every_round_and_the_medians() -> None:
    from benchmarks import load_fairness as bench

    rounds = [bench.round_row(k, 7 + k, _rows(plain=(1.0, p95), two=(2.0, 2.0), four=(2.5, 2.2)), 10.0)
              for k, p95 in enumerate([2.0, 3.0, 2.4])]
    assert [r["p95_ratio"] for r in rounds] == pytest.approx([1.0, 1.5, 1.2])
    assert rounds[0]["group_p50_s"] == 2.0 and rounds[0]["group_p95_s"] == 2.0 and rounds[0]["p50_ratio"] == 0.5
    rep = bench.report(rounds)
    assert rep["median_p95_ratio"] == pytest.approx(1.2) and rep["meets_target"]
    assert not bench.report(rounds, target=1.1)["meets_target"]
    text = bench.markdown(rep)
    assert text.count("\n| ") == 3 and "plain p95 / group p95 1.20 (target at most 1.25: met)" in text


def test_serve_config_names_the_app_builder() -> None:
    import yaml

    config = yaml.safe_load((ROOT / "examples" / "ray_serve.yaml").read_text())
    [app] = config["applications"]
    assert app["import_path"] == "examples.ray_serve_app:app_builder"
    assert app["args"]["replicas"] == 2
    assert (ROOT / "examples" / "ray_serve_app.py").exists()
