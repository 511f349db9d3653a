"""The shipped merges collaborator offline (``LLM``), as the benchmark runs it: find-mode groups cancelled by their
client at the last find (``solve.run_merges_groups``), and ``bench answer --task merges`` over several sampling
seeds. The figures are the benchmark's (docs/benchmarks.md); here, that the client cancels where the texts first
hold every find, that a cancelled group is counted one step after it, and that the records name each seed."""

from __future__ import annotations

import pytest

from benchmarks import bench
from tests.integration.conftest import shutdown
from vllm_hogwild.models import merges_collaborator as C
from vllm_hogwild.models import solve
from vllm_hogwild.tasks import merges as M

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

TASKS = M.make_tasks(4, seed=7, mode="find")


@pytest.fixture(scope="module")
def llm():
    engine = solve.links_engine(None, "merges")
    yield engine
    shutdown(engine)


def test_the_client_cancels_a_find_mode_group_at_its_last_find(llm) -> None:
    vocab = C.MergesVocab.build()
    runs, _ = solve.run_merges_groups(llm, TASKS, 4, "contiguous", seed=1)
    cancelled = [(task, run) for task, run in zip(TASKS, runs) if run.cancelled]
    assert len(cancelled) >= 3, [(r.cancelled, r.steps) for r in runs]
    for task, run in zip(TASKS, runs):
        if not run.cancelled:  # it ended by itself (every worker wrote its end of sequence): counted as it ran
            assert run.steps == max(map(len, run.token_ids))
    for task, run in cancelled:
        last = max(map(len, run.token_ids))
        assert run.steps == last + 1  # the step after the last it read, as the split with cancel is counted
        assert len(M.written_finds(run.texts, len(task.paths))) >= len(task.answer)
        before = [C.text_of(vocab, ids[:last - 1]) for ids in run.token_ids]
        assert len(M.written_finds(before, len(task.paths))) < len(task.answer)  # not a step later than due
    assert sum(M.check(task, run.texts).correct for task, run in cancelled) >= len(cancelled) - 1
    # in all mode nothing is cancelled: every group runs to its end
    runs, _ = solve.run_merges_groups(llm, M.make_tasks(2, seed=7, mode="all"), 4, "contiguous", seed=1)
    assert not any(r.cancelled for r in runs)
    assert all(r.steps == max(map(len, r.token_ids)) for r in runs)


def test_the_benchmark_keeps_every_sampling_seed(llm, tmp_path) -> None:
    args = bench.build_parser().parse_args(
        ["answer", "--task", "merges", "--mode", "find", "--workers", "4", "--tasks", "3", "--layouts", "contiguous",
         "--sampling-seeds", "2", "--json", str(tmp_path / "m.json")])
    report = bench.run(args, llm)
    model = [r for r in report["results"] if r["layout"] == "contiguous"]
    assert len(model) == 1 and model[0]["sampling_seeds"] == [0, 1] and model[0]["tasks"] == 3
    steps = model[0]["steps_by_seed"]
    assert len(steps) == 2 and model[0]["mean_sequential_steps"] == pytest.approx(sum(steps) / 2)
    assert "means over 2 sampling seeds" in bench.markdown(report)
