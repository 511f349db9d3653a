"""More Hogwild groups than the KV cache holds: groups wait, all finish, nothing leaks or is preempted."""

from __future__ import annotations

import pytest

from tests.integration.conftest import make_llm, scheduler_of, shutdown
from tests.integration.test_offline import hogwild_params, prompt_ids

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

NUM_BLOCKS = 24  # x 32 tokens


@pytest.fixture(scope="module")
def llm(tiny_model):
    engine = make_llm(tiny_model, num_gpu_blocks_override=NUM_BLOCKS, max_model_len=512,
                      additional_config={"hogwild": {}})
    yield engine
    shutdown(engine)


def free_blocks(llm) -> int:
    return scheduler_of(llm).kv_cache_manager.block_pool.get_num_free_blocks()


def test_groups_wait_for_room_and_all_finish(llm) -> None:
    from vllm import SamplingParams

    start = free_blocks(llm)
    # Each group needs 9 blocks for its whole budget: at most two fit at once.
    groups = [hogwild_params(2, 100, seed=i) for i in range(6)]
    plain = [SamplingParams(temperature=0.0, max_tokens=150, ignore_eos=True) for _ in range(3)]
    prompts = [{"prompt_token_ids": prompt_ids(40, seed=200 + i)} for i in range(9)]
    outs = llm.generate(prompts, groups + plain, use_tqdm=False)
    assert [[len(c.token_ids) for c in o.outputs] for o in outs[:6]] == [[100, 100]] * 6
    assert [len(o.outputs[0].token_ids) for o in outs[6:]] == [150] * 3
    scheduler = scheduler_of(llm)
    assert scheduler.stats.num_member_preemptions == 0
    assert not scheduler.groups and not scheduler.parked and not scheduler.group_of
    assert free_blocks(llm) == start


def test_a_group_that_can_never_fit_is_refused_up_front(llm) -> None:
    # 40 + 8 x 58 = 504 tokens fit the context, but 25 blocks do not fit the cache.
    with pytest.raises(ValueError, match="max_tokens: the group needs 25 KV blocks"):
        llm.generate([{"prompt_token_ids": prompt_ids(40, seed=1)}], hogwild_params(8, 58, seed=1), use_tqdm=False)
    ok = llm.generate([{"prompt_token_ids": prompt_ids(40, seed=2)}], hogwild_params(2, 8, seed=2), use_tqdm=False)
    assert [len(c.token_ids) for c in ok[0].outputs] == [8, 8]
