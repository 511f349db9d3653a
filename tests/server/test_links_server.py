"""`vllm serve <the links collaborator> --plugin hogwild`, called with the stock `openai` client.

One server for the module (the shipped weights, ``vllm_hogwild/models/links-collaborator``). On a few seeded tasks
per mode, a group of 4 that reads each other takes fewer steps than the round-robin split made in advance (worker
``i`` takes starts ``i, i + 4, ...``) takes on the same tasks, from their true costs; in find mode it stays within
1.25x of the honest baseline there, that split with a client that cancels the rest at the find (reading gains
little over it in find mode: docs/user_guide.md); the isolated control (nobody reads a co-worker) does not beat one
worker. And the training forward gives the logprobs the server returns for
the model's own sampled group; the flat pass over each reader's view does not.
"""

from __future__ import annotations

import statistics

import pytest

from tests.server.collaborators import check_forward_matches_server, check_shipped_folder, serve, three_ways
from vllm_hogwild.tasks import links as L
from vllm_hogwild.models import links_collaborator as C
from vllm_hogwild.models import solve

pytestmark = [pytest.mark.vllm, pytest.mark.server]

TASKS = {mode: L.make_tasks(4, seed=31, mode=mode) for mode in L.MODES}
MAX_TOKENS = solve.links_budget([t for tasks in TASKS.values() for t in tasks])


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from serve(C, tmp_path_factory.mktemp("links-server"), "links")


@pytest.mark.parametrize("mode", L.MODES)
def test_four_workers_beat_the_split_made_in_advance_and_the_isolated_control_does_not(server, mode: str) -> None:
    runs, steps = three_ways(server, C, TASKS[mode], MAX_TOKENS)
    correct = {key: [L.check(task, texts).correct for task, (texts, _, _) in zip(TASKS[mode], value)]
               for key, value in runs.items()}
    split = [L.round_robin_steps(task, 4) for task in TASKS[mode]]
    cancel = [L.split_cancel_steps(task, 4) for task in TASKS[mode]]
    print(f"\n{mode}: steps {steps}, the round-robin split {split}, with cancel {cancel}; correct {correct}")
    # The model answers 0.8 to 0.95 of held-out tasks (docs/benchmarks.md): most of these, not all.
    assert sum(correct[1, "contiguous"]) >= 3 and sum(correct[4, "contiguous"]) >= 3
    right = [i for i, ok in enumerate(correct[4, "contiguous"]) if ok]  # a wrong answer may end early: not counted
    assert statistics.mean(steps[4, "contiguous"][i] for i in right) < statistics.mean(split[i] for i in right)
    group = statistics.mean(steps[4, "contiguous"][i] for i in right)
    assert group <= 1.25 * statistics.mean(cancel[i] for i in right)  # all mode: the same split, nothing cancelled
    assert statistics.mean(steps[4, "isolated"]) >= 0.9 * statistics.mean(steps[1, "contiguous"])


def test_the_training_forward_gives_the_servers_logprobs(server) -> None:
    check_forward_matches_server(server, C, C.LinksVocab.build(), TASKS["all"][0], MAX_TOKENS)


def test_the_shipped_folder_is_what_the_training_command_writes() -> None:
    check_shipped_folder(C, C.LinksVocab.build())
