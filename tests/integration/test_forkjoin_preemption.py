"""Fork/join requests under a KV cache too small for them all (CPU, tiny model): preempted whole, replayed exactly.

Fork/join requests (flat forks, hogwild branches, a nested fork with a second fork of the trunk) and plain
requests share a cache of a few blocks; the fork/join requests are the least urgent (vLLM's priority policy;
the nested one least of all), so they are the ones preempted, at any point of their forks. A resumed request re-feeds every token with the
view it had: the forks as they stood at its step. The dense oracle (tests/forkjoin_oracle.py), which knows
nothing of preemption, must match every token of every branch and of every trunk; a control engine that
resumes them by re-feeding each lane as a plain prefill of itself must miss it.
"""

from __future__ import annotations

import pytest
import torch

from tests.forkjoin_oracle import DenseForkJoin
from tests.integration.conftest import make_llm, plain_replay, scheduler_of, shutdown
from tests.integration.scripted import SCRIPTED
from tests.integration.test_forkjoin import (GOALS, header_lens, nested_params, params, split, split_tree,
                                             tree_error)

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

NUM_BLOCKS = 21  # x 32 tokens; every request below fits alone (the nested one takes up to 19 blocks)
CASES = [  # (goal, max_tokens, branch mode, priority); None: the nested request, admitted first, preempted first
    (None, 80, "isolated", 9),
    (("multiverse", 2), 64, "isolated", 8),
    (("multiverse", 4), 48, "isolated", 8),
    (("multiverse", 3), 48, "hogwild", 9),
    (("multiverse", 2), 64, "isolated", 8),
]
PLAIN = 4  # plain requests beside them, more urgent


def run_engine(tiny_model) -> dict:
    from vllm import SamplingParams

    llm = make_llm(tiny_model, num_gpu_blocks_override=NUM_BLOCKS, max_model_len=(NUM_BLOCKS - 1) * 32,
                   max_num_batched_tokens=128, max_num_seqs=24, enable_chunked_prefill=True,
                   scheduling_policy="priority", logits_processors=[SCRIPTED],
                   additional_config={"hogwild": {"max_workers": 6}})
    try:
        tokenizer = llm.get_tokenizer()
        prompts, sps = [], []
        for i, (goal, max_tokens, mode, _) in enumerate(CASES):
            prompts.append(GOALS[goal or ("multiverse", 2)])
            sps.append(nested_params(tokenizer, max_tokens, seed=80 + i) if goal is None else
                       params(goal[0], max_tokens, seed=80 + i, branches=mode, max_branches=goal[1]))
        prompts += [f"A plain request, number {i}, beside them." for i in range(PLAIN)]
        sps += [SamplingParams(temperature=1.0, seed=30 + i, max_tokens=160, ignore_eos=True) for i in range(PLAIN)]
        priority = [c[3] for c in CASES] + [0] * PLAIN
        outs = llm.generate(prompts, sps, use_tqdm=False, priority=priority)
        scheduler = scheduler_of(llm)
        ended = {e.group_id.split("-")[0]: e for e in scheduler.table.stats.ended}  # "<request id>-<suffix>"
        return {"prompts": [tokenizer.encode(p) for p in prompts], "outs": outs,
                "headers": [None if goal is None else header_lens(tokenizer, *goal) for goal, _, _, _ in CASES],
                "ended": [ended[o.request_id] for o in outs[:len(CASES)]],
                "left": bool(scheduler.table) or bool(scheduler.table.replays) or bool(scheduler.parked)}
    finally:
        shutdown(llm)


@pytest.fixture(scope="module")
def oracle(tiny_model):
    from transformers import AutoModelForCausalLM

    return DenseForkJoin(AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32))


@pytest.fixture(scope="module")
def exact(tiny_model) -> dict:
    return run_engine(tiny_model)


def errors(oracle, run) -> list[float]:
    out = []
    for (goal, _, mode, _), prompt, result, headers in zip(CASES, run["prompts"], run["outs"], run["headers"]):
        completion = result.outputs[0]
        if goal is None or mode == "isolated":
            ids = list(completion.token_ids)
            lps = [step[t].logprob for step, t in zip(completion.logprobs, ids)]
            tokens, got = split_tree(ids, lps, completion.hogwild["forks"])
            out.append(tree_error(got, oracle.tree_logprobs(prompt, tokens)))
            continue
        (trunk, trunk_lp), branches, f = split(completion)
        want_trunk, want_branches = oracle.logprobs(prompt, trunk, [b for b, _ in branches], f, hogwild=True,
                                                    headers=headers)
        got = [trunk_lp, *[lp for _, lp in branches]]
        out.append(max(abs(a - b) for g, e in zip(got, [want_trunk, *want_branches]) for a, b in zip(g, e)))
    return out


def test_preempted_fork_join_requests_resume_exactly(exact, oracle) -> None:
    ended = exact["ended"]
    preemptions = [e.num_preemptions for e in ended]
    replayed = [e.num_replayed_tokens for e in ended]
    errs = errors(oracle, exact)
    print(f"\npreemptions per request {preemptions}, tokens replayed {replayed}; max |logprob - oracle| "
          + ", ".join(f"{e:.1e}" for e in errs))
    assert all(o.outputs[0].hogwild["forked"] for o in exact["outs"][:len(CASES)])
    assert all(e <= 1e-4 for e in errs), errs
    resumed = [k for k, r in enumerate(replayed) if r]  # preempted after their branches had decoded
    assert len(resumed) >= 3 and sum(preemptions) >= 4, (preemptions, replayed)
    assert 0 in resumed, "the nested request was preempted after it had decoded, and resumed exactly"
    assert 3 in resumed, "a request of hogwild branches too"
    assert not exact["left"], "every lane freed"
    assert all(len(o.outputs[0].token_ids) == 160 for o in exact["outs"][len(CASES):]), "plain requests whole"


def test_a_plain_re_prefill_on_resumption_misses_the_oracle(tiny_model, oracle, exact) -> None:
    """The control: the same requests, resumed by re-feeding each lane as a plain prefill of itself."""
    with plain_replay():
        control = run_engine(tiny_model)
    errs = errors(oracle, control)
    replayed = [e.num_replayed_tokens for e in control["ended"]]
    print(f"\ncontrol: tokens replayed per request {replayed}, errors " + ", ".join(f"{e:.1e}" for e in errs))
    # A request of isolated branches preempted before its join re-feeds lanes whose views are their own
    # prefixes (each branch reads the prompt and itself), which a plain prefill replays exactly; every other
    # resumption re-feeds a view a plain prefill does not have (the hogwild branches' siblings, a joined trunk).
    missed = [e for e, r in zip(errs, replayed) if r and e > 1e-2]
    assert len(missed) >= 3 and errs[3] > 1e-2, (errs, replayed)
