"""Groups that take KV as they grow: preempted whole under a small cache, resumed by exact replay (CPU, tiny model).

Every group here runs in a KV cache far too small for all of them at once, so
the scheduler preempts whole groups (newest first) and resumes them later; a
resumed group re-feeds every token with the view it was produced under. The
dense oracle, which knows nothing of preemption, must still match every
worker's logprobs; a control engine that resumes groups with a plain re-prefill
of their lanes must miss it.
"""

from __future__ import annotations

import pytest
import torch

from tests.conftest import PROMPT_ID_TOP
from tests.hogwild_checks import collab_errors, max_err
from tests.hogwild_oracle import DenseHogwild
from tests.integration.conftest import make_llm, plain_replay, scheduler_of, shutdown
from tests.integration.test_offline import prompt_ids, sampled_logprobs

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

NUM_BLOCKS = 20  # x 32 tokens (the groups take about 47 for their whole budgets)
COLLAB_STEP_END = "[jqyz]"  # frequent in random text, absent from what the engine forces
STOPS = list(range(100, PROMPT_ID_TOP, 97))[:300]  # frequent stop tokens: some workers stop early (their lanes park)
# The collab group first, then raw ones: n, prompt length, max_tokens, stop tokens. vLLM's priority policy
# preempts the least urgent first (priority 9 here), the newest among equals.
RAW = [(4, 45, 40, False), (2, 40, 60, True), (2, 33, 60, True), (4, 50, 40, False), (2, 30, 60, False),
       (4, 30, 40, True)]
PRIORITY = [9, 0, 9, 1, 9, 2, 9]


def engine(tiny_model, **kw):
    return make_llm(tiny_model, num_gpu_blocks_override=NUM_BLOCKS, max_model_len=(NUM_BLOCKS - 1) * 32,
                    max_num_batched_tokens=128, max_num_seqs=16, enable_chunked_prefill=True,
                    scheduling_policy="priority", disable_log_stats=False,
                    additional_config={"hogwild": {"max_workers": 4}}, **kw)


@pytest.fixture(scope="module")
def oracle(tiny_model):
    from transformers import AutoModelForCausalLM

    return DenseHogwild(AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32))


def raw_params(n: int, max_tokens: int, seed: int, stops: bool):
    from vllm import SamplingParams

    return SamplingParams(n=n, temperature=1.0, seed=seed, max_tokens=max_tokens, ignore_eos=True, logprobs=0,
                          stop_token_ids=STOPS if stops else None,
                          extra_args={"hogwild": {"layout": "contiguous", "protocol": "raw"}})


def collab_params(n: int, seed: int):
    from vllm import SamplingParams

    return SamplingParams(n=n, temperature=1.0, seed=seed, max_tokens=48, logprobs=1, extra_args={"hogwild": {
        "protocol": "collab", "step_end": COLLAB_STEP_END, "redundancy_every": 40, "finisher": 6}})


def run_all(llm):
    """Every group in one generate call; each group's record (the scheduler's), in the same order."""
    prompts = [{"prompt_token_ids": prompt_ids(40, seed=500)}]
    params = [collab_params(3, 50)]
    prompts += [{"prompt_token_ids": prompt_ids(p, seed=300 + i)} for i, (_, p, _, _) in enumerate(RAW)]
    params += [raw_params(n, m, 40 + i, stops) for i, (n, _, m, stops) in enumerate(RAW)]
    outs = llm.generate(prompts, params, use_tqdm=False, priority=PRIORITY)
    ended = {e.group_id.split("-")[0]: e for e in scheduler_of(llm).table.stats.ended}  # "<request id>-<suffix>"
    return prompts, outs, [ended[out.request_id] for out in outs]


def hogwild_series() -> dict[str, float]:
    """The Hogwild counters as /metrics serves them (vLLM's get_metrics() reads "vllm:" series only)."""
    from prometheus_client import REGISTRY

    return {sample.name: sample.value for metric in REGISTRY.collect() if metric.name.startswith("hogwild:")
            for sample in metric.samples if sample.name.endswith("_total")}


def run_engine(tiny_model) -> dict:
    """One engine's run and what the tests read of it (the engine is shut down: one engine at a time)."""
    llm = engine(tiny_model)
    try:
        scheduler = scheduler_of(llm)
        start = scheduler.kv_cache_manager.block_pool.get_num_free_blocks()
        prompts, outs, ended = run_all(llm)
        table = scheduler.table
        return {"prompts": prompts, "outs": outs, "ended": ended, "tokenizer": llm.get_tokenizer(),
                "metrics": hogwild_series(),
                "group_preemptions": table.stats.num_group_preemptions,
                "lone_preemptions": table.stats.num_lone_preemptions,
                "replayed": table.stats.num_replayed_tokens,
                "left": bool(table) or bool(table.replays) or bool(scheduler.parked),
                "free": (start, scheduler.kv_cache_manager.block_pool.get_num_free_blocks())}
    finally:
        shutdown(llm)


@pytest.fixture(scope="module")
def exact(tiny_model) -> dict:
    return run_engine(tiny_model)


def errors(oracle, run) -> list[float]:
    prompts, outs, ended, tokenizer = run["prompts"], run["outs"], run["ended"], run["tokenizer"]
    out = []
    for k, (prompt, result) in enumerate(zip(prompts, outs)):
        tokens = [list(c.token_ids) for c in result.outputs]
        got = [sampled_logprobs(c) for c in result.outputs]
        record = ended[k]
        if k:
            out.append(max_err(got, oracle.logprobs(prompt["prompt_token_ids"], tokens)))
            continue
        forced = range(0)
        if record.finisher is not None:
            from vllm_hogwild.core.protocol_text import FINISHER_SUFFIX

            suffix = tokenizer.encode(FINISHER_SUFFIX["math"], add_special_tokens=False)
            own = tokens[record.finisher]
            start = next(i for i in range(len(own)) if own[i:i + len(suffix)] == suffix)
            forced = range(start, start + len(suffix) + 6)
        err, _, _ = collab_errors(oracle, tokenizer, list(result.prompt_token_ids), tokens, got,
                                  COLLAB_STEP_END, record.finisher, forced)
        out.append(err)
    return out


def test_preempted_groups_resume_exactly(exact, oracle) -> None:
    outs, ended = exact["outs"], exact["ended"]
    preemptions = [e.num_preemptions for e in ended]
    errs = errors(oracle, exact)
    print(f"\npreemptions per group {preemptions}, tokens replayed {[e.num_replayed_tokens for e in ended]}; "
          "max |logprob - oracle| " + ", ".join(f"{e:.1e}" for e in errs))
    assert sum(preemptions) >= 3 and max(preemptions) >= 2, preemptions  # a group resumed twice
    assert all(e <= 1e-4 for e in errs), errs
    resumed = [k for k, e in enumerate(ended) if e.num_replayed_tokens]  # preempted after it had decoded
    assert 0 in resumed, preemptions  # the collab group (combined, forced text, the finisher)
    assert {RAW[k - 1][0] for k in resumed if k} == {2, 4}, preemptions  # raw n=2 and n=4
    stopped_early = [k for k in resumed if k and min(len(c.token_ids) for c in outs[k].outputs) < RAW[k - 1][2]]
    assert stopped_early, "a resumed group had a lane that had stopped: it was re-fed by a replay request"


def test_preemptions_are_on_the_metrics_and_nothing_leaks(exact) -> None:
    metrics = exact["metrics"]
    assert exact["group_preemptions"] >= 3 and exact["lone_preemptions"] == 0
    assert metrics["hogwild:group_preemptions_total"] == exact["group_preemptions"]
    assert metrics["hogwild:replayed_tokens_total"] == exact["replayed"] > 0
    assert metrics["hogwild:member_preemptions_total"] == 0
    assert not exact["left"]
    assert exact["free"][1] == exact["free"][0]


def test_a_plain_re_prefill_on_resumption_misses_the_oracle(tiny_model, oracle, exact) -> None:
    """The control: the same groups, resumed by re-feeding each lane as a plain prefill of itself."""
    with plain_replay():
        control = run_engine(tiny_model)
    errs = errors(oracle, control)
    replayed = [e.num_replayed_tokens for e in control["ended"]]  # a group preempted before it decoded replays none
    print(f"\ncontrol: tokens replayed per group {replayed}, errors " + ", ".join(f"{e:.1e}" for e in errs))
    missed = [e for e, r in zip(errs, replayed) if r]
    assert len(missed) >= 2 and all(e > 1e-2 for e in missed), (errs, replayed)


@pytest.fixture(scope="module")
def fcfs(tiny_model, exact):
    """First come, first served (vLLM's default policy: the newest running unit is preempted first)."""
    llm = make_llm(tiny_model, num_gpu_blocks_override=NUM_BLOCKS, max_model_len=(NUM_BLOCKS - 1) * 32,
                   max_num_batched_tokens=128, max_num_seqs=32, enable_chunked_prefill=True,
                   additional_config={"hogwild": {"max_workers": 4}})
    yield llm
    shutdown(llm)


def free_blocks(llm) -> int:
    return scheduler_of(llm).kv_cache_manager.block_pool.get_num_free_blocks()


@pytest.mark.parametrize("workers,max_tokens", [(2, 48), (4, 40)])
def test_far_more_groups_than_fit_all_finish_without_livelock(fcfs, workers: int, max_tokens: int) -> None:
    start = free_blocks(fcfs)
    groups = 24 if workers == 2 else 16
    prompts = [{"prompt_token_ids": prompt_ids(30 + i % 20, seed=900 + i)} for i in range(groups)]
    params = [raw_params(workers, max_tokens, 70 + i, stops=i % 2 == 0) for i in range(groups)]
    outs = fcfs.generate(prompts, params, use_tqdm=False)
    ended = list(scheduler_of(fcfs).table.stats.ended)[-groups:]
    preemptions = sorted(e.num_preemptions for e in ended)
    generated, replayed = sum(sum(e.output_lens) for e in ended), sum(e.num_replayed_tokens for e in ended)
    print(f"\n{groups} groups of {workers}: preemptions per group {preemptions}; replayed {replayed} of "
          f"{generated} generated tokens ({replayed / generated:.1%})")
    assert all(len(o.outputs) == workers and all(c.finish_reason in ("stop", "length") for c in o.outputs)
               for o in outs)
    assert sum(preemptions) >= 5 and max(preemptions) <= 5, preemptions
    assert replayed < generated / 2
    assert free_blocks(fcfs) == start and not scheduler_of(fcfs).table


def test_a_streamed_group_delivers_every_token_once_across_preemptions(fcfs, oracle) -> None:
    """Offline streaming (vLLM's DELTA outputs): each worker's deltas, concatenated, are its whole completion,
    in order, and match the oracle, while the group is preempted and resumed beside others."""
    from vllm.sampling_params import RequestOutputKind

    engine = fcfs.llm_engine
    prompts = {f"s{i}": prompt_ids(35 + i, seed=700 + i) for i in range(8)}
    for i, (request_id, prompt) in enumerate(prompts.items()):
        params = raw_params(4 if i % 2 else 2, 40, 90 + i, stops=False)
        params.output_kind = RequestOutputKind.DELTA
        engine.add_request(request_id, {"prompt_token_ids": prompt}, params)
    tokens: dict[tuple[str, int], list[int]] = {}
    logprobs: dict[tuple[str, int], list[float]] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            for c in out.outputs:
                tokens.setdefault((out.request_id, c.index), []).extend(c.token_ids)
                logprobs.setdefault((out.request_id, c.index), []).extend(sampled_logprobs(c))
    ended = {e.group_id.split("-")[0]: e for e in scheduler_of(fcfs).table.stats.ended}
    resumed = [r for r in prompts if ended[r].num_replayed_tokens]
    print(f"\nstreamed groups resumed after decoding: {resumed}")
    assert resumed
    for request_id, prompt in prompts.items():
        n = ended[request_id].num_workers
        lanes = [tokens[(request_id, w)] for w in range(n)]
        assert [len(t) for t in lanes] == ended[request_id].output_lens == [40] * n  # no duplicate, no gap
        expected = oracle.logprobs(prompt, lanes)
        assert max_err([logprobs[(request_id, w)] for w in range(n)], expected) <= 1e-4, request_id


@pytest.mark.parametrize("when", ["preempted", "replaying"])
def test_aborting_a_preempted_or_replaying_group_frees_everything(fcfs, when: str) -> None:
    from vllm_hogwild.core.groups.group import Phase

    engine, scheduler = fcfs.llm_engine, scheduler_of(fcfs)
    start = free_blocks(fcfs)
    for i in range(10):
        engine.add_request(f"a{when}{i}", {"prompt_token_ids": prompt_ids(40, seed=800 + i)},
                           raw_params(2 + 2 * (i % 2), 48, 60 + i, stops=True))
    target = Phase.PREEMPTED if when == "preempted" else Phase.REPLAYING
    aborted = None
    while engine.has_unfinished_requests():
        engine.step()
        if aborted is None:
            group = next((g for g in scheduler.table.groups.values() if g.phase is target), None)
            if group is not None:
                aborted = group.group_id.split("-")[0]
                engine.abort_request([aborted])
    assert aborted is not None, f"no group was {when}"
    assert free_blocks(fcfs) == start
    table = scheduler.table
    assert not table and not table.replays and not scheduler.parked and not scheduler.requests
