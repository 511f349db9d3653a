"""The Hogwild planner: the wall-clock model's worked figures, the best N, and the router."""

from __future__ import annotations

import json
import math

import pytest

from vllm_hogwild.tools.planner import Workload, main, optimum, plan, route, steps


def test_the_worked_example() -> None:
    """10,000 tokens, p = 0.7, c = 200, N = 4: 10,000 x (0.3 + 0.7/4) + 200 x 4 = 5,550 steps, 1.8x."""
    assert steps(10_000, 0.7, 200, 4) == pytest.approx(5_550)
    assert 10_000 / steps(10_000, 0.7, 200, 4) == pytest.approx(1.8018, abs=1e-4)
    assert steps(10_000, 0.7, 200, 1) == 10_000  # one worker: plain decoding, no coordination


def test_a_long_parallel_job_wins_and_a_short_chat_loses() -> None:
    long = plan(50_000, 0.8, 500)
    assert long.pays and long.best_workers == 8  # sqrt(50,000 x 0.8 / 500) = 8.9, capped at 8
    assert long.steps == pytest.approx(50_000 * (0.2 + 0.1) + 4_000) and long.speedup > 2.5
    assert plan(50_000, 0.8, 500, max_workers=16).best_workers == 9
    chat = plan(1_000, 0.3, 200)
    assert not chat.pays and chat.best_workers == 1 and chat.speedup == 1.0
    assert all(t > 1_000 for n, t in chat.table.items() if n > 1)  # every N >= 2 is slower


def test_the_best_n_is_near_the_optimum() -> None:
    for t, p, c in [(10_000, 0.7, 200), (50_000, 0.8, 500), (200_000, 0.9, 300)]:
        best = plan(t, p, c, max_workers=64).best_workers
        assert abs(best - optimum(t, p, c)) < 1
    assert optimum(1000, 0.5, 0) == math.inf


@pytest.mark.parametrize("bad,field", [
    (dict(t_serial=0, parallel=0.5, coordination=1), "tokens"),
    (dict(t_serial=10, parallel=1.5, coordination=1), "parallel"),
    (dict(t_serial=10, parallel=0.5, coordination=-1), "coordination"),
])
def test_bad_inputs_name_the_field(bad, field) -> None:
    with pytest.raises(ValueError, match=f"^{field}: "):
        plan(**bad)


def test_the_router() -> None:
    assert route(Workload(50_000, 0.8, 500)).strategy == "hogwild"
    both = route(Workload(50_000, 0.8, 500, draft_model=True))
    assert both.strategy == "hogwild+speculative" and both.workers == 8
    small = route(Workload(50_000, 0.8, 500, model_family="small"))
    assert small.strategy != "hogwild" and any("does not follow" in r for r in small.reasons)
    chat = route(Workload(1_000, 0.3, 200))
    assert chat.strategy == "voting" and any("outweighs" in r for r in chat.reasons)
    assert route(Workload(1_000, 0.3, 200, answer="open", draft_model=True)).strategy == "speculative"
    assert route(Workload(1_000, 0.3, 200, answer="open")).strategy == "plain"
    assert route(Workload(50_000, 0.8, 500, branching=True)).strategy == "tree_of_thought"
    assert route(Workload(50_000, 0.8, 500, roles=True)).strategy == "multi_agent"
    assert route(Workload(50_000, 0.8, 500, spare_compute=False)).strategy == "plain"
    with pytest.raises(ValueError, match="^model_family: "):
        Workload(10, 0.5, model_family="huge")


def test_the_cli(capsys) -> None:
    main(["best", "--tokens", "10000", "--parallel", "0.7", "--coordination", "200", "--max-workers", "4"])
    out = capsys.readouterr().out
    assert "N=4:        5,550 steps   1.80x  <- best" in out
    main(["route", "--tokens", "50000", "--parallel", "0.8", "--coordination", "500", "--json"])
    rec = json.loads(capsys.readouterr().out)
    assert rec["strategy"] == "hogwild" and rec["workers"] == 8 and rec["reasons"]
    with pytest.raises(SystemExit):
        main(["best", "--tokens", "10", "--parallel", "2"])
    assert "parallel: " in capsys.readouterr().err


def test_fit_recovers_p_and_c_from_one_and_two_workers() -> None:
    from vllm_hogwild.tools.planner import fit, steps

    one = [80.0, 100.0, 130.0, 170.0]
    two = [steps(t, 0.9, 3.0, 2) for t in one]
    found = fit(one, two)
    assert abs(found.parallel - 0.9) < 1e-9 and abs(found.coordination - 3.0) < 1e-9
    clipped = fit(one, [t * 0.4 for t in one])  # better than linear: p clipped to 1, c refitted at 0
    assert clipped.parallel == 1.0 and clipped.coordination == 0.0
    with pytest.raises(ValueError, match="^runs: "):
        fit([100.0], [60.0])
    with pytest.raises(ValueError, match="^runs: "):
        fit([100.0, 100.0], [60.0, 61.0])
