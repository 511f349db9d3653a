"""More Hogwild groups than the KV cache holds: groups wait, all finish, nothing leaks, no worker is preempted alone.

The module's engine also has a small step budget (64 tokens: every longer prompt's prefill
is chunked) and the operator switch ``client_patterns`` off.
"""

from __future__ import annotations

import pytest

from tests.integration.conftest import make_llm, scheduler_of, shutdown
from tests.integration.test_offline import hogwild_params, prompt_ids

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

NUM_BLOCKS = 24  # x 32 tokens
STEP_BUDGET = 64  # tokens per engine step


@pytest.fixture(scope="module")
def llm(tiny_model):
    engine = make_llm(tiny_model, num_gpu_blocks_override=NUM_BLOCKS, max_model_len=512,
                      max_num_batched_tokens=STEP_BUDGET, max_num_seqs=16, enable_chunked_prefill=True,
                      additional_config={"hogwild": {"client_patterns": False}})
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
    assert scheduler.table.stats.num_lone_preemptions == 0
    assert not scheduler.table.groups and not scheduler.parked and not scheduler.table.workers
    assert free_blocks(llm) == start


def test_a_group_that_can_never_fit_is_refused_up_front(llm) -> None:
    # 40 + 8 x 58 = 504 tokens fit the context, but 25 blocks do not fit the cache.
    with pytest.raises(ValueError, match="max_tokens: the group needs 25 KV blocks"):
        llm.generate([{"prompt_token_ids": prompt_ids(40, seed=1)}], hogwild_params(8, 58, seed=1), use_tqdm=False)
    ok = llm.generate([{"prompt_token_ids": prompt_ids(40, seed=2)}], hogwild_params(2, 8, seed=2), use_tqdm=False)
    assert [len(c.token_ids) for c in ok[0].outputs] == [8, 8]


def test_seeded_requests_with_a_chunked_prefill_equal_their_unchunked_run(llm) -> None:
    """vLLM 0.32 on the CPU kills the engine on a seeded request whose prefill is chunked (it rewinds a
    Philox offset CPU generators lack); with the switch on, the request runs, exactly as unchunked."""
    from vllm import SamplingParams

    prompt = prompt_ids(300, seed=77)  # 300 > STEP_BUDGET: the first run prefills in 5 chunks
    assert llm.llm_engine.vllm_config.scheduler_config.max_num_batched_tokens == STEP_BUDGET
    params = [SamplingParams(temperature=1.0, seed=5, max_tokens=16, ignore_eos=True),
              SamplingParams(n=3, temperature=1.0, seed=9, max_tokens=16, ignore_eos=True),
              hogwild_params(2, 16, seed=6)]
    chunked = llm.generate([{"prompt_token_ids": prompt, "cache_salt": "seeded"}] * 3, params, use_tqdm=False)
    # Again, with the prompt's 9 full blocks in the prefix cache: 12 tokens to compute, one step, no chunk.
    whole = llm.generate([{"prompt_token_ids": prompt, "cache_salt": "seeded"}] * 3, params, use_tqdm=False)
    tokens = lambda outs: [[list(c.token_ids) for c in o.outputs] for o in outs]  # noqa: E731
    assert tokens(chunked) == tokens(whole)
    assert [len(o.outputs) for o in chunked] == [1, 3, 2]
    assert len({tuple(c.token_ids) for c in chunked[1].outputs}) == 3  # seeds seed + i: the samples differ


def test_operator_switch_refuses_client_patterns_and_keeps_the_built_in_ones(llm) -> None:
    from vllm import SamplingParams

    prompt = {"prompt_token_ids": prompt_ids(30, seed=3)}
    for hogwild, field in [({"answer_pattern": r"(\d+)"}, "hogwild.answer_pattern"),
                           ({"layout": "combined", "step_end": "\n"}, "hogwild.step_end")]:
        bad = SamplingParams(n=2, temperature=1.0, max_tokens=4, extra_args={"hogwild": hogwild})
        with pytest.raises(ValueError, match=f"^{field.replace('.', '[.]')}: .*built-in"):
            llm.generate([prompt], bad, use_tqdm=False)
    # The collab protocol brings its own answer pattern and the default step end.
    collab = SamplingParams(n=2, temperature=1.0, seed=1, max_tokens=12, extra_args={"hogwild": {"protocol": "collab"}})
    (out,) = llm.generate([prompt], collab, use_tqdm=False)
    assert [c.text.startswith(f"**{name} [1]:** ") for name, c in zip(("Alice", "Bob"), out.outputs)] == [True, True]
