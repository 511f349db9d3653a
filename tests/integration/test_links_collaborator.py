"""The links collaborator in an offline engine: `bench answer --task links` (every layout that runs, and beside them
the splits made in advance, the ideal policy and the bound, computed from the same tasks' true costs), the demo's
board, and one worker equal to a plain request. The behaviour through the server, and the training forward against
the engine: tests/server/test_links_server.py."""

from __future__ import annotations

import pytest

from benchmarks import bench
from benchmarks.bench import answer as bench_answer
from tests.integration.conftest import make_llm, shutdown
from vllm_hogwild.tasks import links as L
from vllm_hogwild.tasks import links_review as R
from vllm_hogwild.models import links_collaborator as C
from vllm_hogwild.models import solve

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


@pytest.fixture(scope="module")
def llm():
    engine = make_llm(C.model_dir(), max_model_len=2048, max_num_seqs=64,
                      additional_config={"hogwild": {"max_workers": 8}})
    yield engine
    shutdown(engine)


@pytest.mark.parametrize("mode", L.MODES)
def test_bench_answer_sets_the_runs_beside_every_split(llm, tmp_path, mode: str) -> None:
    args = bench.build_parser().parse_args(["answer", "--task", "links", "--mode", mode, "--workers", "1", "2", "4",
                                            "--tasks", "4", "--seed", "5", "--json", str(tmp_path / "a.json")])
    report = bench.run(args, llm)
    rows = {(r["workers"], r["layout"]): r for r in report["results"]}
    splits = {(n, kind) for n in (1, 2, 4) for kind in (*bench_answer.SPLITS, "policy (simulated)")}
    runs = {(1, "contiguous")} | {(n, layout) for n in (2, 4) for layout in solve.LAYOUTS}
    assert set(rows) == runs | splits
    assert report["item_cost"]["cv"] > 0.5 and report["mode"] == mode
    for n in (1, 2, 4):  # the bound is below every split, the ideal policy below the round-robin split
        bound = rows[n, "makespan bound"]["mean_sequential_steps"]
        assert bound <= rows[n, "ideal policy"]["mean_sequential_steps"] <= rows[n, "round-robin split"][
            "mean_sequential_steps"]
        cancel = rows[n, "split + cancel"]  # the honest split in find mode: its client cancels at the find
        assert bound <= cancel["mean_sequential_steps"] <= rows[n, "round-robin split"]["mean_sequential_steps"]
        assert (cancel["mean_sequential_steps"] == rows[n, "round-robin split"]["mean_sequential_steps"]) == (
            mode == "all" or n == 1)
    assert rows[4, "contiguous"]["accuracy"] >= 0.75
    assert rows[4, "contiguous"]["mean_sequential_steps"] < rows[1, "contiguous"]["mean_sequential_steps"]
    png = tmp_path / "links.png"
    bench.plot(report, str(png))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "vs round-robin split" in bench.markdown(report) and "vs split + cancel" in bench.markdown(report)


def test_bench_answer_on_a_table_listed_twice_counts_errors_and_votes(llm, tmp_path) -> None:
    args = bench.build_parser().parse_args(["answer", "--task", "links", "--mode", "all", "--workers", "1", "4",
                                            "--layouts", "contiguous", "isolated", "--tasks", "3", "--seed", "5",
                                            "--table-repeats", "2"])
    report = bench.run(args, llm)
    runs = [r for r in report["results"] if r["wall_s"] is not None]
    assert report["repeats"] == 2 and {(r["workers"], r["layout"]) for r in runs} == {
        (1, "contiguous"), (4, "contiguous"), (4, "isolated")}
    for r in runs:  # a row is right on every task exactly when it counts no error
        assert set(r["errors"]) == set(R.ERROR_KINDS)
        assert (r["accuracy"] == 1.0) == (sum(r["errors"].values()) == 0), r
    isolated = next(r for r in runs if r["layout"] == "isolated")
    assert 0.0 <= isolated["vote_accuracy"] <= 1.0 and "vote_accuracy" not in runs[0]
    for r in runs:  # the checking policy played on from the group's runs: never fewer steps than the run
        played = r.get("checking_policy")
        assert (played is not None) == (r["layout"] == "contiguous"), r
        if played:
            assert played["mean_sequential_steps"] >= r["mean_sequential_steps"] and played["replayed_tasks"] <= 3
            assert played["checks"]["unnecessary"] == played["checks"]["missed"] == 0  # its checks are right
    assert "The checking policy played on" in bench.markdown(report)
    assert "Each link listed 2 times" in bench.markdown(report)


def test_one_worker_is_a_plain_request(llm) -> None:
    from vllm import SamplingParams

    tasks = L.make_tasks(3, seed=8, mode="find")
    budget = solve.links_budget(tasks)
    group = llm.generate([t.prompt() for t in tasks], solve.links_params(1, "contiguous", 3, budget), use_tqdm=False)
    plain = llm.generate([t.prompt() for t in tasks], SamplingParams(temperature=C.TEMPERATURE, min_p=C.MIN_P, seed=3,
                                                                    max_tokens=budget), use_tqdm=False)
    assert [o.outputs[0].token_ids for o in group] == [o.outputs[0].token_ids for o in plain]


def test_the_demo_board_prints_claims_finds_and_the_split(llm, capsys) -> None:
    from vllm_hogwild.tools.demo import run_links

    task = L.make_task(10, 2, "find")
    run = run_links(llm, task, 4, "contiguous", seed=0)
    out = capsys.readouterr().out
    assert run["score"].correct, run["texts"]
    assert " takes " in out and "FOUND: " in out
    assert run["steps"] == max(len(C.build_tokenizer().encode(t, add_special_tokens=False).ids) for t in run["texts"]) + 1
