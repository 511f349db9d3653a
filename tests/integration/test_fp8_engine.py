"""A Hogwild engine with an FP8 KV cache (``kv_cache_dtype="fp8"``, CPU, tiny random Llama).

vLLM 0.32 runs an FP8 cache on the CPU only with AVX-512 or AMX (its ``_get_attn_isa``); elsewhere these
engine tests skip and say so (the readers' kernel checks, tests/unit/test_fp8_cache.py, run everywhere).

- Groups against the dense float64 oracle fed the values an FP8 cache holds (``Fp8Store``: vLLM's CPU
  writer truncates ``x / scale`` to float8; keys are stored rotated), and a control, the oracle with an
  unquantized cache, that must miss: the engine's attention did read the FP8 values.
- A fork/join request (Multiverse, 2 branches, on the tiny Llama with tag tokens) against the fork/join
  oracle fed the same FP8 values, with the same control.
- Plain requests beside groups: token for token and logprob for logprob what a stock engine with the same
  FP8 cache gives them.
"""

from __future__ import annotations

import pytest
import torch

from tests.integration.conftest import make_llm, shutdown
from tests.integration.test_offline import hogwild_params, prompt_ids, sampled_logprobs

pytestmark = [pytest.mark.vllm]

KV_CACHE_DTYPE = "fp8"  # vLLM's name for e4m3 (fp8_e4m3); scales 1 unless a checkpoint has its own
BOUND = 2e-3  # |logprob - oracle|: float32 against float64 on the same cached values, where a value that
#                lands on a truncation boundary may take the neighbouring byte (measured: 2e-6 for 2 workers,
#                6e-4 for 4; the unquantized control misses by 0.3)
CASES = [(2, 45), (4, 40)]  # workers, prompt length


def _fp8_runs_here() -> str | None:
    if not (torch.cpu._is_avx512_supported() or torch.cpu._is_amx_tile_supported()):
        return "vLLM 0.32 runs an FP8 KV cache on the CPU only with AVX-512 or AMX; this CPU has neither"
    return None


@pytest.fixture(scope="module")
def runs(tiny_model):
    why = _fp8_runs_here()
    if why:
        pytest.skip(why)
    plain = [{"prompt_token_ids": prompt_ids(30 + 7 * i, seed=700 + i)} for i in range(2)]
    plain_params = [hogwild_params(1, 24, seed=70 + i) for i in range(2)]
    for p in plain_params:
        p.extra_args = None  # plain requests: no Hogwild options
    groups = [{"prompt_token_ids": prompt_ids(p, seed=800 + i)} for i, (_, p) in enumerate(CASES)]
    group_params = [hogwild_params(n, 32, seed=80 + i) for i, (n, _) in enumerate(CASES)]
    llm = make_llm(tiny_model, kv_cache_dtype=KV_CACHE_DTYPE, additional_config={"hogwild": {"max_workers": 4}})
    try:
        out = llm.generate(groups + plain, group_params + plain_params, use_tqdm=False)
    finally:
        shutdown(llm)
    stock = make_llm(tiny_model, kv_cache_dtype=KV_CACHE_DTYPE)
    try:
        stock_out = stock.generate(plain, plain_params, use_tqdm=False)
    finally:
        shutdown(stock)
    return {"groups": groups, "group_out": out[:len(groups)], "plain_out": out[len(groups):],
            "stock_out": stock_out}


def test_groups_over_an_fp8_cache_match_the_oracle_fed_the_cached_values(runs, tiny_model) -> None:
    from transformers import AutoModelForCausalLM

    from tests.hogwild_checks import max_err
    from tests.hogwild_oracle import DenseHogwild, Fp8Store

    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    fp8 = DenseHogwild(model, Fp8Store(torch.float8_e4m3fn))
    unquantized = DenseHogwild(AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32))
    for prompt, out in zip(runs["groups"], runs["group_out"]):
        tokens = [list(c.token_ids) for c in out.outputs]
        got = [sampled_logprobs(c) for c in out.outputs]
        err = max_err(got, fp8.logprobs(prompt["prompt_token_ids"], tokens))
        control = max_err(got, unquantized.logprobs(prompt["prompt_token_ids"], tokens))
        print(f"\n{len(tokens)} workers: |logprob - FP8 oracle| {err:.1e}, - unquantized oracle {control:.1e}")
        assert err <= BOUND, err
        assert control > 10 * BOUND, control


def test_a_fork_join_request_over_an_fp8_cache_matches_its_oracle_fed_the_cached_values(tmp_path_factory) -> None:
    why = _fp8_runs_here()
    if why:
        pytest.skip(why)
    from transformers import AutoModelForCausalLM

    from tests.forkjoin_oracle import DenseForkJoin
    from tests.hogwild_oracle import Fp8Store
    from tests.integration.test_forkjoin import GOALS, MAX_WORKERS, errors, params, split
    from tests.integration.tiny_model import build_tagged_llama

    model_dir = build_tagged_llama(tmp_path_factory.mktemp("tagged-llama-fp8"))
    llm = make_llm(model_dir, max_model_len=4096, kv_cache_dtype=KV_CACHE_DTYPE,
                   additional_config={"hogwild": {"max_workers": MAX_WORKERS}})
    try:
        prompt = GOALS[("multiverse", 2)]
        out = llm.generate([prompt], [params("multiverse", 48, seed=51, branches="isolated", max_branches=4)],
                           use_tqdm=False)[0]
        prompt_ids = llm.get_tokenizer().encode(prompt)
    finally:
        shutdown(llm)
    completion = out.outputs[0]
    assert completion.hogwild["forked"]
    (trunk, trunk_lp), branches, f = split(completion)
    got = [trunk_lp[:40], *[lp for _, lp in branches]]
    args = (prompt_ids, trunk[:40], [b for b, _ in branches], f)

    def oracle(store):  # each oracle takes its own copy of the weights (it turns them to float64)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        want_trunk, want_branches = DenseForkJoin(model, store).logprobs(*args)
        return [want_trunk, *want_branches]

    err = errors(got, oracle(Fp8Store(torch.float8_e4m3fn)))
    control = errors(got, oracle(None))
    print(f"\nfork/join, 2 branches: |logprob - FP8 oracle| {err:.1e}, - unquantized oracle {control:.1e}")
    assert err <= BOUND, err
    assert control > 10 * BOUND, control


def test_plain_requests_beside_groups_equal_a_stock_engine_with_the_same_fp8_cache(runs) -> None:
    for ours, stock in zip(runs["plain_out"], runs["stock_out"]):
        assert list(ours.outputs[0].token_ids) == list(stock.outputs[0].token_ids)
        assert sampled_logprobs(ours.outputs[0]) == sampled_logprobs(stock.outputs[0])
