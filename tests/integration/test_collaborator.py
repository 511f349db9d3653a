"""The trained collaborator in a real engine: workers that read each other finish in fewer steps.

One engine of the shipped weights (``vllm_hogwild/models/collaborator``) for the Hogwild tests, then one of the
fork/join collaborator's (``vllm_hogwild/models/collaborator-multiverse``) for the last two.
"""

from __future__ import annotations

import argparse
import json
import statistics

import pytest

from benchmarks import bench
from benchmarks.bench import answer as answer_bench
from tests.hogwild_checks import check_trained_folder
from tests.integration.conftest import make_llm, shutdown
from vllm_hogwild.tasks import roman
from vllm_hogwild.models import roman_collaborator as C
from vllm_hogwild.models import solve
from vllm_hogwild.models import collaborator_forkjoin as F

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

TASKS = roman.make_tasks(6, seed=11, min_items=16, max_items=24)
FJ_TASKS, FJ_MIN_ACCURACY = 8, 0.75


def _engine(folder):
    """An engine of a shipped collaborator, as ``bench answer`` starts it."""
    engine = make_llm(folder, max_model_len=solve.MAX_MODEL_LEN, additional_config={"hogwild": {"max_workers": 8}})
    yield engine
    shutdown(engine)


@pytest.fixture(scope="module")
def llm():
    yield from _engine(C.model_dir())


def _runs(llm, num_workers: int, layout: str) -> tuple[list[int], list[roman.Score]]:
    outs, _ = solve.run_groups(llm, TASKS, num_workers, layout, seed=0)
    return [solve.steps_of(o) for o in outs], [roman.check(t, solve.texts_of(o))
                                                      for t, o in zip(TASKS, outs)]


def test_two_workers_that_read_each_other_take_fewer_steps(llm) -> None:
    one, one_scores = _runs(llm, 1, "contiguous")
    two, two_scores = _runs(llm, 2, "contiguous")
    isolated, isolated_scores = _runs(llm, 2, "isolated")
    print("steps, 1 worker:", one, "2 workers:", two, "2 isolated:", isolated)
    assert sum(s.correct for s in one_scores) >= 5 and sum(s.correct for s in two_scores) >= 5
    assert statistics.mean(two) <= 0.65 * statistics.mean(one)
    assert all(b < a for a, b in zip(one, two))  # every task, not only on average
    # The control: workers that cannot read each other do every number twice and save nothing.
    assert statistics.mean(isolated) >= 0.9 * statistics.mean(one)
    assert statistics.mean(s.duplicated_items for s in isolated_scores) >= 0.8 * statistics.mean(
        t.num_items for t in TASKS)
    assert statistics.mean(s.duplicated_items for s in two_scores) <= 3


def test_greedy_workers_write_the_same_text(llm) -> None:
    """The greedy control: with top_k=1 nothing breaks the workers' symmetry, so every worker of a group writes
    the same text, whatever it reads (sampling with seed + i is what sets them apart)."""
    outs, _ = solve.run_groups(llm, TASKS[:2], 3, "greedy", seed=0)
    for out in outs:
        texts = solve.texts_of(out)
        assert texts[0] and texts.count(texts[0]) == 3, texts
    sampled, _ = solve.run_groups(llm, TASKS[:2], 3, "contiguous", seed=0)
    assert all(len(set(solve.texts_of(o))) == 3 for o in sampled)


def test_one_worker_is_a_plain_request(llm) -> None:
    from vllm import SamplingParams

    prompts = [roman.prompt(t) for t in TASKS[:3]]
    budget = solve.budget(24)
    group = llm.generate(prompts, solve.params(1, "contiguous", 3, budget), use_tqdm=False)
    plain = llm.generate(prompts, SamplingParams(temperature=solve.TEMPERATURE, min_p=solve.MIN_P,
                                                 seed=3, max_tokens=budget), use_tqdm=False)
    assert [o.outputs[0].token_ids for o in group] == [o.outputs[0].token_ids for o in plain]


def test_bench_answer_reports_every_width_layout_and_the_fit(llm, tmp_path) -> None:
    args = bench.build_parser().parse_args(["answer", "--workers", "1", "2", "4", "--tasks", "3", "--seed", "5",
                                            "--json", str(tmp_path / "a.json")])
    report = bench.run(args, llm)
    rows = {(r["workers"], r["layout"]): r for r in report["results"]}
    computed = {(n, kind) for n in (1, 2, 4) for kind in ("fixed split", "policy (simulated)")}
    controls = {(n, layout) for n in (2, 4) for layout in ("isolated", "interleaved", "greedy")}
    assert set(rows) == {(1, "contiguous"), (2, "contiguous"), (4, "contiguous"), *controls, *computed}
    for r in report["results"]:
        assert set(r) >= {"workers", "layout", "tasks", "accuracy", "mean_sequential_steps", "duplicated_items",
                          "wall_s"}
    assert rows[(4, "contiguous")]["mean_sequential_steps"] < rows[(1, "contiguous")]["mean_sequential_steps"]
    fit = report["planner"]
    assert 0 <= fit["parallel"] <= 1 and fit["coordination"] >= 0 and [r["workers"] for r in fit["rows"]] == [1, 2, 4]
    png = tmp_path / "answer.png"
    bench.plot(report, str(png))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "fitted on N=1 and N=2" in bench.markdown(report)


def test_shipped_folder_is_what_the_training_command_writes() -> None:
    folder, _ = check_trained_folder(C, C.Vocab.build())
    assert sum(f.stat().st_size for f in folder.iterdir()) < 10 * 2**20


def test_training_is_seeded_and_reproducible(tmp_path) -> None:
    import torch
    from safetensors.torch import load_file

    from vllm_hogwild.training.train import train

    a = train(tmp_path / "a", steps=3, batch_size=4, num_layers=1, hidden=64, log_every=1)
    b = train(tmp_path / "b", steps=3, batch_size=4, num_layers=1, hidden=64, log_every=1)
    assert a["loss_curve"] == b["loss_curve"]
    wa, wb = load_file(tmp_path / "a" / "model.safetensors"), load_file(tmp_path / "b" / "model.safetensors")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    c = train(tmp_path / "c", steps=3, batch_size=4, num_layers=1, hidden=64, seed=1, log_every=1)
    assert c["loss_curve"] != a["loss_curve"]


def test_the_demo_shows_claims_as_they_are_written(llm, capsys) -> None:
    from vllm_hogwild.tools.demo import run_task

    task = TASKS[0]
    one, four = run_task(llm, task, 1, "contiguous", seed=0), run_task(llm, task, 4, "contiguous", seed=0)
    shown = capsys.readouterr().out
    assert one["score"].correct and four["score"].correct and four["steps"] < 0.5 * one["steps"]
    for name in ("Alice", "Bob", "Carol", "Dave"):
        assert f"{name:<5}  takes " in shown
    assert shown.count(" takes ") >= 2 * task.num_items  # every number is taken in each run


# -- the fork/join collaborator (vllm_hogwild/models/collaborator-multiverse): a second engine, for the last test --


@pytest.fixture(scope="module")
def forkjoin_llm():
    yield from _engine(F.model_dir())


def test_forkjoin_shipped_folder_is_what_the_training_command_writes() -> None:
    folder = F.model_dir()
    assert json.loads((folder / "tokenizer.json").read_text()) == json.loads(C.build_tokenizer().to_str())
    record = json.loads((folder / "training.json").read_text())
    assert record["protocols"] == ["multiverse"]
    assert sum(f.stat().st_size for f in folder.iterdir()) < 10 * 2**20


def test_forkjoin_requests_conclude_from_every_branch(forkjoin_llm) -> None:
    """Fork/join requests of the fork/join collaborator: every request forks into one branch per outline, the
    numerals are right, and the conclusion names each branch's first number, which the branches' sampling
    decides; fewer sequential steps than the same text one token after another. The control: the same goal
    joined without its branches concludes at chance."""
    args = argparse.Namespace(tasks=FJ_TASKS, seed=0, min_items=12, max_items=20)
    report = answer_bench.forkjoin_answer(forkjoin_llm, args)
    rows = {r["side"]: r for r in report["results"]}
    fj, serial = rows["fork/join"], rows["one after another"]
    control = rows["join without the branches (control)"]
    assert fj["forked"] == 1.0
    assert fj["numerals_accuracy"] >= FJ_MIN_ACCURACY and fj["conclusion_accuracy"] >= FJ_MIN_ACCURACY
    assert fj["mean_sequential_steps"] <= 0.6 * serial["mean_sequential_steps"]
    assert control["conclusion_accuracy"] <= 0.25
