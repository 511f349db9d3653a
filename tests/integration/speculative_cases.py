"""Hogwild with speculative decoding on a real vLLM engine (CPU, float32, tiny random Llama).

Two engines: n-gram prompt lookup, and a draft model (a one-layer tiny random
Llama). Each worker verifies its drafts as one multi-token row through the
shared cache; co-workers read only accepted tokens. Every completion carries the
engine step at which each of its tokens was accepted, and the dense oracle,
given those steps, scores every token (docs/user_guide.md, "Speculative
decoding").

Run in a process of its own by ``tests/integration/test_speculative.py`` (see
the engine order below). Workers sample at temperature 0.7: on the CPU the
plugin's worker fixes vLLM 0.32's rejection sampler first
(``vllm_hogwild/runner/cpu_sampling.py``: without it the sampler judged drafts
at garbage temperatures, and ``top_k`` killed the engine in a step without
drafts), and seeded runs then repeat exactly. The rejection sampler accepts a
draft with the probability the target gives it, and a random model's
distributions are nearly flat: the model here is the tiny Llama with its
(tied) embeddings scaled by 10, whose peaked distributions fall into loops
that the proposers copy. Every run is scored by the oracle. The CPU attention
backend takes 32-token blocks or multiples with speculative decoding.

Engine order: the draft model's engine first. Once the n-gram proposer has
loaded numba, vLLM 0.32's CPU kernel-override scan fails on llvmlite objects
when a further engine starts in the same process (``AttributeError`` in
``vllm/triton_utils/dispatcher.py``), so the n-gram engine is the last one this
process starts.
"""

from __future__ import annotations

import pytest
import torch

from tests.conftest import PROMPT_ID_TOP, TEST_RUNNER
from tests.forkjoin_oracle import DenseForkJoin
from tests.hogwild_checks import collab_errors, max_err
from tests.hogwild_oracle import DenseHogwild
from tests.integration.conftest import make_llm, scheduler_of, shutdown

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

BLOCK = 32
NUM_SPEC = 3
BUDGET = 48
TEMPERATURE = 0.7
CASES = [2, 4]  # workers
PERIODS = [12, 3, 1, 6]  # groups per case, each prompt a random run of this period, repeated


def repeated_prompt(seed: int, period: int = 12, times: int = 4) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(100, PROMPT_ID_TOP, (period,), generator=g).tolist() * times


def raw_params(n: int, seed: int, layout: str = "contiguous", max_tokens: int = BUDGET):
    from vllm import SamplingParams

    return SamplingParams(n=n, temperature=TEMPERATURE, seed=seed, max_tokens=max_tokens, ignore_eos=True,
                          logprobs=0, extra_args={"hogwild": {"layout": layout, "protocol": "raw"}})


def sampled_logprobs(completion) -> list[float]:
    return [step[tok].logprob for step, tok in zip(completion.logprobs, completion.token_ids)]


def accept_steps(out) -> list[list[int]]:
    steps = [list(c.hogwild["accept_steps"]) for c in out.outputs]
    for c, s in zip(out.outputs, steps):
        assert len(s) == len(c.token_ids) and s == sorted(s), s
    return steps


def multi(steps: list[int]) -> int:
    """Steps in which a worker accepted more than one token."""
    return sum(1 for s in set(steps) if steps.count(s) > 1)


def scaled_model(tiny_model, folder, scale: float):
    """The tiny Llama with its tied embeddings scaled: more peaked next-token distributions."""
    import shutil

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(scale)
    model.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (tiny_model / name).exists():
            shutil.copy(tiny_model / name, folder / name)
    return folder


@pytest.fixture(scope="module")
def peaky_model(tiny_model, tmp_path_factory):
    return scaled_model(tiny_model, tmp_path_factory.mktemp("peaky-llama"), 10.0)


@pytest.fixture(scope="module")
def oracle(peaky_model):
    from transformers import AutoModelForCausalLM

    return DenseHogwild(AutoModelForCausalLM.from_pretrained(peaky_model, dtype=torch.float32))


def spec_engine(model, speculative_config):
    return make_llm(model, block_size=BLOCK, additional_config={"hogwild": {"max_workers": 4}},
                    speculative_config=speculative_config, disable_log_stats=False)


@pytest.fixture(scope="module")
def draft_llm(peaky_model):
    # The draft model is the target itself, reading its own lane only (plain attention): its drafts
    # are what the worker would write without its co-workers.
    engine = spec_engine(peaky_model, {"method": "draft_model", "model": str(peaky_model),
                                       "num_speculative_tokens": NUM_SPEC})
    yield engine
    shutdown(engine)


def raw_runs(llm, seed: int, **sampling) -> list:
    """(n, prompt, output) per group: every case's groups in ONE generate call."""
    shapes = [(n, repeated_prompt(seed + 10 * n + i, period), seed + 10 * n + i)
              for n in CASES for i, period in enumerate(PERIODS)]
    params = [raw_params(n, seed=s) for n, _, s in shapes]
    for p in params:
        for name, value in sampling.items():
            setattr(p, name, value)
    outputs = llm.generate([{"prompt_token_ids": p} for _, p, _ in shapes], params, use_tqdm=False)
    return [(n, p, out) for (n, p, _), out in zip(shapes, outputs)]


def accepted(runs) -> int:
    """Steps in which some worker accepted several tokens, over every group of ``runs``."""
    return sum(multi(s) for _, _, out in runs for s in accept_steps(out))


def check_raw_runs(runs, oracle, n: int, what: str) -> None:
    multis, errors = [], []
    for _, prompt, out in (r for r in runs if r[0] == n):
        tokens = [list(c.token_ids) for c in out.outputs]
        assert len(tokens) == n and all(len(t) == BUDGET for t in tokens)
        steps = accept_steps(out)
        expected = oracle.logprobs(prompt, tokens, accept_steps=steps)
        errors.append(max_err([sampled_logprobs(c) for c in out.outputs], expected))
        multis.append([multi(s) for s in steps])
    print(f"\n{what} n={n}: steps accepting several tokens, per group and worker {multis}, "
          f"max |logprob - oracle| {max(errors):.2e}")
    assert max(errors) <= 1e-4, f"max |logprob - oracle| = {max(errors):.2e}"


@pytest.fixture(scope="module")
def draft_runs(draft_llm):
    return raw_runs(draft_llm, seed=5000)


@pytest.mark.parametrize("n", CASES)
def test_draft_model_contiguous_matches_the_oracle(draft_runs, oracle, n: int) -> None:
    """The draft model drafts from its own lane (plain attention); verification reads the views."""
    check_raw_runs(draft_runs, oracle, n, "draft model")


def test_draft_model_runs_accepted_drafts(draft_runs) -> None:
    assert accepted(draft_runs) >= len(draft_runs), "too few steps accepted several tokens at temperature 0.7"


def test_draft_model_drafts_and_verifies(draft_llm) -> None:
    metrics = {m.name: m for m in draft_llm.get_metrics()}
    assert metrics["vllm:spec_decode_num_draft_tokens"].value > 0


# -- fork/join requests (isolated branches) ---------------------------------------------------------------

FJ_CASES = [("multiverse", 2, 64), ("multiverse", 3, 64)]  # (protocol, parts of the prompt's goal, max_tokens)


@pytest.fixture(scope="module")
def forkjoin_oracle(peaky_model):
    from transformers import AutoModelForCausalLM

    return DenseForkJoin(AutoModelForCausalLM.from_pretrained(peaky_model, dtype=torch.float32))


def forkjoin_runs(llm, seed: int, branches: str = "isolated") -> list:
    """(prompt ids, completion) per fork/join request: each prompt ends in a goal (the fork starts at once); a
    branch ends at a letter of ``[jqyz]`` or at its budget. In ONE generate call."""
    from vllm import SamplingParams

    from tests.integration.test_forkjoin import GOALS

    prompts = [GOALS[protocol, parts] for protocol, parts, _ in FJ_CASES]
    params = [SamplingParams(temperature=TEMPERATURE, seed=seed + i, max_tokens=max_tokens, logprobs=0,
                             skip_special_tokens=False,
                             extra_args={"hogwild_protocol": protocol, "hogwild_branch_end": "[jqyz]",
                                         "hogwild_max_branches": parts, "hogwild_branches": branches})
              for i, (protocol, parts, max_tokens) in enumerate(FJ_CASES)]
    outputs = llm.generate(prompts, params, use_tqdm=False)
    tokenizer = llm.get_tokenizer()
    return [(tokenizer.encode(p), o.outputs[0]) for p, o in zip(prompts, outputs)]


def check_forkjoin_runs(runs, oracle, what: str) -> None:
    """Every token of the trunk and of each branch against the dense fork/join oracle (isolated branches read the
    prompt and themselves, whatever steps their tokens were accepted in); the control shows the branches each
    other's tokens and must miss. Each token carries its accept step; some lane accepted several in a step."""
    from tests.integration.test_forkjoin import errors, split

    errs, controls, multis = [], [], []
    for prompt, c in runs:
        assert c.hogwild["forked"], c.hogwild
        steps = c.hogwild["accept_steps"]
        assert len(steps) == len(c.token_ids)
        (trunk, trunk_lp), branches, f = split(c)
        at, lanes = f, []
        for tokens, _ in branches:  # each lane's steps, cut as split cuts the tokens
            lanes.append(steps[at:at + len(tokens)])
            at += len(tokens)
        lanes.insert(0, steps[:f] + steps[at:])
        assert all(s == sorted(s) for s in lanes), lanes
        multis.append([multi(s) for s in lanes])
        got = [trunk_lp, *[lp for _, lp in branches]]
        want = oracle.logprobs(prompt, trunk, [b for b, _ in branches], f)
        errs.append(errors(got, [want[0], *want[1]]))
        control = oracle.logprobs(prompt, trunk, [b for b, _ in branches], f, siblings_visible=True)
        controls.append(errors(got, [control[0], *control[1]]))
    print(f"\n{what} fork/join: steps accepting several tokens, per request and lane {multis}; "
          f"max |logprob - oracle| {max(errs):.2e}; control (siblings visible) {min(controls):.2e}")
    assert max(errs) <= 1e-4, errs
    assert min(controls) > 1e-2, controls
    assert sum(map(sum, multis)) >= 2, "too few steps accepted several tokens in fork/join lanes"


def test_draft_model_fork_join_matches_the_oracle(draft_llm, forkjoin_oracle) -> None:
    """Fork/join requests with isolated branches under the draft model's speculation: the trunk and every branch
    draft and verify over their own views; a branch's accepted run stops at its end (or one short of its
    budget), where the engine forces its end of sequence, as without speculation."""
    check_forkjoin_runs(forkjoin_runs(draft_llm, seed=700), forkjoin_oracle, "draft model")


def test_draft_model_fork_join_with_hogwild_branches_matches_the_oracle(draft_llm, forkjoin_oracle) -> None:
    check_hogwild_branches(draft_llm, forkjoin_oracle, 910, "draft model")


def test_draft_model_over_an_fp8_cache_matches_the_oracle_fed_the_cached_values(tiny_model, tmp_path) -> None:
    """Speculative decoding over an FP8 KV cache (the target's and the draft model's): every verified token
    against the oracle that stores K/V as the cache holds them, given the accept steps; the unquantized oracle
    misses. The tiny Llama's embeddings scaled by 3, not 10: drafts are still accepted, and an FP8 cache still
    moves the sampled logprobs (the 10x model's sit near 0 with either cache: its control could not fail).
    (Before the n-gram engine: see the module's docstring.)"""
    from transformers import AutoModelForCausalLM

    from tests.hogwild_oracle import Fp8Store
    from tests.integration.test_fp8_engine import BOUND, KV_CACHE_DTYPE, _fp8_runs_here

    why = _fp8_runs_here()
    if why:
        pytest.skip(why)
    mild = scaled_model(tiny_model, tmp_path / "mild-llama", 3.0)
    llm = make_llm(mild, block_size=BLOCK, kv_cache_dtype=KV_CACHE_DTYPE,
                   additional_config={"hogwild": {"max_workers": 4}},
                   speculative_config={"method": "draft_model", "model": str(mild),
                                       "num_speculative_tokens": NUM_SPEC})
    try:
        prompt = repeated_prompt(9100, 6)
        out = llm.generate([{"prompt_token_ids": prompt}], [raw_params(2, seed=91)], use_tqdm=False)[0]
    finally:
        shutdown(llm)
    model = AutoModelForCausalLM.from_pretrained(mild, dtype=torch.float32)
    tokens, steps = [list(c.token_ids) for c in out.outputs], accept_steps(out)
    got = [sampled_logprobs(c) for c in out.outputs]
    err = max_err(got, DenseHogwild(model, Fp8Store(torch.float8_e4m3fn)).logprobs(prompt, tokens, accept_steps=steps))
    control = max_err(got, DenseHogwild(model).logprobs(prompt, tokens, accept_steps=steps))
    print(f"\nFP8 draft model: steps accepting several tokens {[multi(s) for s in steps]}, "
          f"|logprob - FP8 oracle| {err:.1e}, - unquantized oracle {control:.1e}")
    assert sum(multi(s) for s in steps) >= 1, "no step accepted several tokens"
    assert err <= BOUND, err
    assert control > 10 * BOUND, control


@pytest.fixture(scope="module")
def ngram_llm(peaky_model, draft_llm):
    # After the draft model's engine, and the last engine this process starts: once the n-gram proposer
    # has loaded numba, vLLM 0.32's CPU kernel-override scan fails on llvmlite objects when a further
    # engine starts in the same process (AttributeError in triton_utils/dispatcher.py).
    shutdown(draft_llm)
    engine = spec_engine(peaky_model, {"method": "ngram", "num_speculative_tokens": NUM_SPEC,
                                      "prompt_lookup_min": 1, "prompt_lookup_max": 4})
    yield engine
    shutdown(engine)




# Model Runner V2's n-gram proposer is a Triton kernel (``_ngram_finalize_kernel``) that Triton 3.9's interpreter
# cannot run (``ValueError: mask has unsupported dtype``), so V2's runs here have no n-gram engine; the cases that
# need only some proposer take the draft model's engine there (tests/integration/runner_v2.py).
NGRAM_RUNS_HERE = TEST_RUNNER == "v1"


@pytest.fixture(scope="module")
def proposer_llm(request, peaky_model):
    """An engine with speculative decoding: the n-gram proposer's where it runs, else a draft model's (a new
    engine: the ones the tests before it built and shut down in this process took vLLM's parallel groups with
    them)."""
    if NGRAM_RUNS_HERE:
        yield request.getfixturevalue("ngram_llm")
        return
    shutdown(request.getfixturevalue("draft_llm"))
    engine = spec_engine(peaky_model, {"method": "draft_model", "model": str(peaky_model),
                                       "num_speculative_tokens": NUM_SPEC})
    yield engine
    shutdown(engine)


@pytest.fixture(scope="module")
def proposer_runs(request):
    """The raw runs of :func:`proposer_llm`'s engine."""
    return request.getfixturevalue("ngram_runs")[0] if NGRAM_RUNS_HERE else request.getfixturevalue("draft_runs")


@pytest.fixture(scope="module")
def ngram_runs(ngram_llm):
    """The n-gram runs, and the free blocks before them."""
    free = scheduler_of(ngram_llm).kv_cache_manager.block_pool.get_num_free_blocks()
    return raw_runs(ngram_llm, seed=0), free


@pytest.mark.parametrize("n", CASES)
def test_ngram_contiguous_matches_the_oracle_given_accept_steps(ngram_runs, oracle, n: int) -> None:
    check_raw_runs(ngram_runs[0], oracle, n, "n-gram")


def test_ngram_runs_accepted_drafts(ngram_runs) -> None:
    assert accepted(ngram_runs[0]) >= len(ngram_runs[0]), "too few steps accepted several tokens at temperature 0.7"


def test_ngram_fork_join_matches_the_oracle(ngram_llm, forkjoin_oracle) -> None:
    check_forkjoin_runs(forkjoin_runs(ngram_llm, seed=800), forkjoin_oracle, "n-gram")


def check_hogwild_branches(llm, oracle, seed: int, what: str) -> None:
    """Hogwild branches under speculation: each reads its siblings' tokens as they are accepted, one engine step
    at a time (a draft being verified, or a forced header's tail fed ahead, is read from the next step on). The
    oracle, given every lane's accept steps (its end of sequence's too, from the engine's outputs), scores every
    token; the control that shows a sibling's tokens in the step they are accepted misses, as does the lock-step
    by tokens of an engine without speculation."""
    from tests.integration.test_forkjoin import errors, split

    scheduler = scheduler_of(llm)
    original, count, log = scheduler.update_from_output, [0], {}

    def update(scheduler_output, model_runner_output):  # every lane's tokens, by engine step, as they come out
        outputs = original(scheduler_output, model_runner_output)
        count[0] += 1
        for batch in outputs.values():
            for o in batch.outputs:
                log.setdefault(o.request_id, []).extend([count[0]] * len(o.new_token_ids))
        return outputs

    scheduler.update_from_output = update
    try:
        runs = forkjoin_runs(llm, seed=seed, branches="hogwild")
    finally:
        del scheduler.update_from_output
    errs, controls, lockstep, multis = [], [], [], []
    parents = sorted({rid.partition("_")[2] for rid in log}, key=lambda r: int(r.split("-")[0]))  # in prompt order
    for parent, (prompt, c), (_, parts, _) in zip(parents, runs, FJ_CASES, strict=True):
        assert c.hogwild["forked"] and c.hogwild["branches_mode"] == "hogwild", c.hogwild
        (trunk, trunk_lp), branches, f = split(c)
        lanes = {int(rid.partition("_")[0]): steps for rid, steps in log.items() if rid.partition("_")[2] == parent}
        steps = [lanes[b + 1] for b in range(parts)]  # the fork starts at once: branch b is lane b + 1
        assert [len(s) for s in steps] == [len(b) + 1 for b, _ in branches], "each token's step, and its end's"
        multis.append([multi(s[:-1]) for s in steps])
        got = [trunk_lp, *[lp for _, lp in branches]]
        tokens = [b for b, _ in branches]
        want = oracle.logprobs(prompt, trunk, tokens, f, hogwild=True, steps=steps)
        errs.append(errors(got, [want[0], *want[1]]))
        control = oracle.logprobs(prompt, trunk, tokens, f, hogwild=True, steps=steps, same_step=True)
        controls.append(errors(got, [control[0], *control[1]]))
        by_token = oracle.logprobs(prompt, trunk, tokens, f, hogwild=True)
        lockstep.append(errors(got, [by_token[0], *by_token[1]]))
    print(f"\n{what} fork/join, hogwild branches: steps accepting several tokens, per request and branch {multis}; "
          f"max |logprob - oracle| {max(errs):.2e}; controls: same step {min(controls):.2e}, "
          f"lock-step by tokens {min(lockstep):.2e}")
    assert max(errs) <= 1e-4, errs
    assert min(controls) > 1e-3 and min(lockstep) > 1e-3, (controls, lockstep)
    assert sum(map(sum, multis)) >= 2, "too few steps accepted several tokens in the branches"


def test_ngram_fork_join_with_hogwild_branches_matches_the_oracle_given_accept_steps(ngram_llm,
                                                                                   forkjoin_oracle) -> None:
    check_hogwild_branches(ngram_llm, forkjoin_oracle, 900, "n-gram")


def test_seeded_runs_with_speculation_repeat_with_top_k_and_top_p(ngram_llm) -> None:
    """The rejection draws follow the requests' seeds; top-k (which vLLM 0.32's CPU sampler could not take in a
    step without drafts) and top-p reach the sampler."""
    first, again = (raw_runs(ngram_llm, seed=300, top_k=5, top_p=0.9) for _ in range(2))
    tokens = [[list(c.token_ids) for c in out.outputs] for _, _, out in first]
    assert tokens == [[list(c.token_ids) for c in out.outputs] for _, _, out in again]

    def steps_from_start(runs) -> list:  # engine steps, counted from the run's first
        steps = [accept_steps(out) for _, _, out in runs]
        start = min(s[0] for group in steps for s in group)
        return [[[x - start for x in s] for s in group] for group in steps]

    assert steps_from_start(first) == steps_from_start(again)
    print(f"\nseeded, top_k 5, top_p 0.9: steps accepting several tokens {accepted(first)}, the same twice")
    assert accepted(first) >= len(first)


def test_reading_same_step_tokens_fails_the_oracle(proposer_runs, oracle) -> None:
    """The control: co-workers that also read tokens accepted in the same step (drafts under
    verification) do not match; one token per step (ignoring the accept steps) does not either."""
    runs = proposer_runs
    same_errors, one_errors = [], []
    for _, prompt, out in runs:
        steps = accept_steps(out)
        if not any(multi(s) for s in steps):
            continue
        tokens, got = [list(c.token_ids) for c in out.outputs], [sampled_logprobs(c) for c in out.outputs]
        same_errors.append(max_err(got, oracle.logprobs(prompt, tokens, accept_steps=steps, visibility="same_step")))
        one_errors.append(max_err(got, oracle.logprobs(prompt, tokens)))
    print(f"\ncontrol errors: same-step visibility {same_errors}, one token per step {one_errors}")
    assert max(same_errors) > 1e-3
    assert max(one_errors) > 1e-3


def test_blocks_come_back_after_rejections(ngram_runs, ngram_llm) -> None:
    runs, free_before = ngram_runs
    scheduler = scheduler_of(ngram_llm)
    assert scheduler.kv_cache_manager.block_pool.get_num_free_blocks() == free_before
    assert not scheduler.parked and not scheduler.table.groups
    ended = list(scheduler.table.stats.ended)[-len(runs):]
    # each lane holds its accepted tokens (its last one never fed), nothing of its rejected drafts
    assert sorted(e.lane_lens for e in ended) == sorted(
        [len(p) + len(c.token_ids) - 1 for c in out.outputs] for _, p, out in runs)


def test_one_worker_equals_a_plain_request_with_speculation(proposer_llm) -> None:
    from vllm import SamplingParams

    prompt = {"prompt_token_ids": repeated_prompt(7)}
    plain = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True, logprobs=0)
    hog = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True, logprobs=0,
                         extra_args={"hogwild": {"layout": "contiguous"}})
    a, b = proposer_llm.generate([prompt, prompt], [plain, hog], use_tqdm=False)
    assert a.outputs[0].token_ids == b.outputs[0].token_ids
    assert max_err([sampled_logprobs(a.outputs[0])], [sampled_logprobs(b.outputs[0])]) <= 1e-4
    assert multi(b.outputs[0].hogwild["accept_steps"]) >= 1


COLLAB_BUDGET = 64
# After a paragraph prefix the peaky model writes runs of spaces, which the proposer drafts and the worker
# accepts several at a time: eight spaces end a paragraph, often inside an accepted run. No text the engine
# forces has two spaces in a row.
COLLAB_STEP_END = " {8}"


@pytest.fixture(scope="module")
def collab_runs(proposer_llm):
    """Groups of 3 with the collab protocol, one generate call."""
    params = []
    for i in range(4):
        p = raw_params(3, seed=90 + i, layout="combined", max_tokens=COLLAB_BUDGET)
        p.ignore_eos, p.logprobs = False, 1
        # No redundancy checks: their long prefix may be queued when the finisher's room comes, and
        # the finisher then starts after it (documented); short prefixes keep the checks simple.
        p.extra_args["hogwild"] = {"protocol": "collab", "step_end": COLLAB_STEP_END, "redundancy_every": 0,
                                   "finisher": 6}
        params.append(p)
    prompts = [{"prompt_token_ids": repeated_prompt(900 + i, period=[12, 3, 1, 6][i], times=3)} for i in range(4)]
    return proposer_llm.generate(prompts, params, use_tqdm=False), proposer_llm.get_tokenizer()


def test_collab_combined_matches_the_oracle_with_prefixes_and_the_finisher(collab_runs, oracle) -> None:
    """Forced tokens (paragraph prefixes, the finisher) follow exactly the token that called for them when
    several are accepted at once: the scheduler keeps an accepted run only up to there."""
    from vllm_hogwild.core.protocol_text import FINISHER_SUFFIX, paragraph_prefix

    runs, tokenizer = collab_runs
    suffix = tokenizer.encode(FINISHER_SUFFIX["math"], add_special_tokens=False)
    multis, num_ends = [], []
    for out in runs:
        tokens = [list(c.token_ids) for c in out.outputs]
        steps = accept_steps(out)
        multis.append([multi(s) for s in steps])
        # The finisher starts once the room after a paragraph prefix being forced is its reserve; the prefix
        # stays when both fit, else gives way (documented): its suffix begins near the reserve.
        at = next((i for i in range(len(tokens[0])) if tokens[0][i:i + len(suffix)] == suffix), None)
        assert at is not None and COLLAB_BUDGET - 30 <= at <= COLLAB_BUDGET - len(suffix)
        assert len(tokens[0]) == COLLAB_BUDGET
        for w in (1, 2):  # everyone else ended when the finisher started (or a step later, if verifying drafts)
            assert tokens[w][-1] == tokenizer.eos_token_id and out.outputs[w].finish_reason == "stop"
            assert steps[w][-1] <= steps[0][at] + 1
        err, wrong, ends = collab_errors(oracle, tokenizer, list(out.prompt_token_ids), tokens,
                                         [sampled_logprobs(c) for c in out.outputs], COLLAB_STEP_END,
                                         finisher_worker=0, finisher_tokens=range(at, COLLAB_BUDGET),
                                         accept_steps=steps)
        num_ends.append(sum(map(len, ends)))
        assert err <= 1e-4, f"max |logprob - oracle| = {err:.2e}"
        assert wrong > 1e-3
        for w, t in enumerate(tokens):  # each step's prefix right after the token that ended the last one
            for k, e in enumerate(ends[w], start=2):
                if w == 0 and e + 1 >= at:
                    break
                prefix = tokenizer.encode(paragraph_prefix(w, k, 3), add_special_tokens=False)
                forced = t[e + 1:e + 1 + len(prefix)]
                if tokenizer.eos_token_id in forced:  # the group's end cut the prefix short
                    forced = forced[:forced.index(tokenizer.eos_token_id)]
                assert forced == prefix[:len(forced)] and (len(forced) == len(prefix) or e + 1 + len(forced) >= len(t) - 1), (w, k, e)
    print(f"\ncollab: steps accepting several tokens, per group and worker {multis}; step ends {num_ends}")
    assert sum(num_ends) >= len(runs)  # steps did end (and prefixes were forced)
    assert sum(map(sum, multis)) >= 1
