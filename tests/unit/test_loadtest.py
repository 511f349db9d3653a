"""The load test's request mix and report (pure; the server run is tests/server/test_load.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_hogwild.serving.loadtest import Outcome, make_mix, markdown, percentile, summarize

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


def test_serve_config_names_the_app_builder() -> None:
    import yaml

    config = yaml.safe_load((ROOT / "examples" / "ray_serve.yaml").read_text())
    [app] = config["applications"]
    assert app["import_path"] == "examples.ray_serve_app:app_builder"
    assert app["args"]["replicas"] == 2
    assert (ROOT / "examples" / "ray_serve_app.py").exists()
