"""tests/integration/scripted.py's processor for Model Runner V2's interface: the same script, the same rule.

V2 keeps each request's token ids in its own state (``all_token_ids`` up to ``total_len``, the prompt first) and
gives a processor every logits row of the step with its request's slot; a request that verifies drafts has one
row per draft, each predicting the token after the drafts before it (this step's input ids).
"""

from __future__ import annotations

import torch
from vllm.v1.worker.gpu.sample.logits_processor import LogitsProcessor

from tests.integration.scripted import KEY, forced


class ScriptedText(LogitsProcessor):
    def __init__(self, vllm_config, req_states) -> None:
        self.req_states = req_states
        self.scripts: dict[int, list] = {}  # request slot -> its script

    def add_request(self, req_idx: int, sampling_params) -> bool:
        script = (sampling_params.extra_args or {}).get(KEY)
        if script:
            self.scripts[req_idx] = script
        else:
            self.scripts.pop(req_idx, None)
        return bool(script)

    def apply(self, logits: torch.Tensor, ctx) -> torch.Tensor:
        if not self.scripts:
            return logits
        states = self.req_states
        slots, local = ctx.expanded_idx_mapping.tolist(), ctx.expanded_local_pos.tolist()
        fed = ctx.input_ids.tolist()
        for row, slot in enumerate(slots):
            script = self.scripts.get(slot)
            if script is None:
                continue
            start, end = int(states.prompt_len.np[slot]), int(states.total_len.gpu[slot])
            output = states.all_token_ids.gpu[slot, start:end].tolist()
            output += fed[row - local[row] + 1: row + 1]  # the drafts this row's token follows
            token = forced(script, output)
            if token is not None:
                logits[row] = float("-inf")
                logits[row, token] = 0.0
        return logits
