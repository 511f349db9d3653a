"""vLLM's async scheduling with the switch on, in real CPU engines: plain requests keep it, groups sit out the steps
scheduled before their last output is in, and every oracle check holds.

vLLM's CPU platform turns async scheduling off by itself (``platforms/cpu.py``, "not required on CPU"). This
module turns it back on for its own engines, by wrapping ``CpuPlatform.check_and_update_config`` while they are
built (in-process engine cores, see tests/conftest.py): the engine core then runs vLLM's
``step_with_batch_queue`` (two batches in flight) and the model runner its async paths, as on a GPU. That vLLM
runs this way on a CPU is shown by the stock engine here, whose outputs the Hogwild engine's plain requests
must equal. Nothing else is stood in for.
"""

from __future__ import annotations

from contextlib import contextmanager

import pytest
import torch

from tests.conftest import PROMPT_ID_TOP
from tests.hogwild_checks import step_ends_for
from tests.hogwild_oracle import DenseHogwild
from tests.integration.conftest import make_llm, scheduler_of, shutdown

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

PARAGRAPH_END = "e"


@contextmanager
def async_on_cpu():
    """Engines built inside keep ``async_scheduling=True`` on the CPU platform."""
    from vllm.platforms.cpu import CpuPlatform

    original = CpuPlatform.__dict__["check_and_update_config"]

    def keep_async(cls, vllm_config):
        asked = vllm_config.scheduler_config.async_scheduling
        original.__func__(cls, vllm_config)
        vllm_config.scheduler_config.async_scheduling = asked

    CpuPlatform.check_and_update_config = classmethod(keep_async)
    try:
        yield
    finally:
        CpuPlatform.check_and_update_config = original


def engine_core(llm):
    return llm.llm_engine.engine_core.engine_core


@pytest.fixture(scope="module")
def hogwild(tiny_model):
    with async_on_cpu():
        llm = make_llm(tiny_model, async_scheduling=True, additional_config={"hogwild": {"max_workers": 4}})
    scheduled = []  # per engine step: the requests scheduled
    scheduler = scheduler_of(llm)
    schedule = scheduler.schedule

    def counted(*args, **kwargs):
        output = schedule(*args, **kwargs)
        scheduled.append(set(output.num_scheduled_tokens))
        return output

    scheduler.schedule = counted
    yield llm, scheduled
    shutdown(llm)


@pytest.fixture(scope="module")
def stock(tiny_model):
    with async_on_cpu():
        llm = make_llm(tiny_model, async_scheduling=True)
    yield llm
    shutdown(llm)


@pytest.fixture(scope="module")
def oracle(tiny_model):
    from transformers import AutoModelForCausalLM

    return DenseHogwild(AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32))


def prompt_ids(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(100, PROMPT_ID_TOP, (n,), generator=g).tolist()


def group_params(n: int, max_tokens: int, seed: int, layout: str, **options):
    from vllm import SamplingParams

    return SamplingParams(n=n, temperature=1.0, seed=seed, max_tokens=max_tokens, ignore_eos=True, logprobs=0,
                          extra_args={"hogwild": {"layout": layout, "protocol": "raw", **options}})


def plain_params():
    from vllm import SamplingParams

    return [SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True, logprobs=0),
            SamplingParams(temperature=1.0, seed=9, max_tokens=40, ignore_eos=True, logprobs=0)]


def sampled_logprobs(completion) -> list[float]:
    return [step[tok].logprob for step, tok in zip(completion.logprobs, completion.token_ids)]


PLAIN_PROMPTS = [{"prompt_token_ids": prompt_ids(37, seed=70)}, {"prompt_token_ids": prompt_ids(52, seed=71)}]


@pytest.fixture(scope="module")
def mixed(hogwild):
    """Groups (raw contiguous; combined, whose paragraphs join a shared history) and plain requests in one call."""
    llm, scheduled = hogwild
    groups = [({"prompt_token_ids": prompt_ids(45, seed=60)}, group_params(3, 40, 61, "contiguous")),
              ({"prompt_token_ids": prompt_ids(64, seed=62)}, group_params(2, 40, 63, "combined",
                                                                           step_end=PARAGRAPH_END))]
    del scheduled[:]
    outputs = llm.generate([p for p, _ in groups] + PLAIN_PROMPTS, [s for _, s in groups] + plain_params(),
                           use_tqdm=False)
    return [p["prompt_token_ids"] for p, _ in groups], outputs, list(scheduled)


def test_the_engines_run_vllm_async_scheduling(hogwild, stock) -> None:
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    from vllm_hogwild.scheduler.scheduler import HogwildAsyncScheduler

    llm, _ = hogwild
    assert type(engine_core(llm).scheduler) is HogwildAsyncScheduler
    assert type(engine_core(stock).scheduler) is AsyncScheduler
    for engine in (llm, stock):  # two batches in flight: the engine core schedules one while the other runs
        assert engine.llm_engine.vllm_config.scheduler_config.async_scheduling is True
        assert engine_core(engine).batch_queue_size == 2


def test_groups_under_async_scheduling_match_the_dense_oracle(mixed, oracle, hogwild) -> None:
    llm, _ = hogwild
    prompts, outputs, _ = mixed
    tokenizer = llm.get_tokenizer()
    for prompt, out, layout in zip(prompts, outputs, ["contiguous", "combined"]):
        tokens = [list(c.token_ids) for c in out.outputs]
        assert all(len(t) == 40 for t in tokens)
        ends = [step_ends_for(tokenizer, t, PARAGRAPH_END) for t in tokens] if layout == "combined" else None
        expected = oracle.logprobs(prompt, tokens, layout=layout, step_ends=ends)
        got = [sampled_logprobs(c) for c in out.outputs]
        err = max(abs(a - b) for g, e in zip(got, expected) for a, b in zip(g, e))
        print(f"\nasync scheduling, {layout}: max |logprob - oracle| {err:.2e}")
        assert err <= 1e-4, f"{layout}: max |logprob - oracle| = {err:.2e}"
        # The control: the same tokens read as isolated workers miss.
        wrong = oracle.logprobs(prompt, tokens, layout="isolated", step_ends=ends)
        assert max(abs(a - b) for g, e in zip(got, wrong) for a, b in zip(g, e)) > 1e-3, layout


def test_plain_requests_equal_a_stock_async_engine(mixed, stock, hogwild) -> None:
    """The same plain batch on both engines: bit for bit. Beside groups (another batch, so other float
    rounding in the matmuls): the same tokens, logprobs within 1e-4, as without async scheduling."""
    llm, _ = hogwild
    _, outputs, _ = mixed
    alone = stock.generate(PLAIN_PROMPTS, plain_params(), use_tqdm=False)
    ours = llm.generate(PLAIN_PROMPTS, plain_params(), use_tqdm=False)
    for a, o, m in zip(alone, ours, outputs[2:]):
        assert a.outputs[0].token_ids == o.outputs[0].token_ids == m.outputs[0].token_ids
        assert sampled_logprobs(a.outputs[0]) == sampled_logprobs(o.outputs[0])
        assert max(abs(x - y) for x, y in zip(sampled_logprobs(a.outputs[0]), sampled_logprobs(m.outputs[0]))) <= 1e-4


def test_a_worker_sits_out_the_steps_scheduled_before_its_last_output_is_in(mixed, hogwild) -> None:
    """What async scheduling costs a group, in engine steps: each worker decodes in every other step at most,
    while the plain requests beside it decode in every step."""
    llm, _ = hogwild
    _, outputs, scheduled = mixed
    steps_of = {}
    for k, ids in enumerate(scheduled):
        for request_id in ids:
            steps_of.setdefault(request_id, []).append(k)
    workers = [r for r in steps_of if "_" in r]  # a group's workers are "<lane>_<request id>"
    assert len(workers) == 5
    for request_id in workers:
        steps = steps_of[request_id]
        assert all(b - a >= 2 for a, b in zip(steps, steps[1:])), request_id  # never two steps running
    plain = [r for r in steps_of if r not in workers]
    assert len(plain) == 2
    for request_id in plain:  # prefill, then one token per step: async scheduling as on a stock engine
        steps = steps_of[request_id]
        assert steps == list(range(steps[0], steps[0] + len(steps))), request_id
    group_steps = len(steps_of[workers[0]])
    print(f"engine steps: {len(scheduled)}; a worker of 40 tokens ran in {group_steps} of them "
          f"(first {steps_of[workers[0]][0]}, last {steps_of[workers[0]][-1]})")


def test_one_worker_equals_a_plain_request_under_async_scheduling(hogwild) -> None:
    from vllm import SamplingParams

    llm, _ = hogwild
    prompt = {"prompt_token_ids": prompt_ids(50, seed=7)}
    plain = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True, logprobs=0)
    one = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True, logprobs=0,
                         extra_args={"hogwild": {"layout": "contiguous"}})
    a, b = llm.generate([prompt, prompt], [plain, one], use_tqdm=False)
    assert a.outputs[0].token_ids == b.outputs[0].token_ids
    assert max(abs(x - y) for x, y in zip(sampled_logprobs(a.outputs[0]), sampled_logprobs(b.outputs[0]))) <= 1e-4


# -- a fork/join request under async scheduling ------------------------------------------------------------

@pytest.fixture(scope="module")
def tagged(tmp_path_factory):
    """The fork/join tests' model (Multiverse's tags are special tokens of its tokenizer) with async scheduling."""
    from tests.integration.tiny_model import build_tagged_llama

    model = build_tagged_llama(tmp_path_factory.mktemp("tagged-llama"))
    with async_on_cpu():
        llm = make_llm(model, async_scheduling=True, max_model_len=4096,
                       additional_config={"hogwild": {"max_workers": 6}})
    yield model, llm
    shutdown(llm)


def test_a_fork_join_request_under_async_scheduling_matches_the_dense_oracle(tagged) -> None:
    """Its lanes sit out the steps scheduled before their last output is in, like a group's workers: the fork,
    every branch and the join read what they read without async scheduling."""
    from transformers import AutoModelForCausalLM

    from tests.forkjoin_oracle import DenseForkJoin
    from tests.integration.test_forkjoin import GOALS, TRUNK_CHECKED, errors, params, split
    from vllm_hogwild.scheduler.scheduler import HogwildAsyncScheduler

    model, llm = tagged
    assert type(engine_core(llm).scheduler) is HogwildAsyncScheduler
    prompt = GOALS[("multiverse", 2)]
    completion = llm.generate([prompt], [params("multiverse", 48, seed=51, max_branches=4)],
                              use_tqdm=False)[0].outputs[0]
    assert completion.hogwild["forked"] and len(completion.hogwild["branches"]) == 2
    (trunk, trunk_lp), branches, f = split(completion)
    assert f == 0 and len(trunk) > 4
    trunk, trunk_lp = trunk[:TRUNK_CHECKED], trunk_lp[:TRUNK_CHECKED]
    oracle = DenseForkJoin(AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32))
    ids = llm.get_tokenizer().encode(prompt)
    want_trunk, want_branches = oracle.logprobs(ids, trunk, [b for b, _ in branches], f)
    got = [trunk_lp, *[lp for _, lp in branches]]
    err = errors(got, [want_trunk, *want_branches])
    print(f"\nasync scheduling, fork/join: max |logprob - oracle| {err:.2e}")
    assert err <= 1e-4, f"max |logprob - oracle| = {err:.2e}"
    seq_trunk, seq_branches = oracle.logprobs(ids, trunk, [b for b, _ in branches], f, sequential=True)
    assert errors(got, [seq_trunk, *seq_branches]) > 1e-3  # the control: branches one after another miss
