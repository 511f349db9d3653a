"""A logits processor for the tests: scripted text at given points of a lane's output.

The engine tests run a tiny random model, which never writes a family's goal, so nothing would ever fork
inside a branch or after a join. A model trained to branch (Multiverse, NPR) cannot run here; this stands in
for its writing: a request whose ``extra_args["test_script"]`` is a list of ``[trigger, text]`` token-id
pairs writes ``text`` right after the first place where its output holds ``trigger`` (``trigger`` may start
with :data:`START`: only at the output's start). Every lane of a fork/join request has the same sampling
parameters, so a trigger picks its lane by what only that lane writes (a branch's header, say). What it
writes is ordinary sampled text to the engine: fed, read by its readers, reported with the model's own
log-probabilities (vLLM reports those from the logits before any processor). The engine's own forced tokens
win a step both force (its processor comes after this one). A function of the output alone, so a lane
preempted and resumed writes the same.
"""

from __future__ import annotations

import torch

from tests.conftest import TEST_RUNNER

# The processor of the interface of the model runner the tests run (tests/conftest.py).
SCRIPTED = "tests.integration.scripted:ScriptedText" if TEST_RUNNER == "v1" else "tests.integration.scripted_v2:ScriptedText"
KEY = "test_script"
START = -1  # a trigger's first id: the trigger must open the output


def forced(script: list, output: list[int]) -> int | None:
    """The token the script makes the lane write next, given its output so far (None: its own choice)."""
    n = len(output)
    for trigger, text in script:
        anchored = bool(trigger) and trigger[0] == START
        trigger = trigger[1:] if anchored else trigger
        ends = [len(trigger)] if anchored else range(len(trigger), n + 1)
        at = next((e for e in ends if e <= n and output[e - len(trigger):e] == trigger), None)
        if at is not None and n - at < len(text):
            return text[n - at]
    return None


from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality  # noqa: E402


class ScriptedText(LogitsProcessor):
    """V1's interface: the runner hands each row's live output list."""

    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool) -> None:
        self.rows: dict[int, tuple[list, list[int]]] = {}  # batch row -> (script, the request's live output ids)

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return
        for index in batch_update.removed:
            self.rows.pop(index, None)
        for index, params, _, output in batch_update.added:
            script = ((params.extra_args or {}).get(KEY) if params is not None else None)
            if script:
                self.rows[index] = (script, output)
            else:
                self.rows.pop(index, None)
        for a, b, direction in batch_update.moved:
            row_a, row_b = self.rows.pop(a, None), self.rows.pop(b, None)
            if row_a is not None:
                self.rows[b] = row_a
            if direction is MoveDirectionality.SWAP and row_b is not None:
                self.rows[a] = row_b

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for index, (script, output) in self.rows.items():
            token = forced(script, output)
            if token is not None and index < logits.shape[0]:
                logits[index] = float("-inf")
                logits[index, token] = 0.0
        return logits
