"""`vllm serve <the merges collaborator> --plugin hogwild`, called with the stock `openai` client.

One server for the module (the shipped weights, ``vllm_hogwild/models/merges-collaborator``). On a few seeded merges
tasks per mode, a group of 4 that reads each other ends paths by reference to a co-worker's (which no independent
request can read) and takes fewer steps than the split made in advance with a client that cancels the rest at the
last find (in all mode: the round-robin split; each share reusing its own paths); the isolated control (nobody
reads a co-worker) does not beat it, and in all mode takes about one worker's steps. In find mode every group is
streamed, and the test, as its client, closes the stream once the texts hold the prompt's count of finds. The training forward gives the logprobs the server returns for the model's
own sampled group; the flat pass over each reader's view does not. The demo's board runs in
tests/integration/test_examples_offline.py (``./run.sh``'s demo).
"""

from __future__ import annotations

import statistics

import pytest

from tests.server.collaborators import check_forward_matches_server, check_shipped_folder, serve, three_ways
from vllm_hogwild.models import merges_collaborator as C
from vllm_hogwild.models import solve
from vllm_hogwild.tasks import merges as M
from vllm_hogwild.tasks import merges_policy as P

pytestmark = [pytest.mark.vllm, pytest.mark.server]

TASKS = {mode: M.make_tasks(4, seed=31, mode=mode) for mode in M.MODES}
MAX_TOKENS = solve.links_budget([t for tasks in TASKS.values() for t in tasks])


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from serve(C, tmp_path_factory.mktemp("merges-server"), "merges")


@pytest.mark.parametrize("mode", M.MODES)
def test_four_workers_build_on_each_other_and_beat_the_split_with_cancel(server, mode: str) -> None:
    # find mode: the client cancels a group once its texts hold every start the prompt's count names
    until = (lambda task: lambda texts: M.find_done(task, texts)) if mode == "find" else None
    runs, steps = three_ways(server, C, TASKS[mode], MAX_TOKENS, until)
    scores = {key: [M.check(task, run[0]) for task, run in zip(TASKS[mode], value)] for key, value in runs.items()}
    cancel = [P.baseline_steps(task, 4, "split + cancel") for task in TASKS[mode]]
    correct = {key: [s.correct for s in value] for key, value in scores.items()}
    print(f"\n{mode}: steps {steps}, the split with cancel {cancel}; correct {correct}")
    # one worker answers most of the benchmark's tasks right in both modes (docs/benchmarks.md)
    assert sum(correct[1, "contiguous"]) >= 2 and sum(correct[4, "contiguous"]) >= 3
    right = [i for i, ok in enumerate(correct[4, "contiguous"]) if ok]  # a wrong answer may end early: not counted
    assert statistics.mean(steps[4, "contiguous"][i] for i in right) < statistics.mean(cancel[i] for i in right)
    # the group reuses co-workers' paths: references whose source another worker wrote
    assert sum(r.from_worker != r.worker for s in scores[4, "contiguous"] for r in s.references) >= len(TASKS[mode])
    # the control, where nobody reads a co-worker: every worker does every start (in all mode, as one worker does)
    assert statistics.mean(steps[4, "isolated"]) > statistics.mean(cancel)
    if mode == "all":
        assert statistics.mean(steps[4, "isolated"]) >= 0.95 * statistics.mean(steps[1, "contiguous"])


def test_the_training_forward_gives_the_servers_logprobs(server) -> None:
    check_forward_matches_server(server, C, C.MergesVocab.build(), TASKS["all"][0], MAX_TOKENS)


def test_the_shipped_folder_is_what_the_training_command_writes() -> None:
    check_shipped_folder(C, C.MergesVocab.build())
