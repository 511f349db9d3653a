"""Fairness between Hogwild groups and plain requests (pure)."""

from __future__ import annotations

import pytest

from vllm_hogwild.core.groups.policy import Decision, Fairness

F = Fairness(max_plain_wait=2.0)


@pytest.mark.parametrize("now,group,fits,plain,expected", [
    (10.0, 9.0, True, None, Decision.ADMIT),  # nobody waits
    (10.0, 9.0, True, 9.5, Decision.ADMIT),  # the plain request is newer than the group
    (10.0, 9.0, True, 8.5, Decision.ADMIT),  # older, but has waited 1.5 s < 2 s: the group may go first
    (10.0, 9.0, True, 8.0, Decision.WAIT),  # older and has waited 2 s: it goes first
    (10.0, 9.0, False, None, Decision.WAIT),  # no room yet, the group has waited 1 s
    (10.0, 8.0, False, None, Decision.DEFER_NEWER),  # no room after 2 s: newer plain requests wait too
    (10.0, 8.0, False, 9.0, Decision.DEFER_NEWER),
    (10.0, 8.0, False, 7.0, Decision.WAIT),  # an older plain request that waited long goes first anyway
])
def test_arrival_order_with_a_bounded_overtake(now, group, fits, plain, expected) -> None:
    assert F.decide(now, group, fits, plain) is expected


def test_zero_bound_is_strict_arrival_order() -> None:
    strict = Fairness(0.0)
    assert strict.decide(10.0, 9.0, True, 8.999) is Decision.WAIT
    assert strict.decide(10.0, 9.0, True, 9.001) is Decision.ADMIT
    assert strict.decide(10.0, 10.0, False, None) is Decision.DEFER_NEWER


def test_lane_hashes_keep_the_prompts_blocks_and_salt_the_rest_per_lane() -> None:
    """The prompt's full blocks keep vLLM's hashes (shared with co-workers and plain requests); every block past
    them is salted with the lane, so two lanes with the same tokens never share one. Every worker shares one
    hasher function (vLLM's call site stays on one callee); a replay request salts with its own id and keeps
    its group's prompt blocks shared although its own prompt is the whole lane."""
    from types import SimpleNamespace

    from vllm_hogwild.scheduler.kv import LaneHashers

    bs = 4

    def vllm_hasher(request):  # as vLLM's: a hash of each block filled since the last call, chained
        full = request.num_tokens // bs
        return [bytes([b]) * 32 for b in range(len(request.block_hashes), full)]

    def grow(hasher, request_id, prompt_len, num_tokens):
        request = SimpleNamespace(block_hashes=[], num_tokens=0, num_prompt_tokens=prompt_len, request_id=request_id)
        for n in range(1, num_tokens + 1):
            request.num_tokens = n
            request.block_hashes += hasher(request)
        return request.block_hashes

    lanes = LaneHashers(bs)
    worker = lanes.for_worker(vllm_hasher)
    assert lanes.for_worker(vllm_hasher) is worker and lanes.for_worker(worker) is worker  # one for all workers
    assert lanes.base(worker) is vllm_hasher and lanes.base(vllm_hasher) is vllm_hasher
    assert lanes.for_worker(None) is None and lanes.for_replay(None, 9, "0_g@replay1") is None  # caching off
    plain = grow(vllm_hasher, "p", 9, 18)
    lane_a, lane_b = grow(worker, "0_g", 9, 18), grow(worker, "1_g", 9, 18)
    assert len(plain) == len(lane_a) == len(lane_b) == 4
    assert lane_a[:2] == lane_b[:2] == plain[:2]  # the prompt's full blocks (9 tokens: 2): vLLM's own hashes
    assert all(x != y and x != p and y != p for x, y, p in zip(lane_a[2:], lane_b[2:], plain[2:]))
    assert grow(worker, "0_g", 9, 18) == lane_a  # deterministic per lane
    replay = lanes.for_replay(worker, 9, "0_g@replay1")
    again = grow(replay, "0_g@replay1", 17, 18)  # its prompt: the lane's 17 tokens, of which the group's 9
    assert again[:2] == plain[:2] and all(x != y for x, y in zip(again[2:], lane_a[2:]))
