"""Offline LLM.generate with Hogwild groups on a real vLLM engine (CPU, float32, tiny random Llama)."""

from __future__ import annotations

import re

import pytest
import torch

from tests.conftest import PROMPT_ID_TOP, TEXT_SCALE
from tests.hogwild_checks import collab_errors, step_ends_for, training_forward_gaps
from tests.hogwild_oracle import DenseHogwild
from tests.integration.conftest import BLOCK_SIZE, make_llm, scheduler_of, shutdown

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

MAX_WORKERS = 4


@pytest.fixture(scope="module")
def llm(tiny_model):
    engine = make_llm(tiny_model, additional_config={"hogwild": {"max_workers": MAX_WORKERS}})
    yield engine
    shutdown(engine)


@pytest.fixture(scope="module")
def oracle(tiny_model):
    from transformers import AutoModelForCausalLM

    return DenseHogwild(AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32))


def prompt_ids(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(100, PROMPT_ID_TOP, (n,), generator=g).tolist()


def hogwild_params(n: int, max_tokens: int, seed: int, layout: str = "contiguous", **kw):
    from vllm import SamplingParams

    return SamplingParams(n=n, temperature=1.0, seed=seed, max_tokens=max_tokens, ignore_eos=True,
                          logprobs=0, extra_args={"hogwild": {"layout": layout, "protocol": "raw"}}, **kw)


def sampled_logprobs(completion) -> list[float]:
    return [step[tok].logprob for step, tok in zip(completion.logprobs, completion.token_ids)]


CASES = [(2, 45), (2, 64), (4, 45), (4, 64)]  # workers, prompt length (mid-block / on a block boundary)


@pytest.fixture(scope="module")
def raw_runs(llm):
    """All oracle cases in ONE generate call: four groups share the engine's steps."""
    prompts = [{"prompt_token_ids": prompt_ids(p, seed=1000 + i)} for i, (_, p) in enumerate(CASES)]
    params = [hogwild_params(n, 64, seed=100 + i) for i, (n, _) in enumerate(CASES)]
    outputs = llm.generate(prompts, params, use_tqdm=False)
    return [(prompt["prompt_token_ids"], out) for prompt, out in zip(prompts, outputs)]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_raw_contiguous_matches_dense_oracle(raw_runs, oracle, case: int) -> None:
    prompt, out = raw_runs[case]
    n, _ = CASES[case]
    assert len(out.outputs) == n
    tokens = [list(c.token_ids) for c in out.outputs]
    assert all(len(t) == 64 for t in tokens)
    assert len({tuple(t) for t in tokens}) == n, "seeded workers should diverge"
    expected = oracle.logprobs(prompt, tokens)
    got = [sampled_logprobs(c) for c in out.outputs]
    err = max(abs(a - b) for g, e in zip(got, expected) for a, b in zip(g, e))
    print(f"\nraw contiguous, {n} workers, prompt {len(prompt)}: max |logprob - oracle| {err:.2e}")
    assert err <= 1e-4, f"max |logprob - oracle| = {err:.2e}"


def test_oracle_tells_views_apart(raw_runs, oracle) -> None:
    """The same outputs scored as N isolated workers do NOT match: the oracle can fail."""
    prompt, out = raw_runs[0]
    tokens = [list(c.token_ids) for c in out.outputs]
    isolated = oracle.logprobs(prompt, tokens, layout="isolated")
    got = [sampled_logprobs(c) for c in out.outputs]
    assert max(abs(a - b) for g, e in zip(got, isolated) for a, b in zip(g, e)) > 1e-2


def test_the_training_forward_computes_what_the_engine_computes(raw_runs, tiny_model) -> None:
    """The links collaborator's training forward (vllm_hogwild/models/lockstep.py: every token's K/V in its writer's
    view at its step, read at the readers' view positions) gives the engine's logprobs; the flat pass over each
    reader's view (co-workers' K/V recomputed in the reader's context) does not."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float64).eval()
    for case in (1, 2):  # 2 and 4 workers
        prompt, out = raw_runs[case]
        got = [sampled_logprobs(c) for c in out.outputs]
        err, miss = training_forward_gaps(model, prompt, [c.token_ids for c in out.outputs], got)
        print(f"\n{len(out.outputs)} workers: training forward {err:.2e} from the engine, flat pass {miss:.2e}")
        assert err <= 1e-4 and miss > 1e-2


def test_group_prefills_prompt_once_and_owns_expected_blocks(raw_runs, llm) -> None:
    """The prompt is computed once; each other member recomputes only past its prefix-cache hit.

    vLLM's prefix cache hits whole blocks and always leaves at least the last
    prompt token to compute, so a sibling's hit is ``bs * floor((P - 1) / bs)``
    tokens: the partial tail block, or the last full block when the prompt
    ends on a block boundary.
    """
    ended = list(scheduler_of(llm).table.stats.ended)[-len(CASES):]
    assert sorted((e.num_workers, e.prompt_len) for e in ended) == sorted(CASES)
    for e in ended:
        hit = BLOCK_SIZE * ((e.prompt_len - 1) // BLOCK_SIZE)
        assert e.num_prefill_tokens == e.prompt_len + (e.num_workers - 1) * (e.prompt_len - hit)
        shared = hit // BLOCK_SIZE
        assert e.num_blocks_owned == shared + sum(-(-n // BLOCK_SIZE) - shared for n in e.lane_lens)
        prompt_blocks = -(-e.prompt_len // BLOCK_SIZE)
        lane_blocks = sum(-(-(n - e.prompt_len) // BLOCK_SIZE) for n in e.lane_lens)
        assert e.num_blocks_owned <= prompt_blocks + lane_blocks + e.num_workers
    assert scheduler_of(llm).table.stats.num_lone_preemptions == 0


def check_one_worker_equals_plain(llm, max_tokens: int) -> None:
    from vllm import SamplingParams

    prompt = {"prompt_token_ids": prompt_ids(50, seed=7)}
    plain = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, logprobs=0)
    hog = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, logprobs=0,
                         extra_args={"hogwild": {"layout": "contiguous"}})
    a, b = llm.generate([prompt, prompt], [plain, hog], use_tqdm=False)
    assert a.outputs[0].token_ids == b.outputs[0].token_ids
    err = max(abs(x - y) for x, y in zip(sampled_logprobs(a.outputs[0]), sampled_logprobs(b.outputs[0])))
    print(f"\none worker against a plain request: the same tokens, max |logprob difference| {err:.2e}")
    assert err <= 1e-4


def test_one_worker_equals_plain_request(llm) -> None:
    check_one_worker_equals_plain(llm, max_tokens=40)


def test_isolated_equals_plain_seeded_requests(llm) -> None:
    from vllm import SamplingParams

    prompt = {"prompt_token_ids": prompt_ids(40, seed=8)}
    group = llm.generate([prompt], hogwild_params(3, 30, seed=11, layout="isolated"), use_tqdm=False)[0]
    plains = llm.generate([prompt] * 3, [SamplingParams(temperature=1.0, seed=11 + i, max_tokens=30,
                                                        ignore_eos=True) for i in range(3)], use_tqdm=False)
    assert [c.token_ids for c in group.outputs] == [p.outputs[0].token_ids for p in plains]


def test_plain_requests_beside_groups_are_unchanged(llm) -> None:
    from vllm import SamplingParams

    plain = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True, logprobs=0)
    plain_prompts = [{"prompt_token_ids": prompt_ids(30 + 7 * i, seed=20 + i)} for i in range(3)]
    alone = llm.generate(plain_prompts, plain, use_tqdm=False)
    group_prompts = [{"prompt_token_ids": prompt_ids(60, seed=30 + i)} for i in range(2)]
    mixed = llm.generate(
        [*plain_prompts, *group_prompts],
        [plain] * 3 + [hogwild_params(2, 40, seed=5), hogwild_params(3, 24, seed=6)],
        use_tqdm=False,
    )
    for a, m in zip(alone, mixed[:3]):
        assert a.outputs[0].token_ids == m.outputs[0].token_ids
        assert max(abs(x - y) for x, y in zip(sampled_logprobs(a.outputs[0]), sampled_logprobs(m.outputs[0]))) <= 1e-4
    assert [len(o.outputs) for o in mixed[3:]] == [2, 3]


@pytest.mark.parametrize(
    "n, hogwild, max_tokens, field",
    [
        (MAX_WORKERS + 1, {"layout": "contiguous"}, 8, "n"),
        (2, {"layout": "diagonal"}, 8, "hogwild.layout"),
        (2, {"protocol": "chatty"}, 8, "hogwild.protocol"),
        (2, {"speed": "fast"}, 8, "hogwild.speed"),
        (2, {}, 1500, "max_tokens"),
    ],
)
def test_bad_requests_name_the_field_and_the_engine_goes_on(llm, n, hogwild, max_tokens, field) -> None:
    from vllm import SamplingParams

    bad = SamplingParams(n=n, temperature=1.0, seed=1, max_tokens=max_tokens, extra_args={"hogwild": hogwild})
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        llm.generate([{"prompt_token_ids": prompt_ids(20, seed=1)}], bad, use_tqdm=False)
    ok = llm.generate([{"prompt_token_ids": prompt_ids(20, seed=2)}], hogwild_params(2, 4, seed=3), use_tqdm=False)
    assert [len(c.token_ids) for c in ok[0].outputs] == [4, 4]


# -- layouts with a shared history of finished steps ---------------------------

PARAGRAPH_END = "e"
STEP_CASES = [("combined", 2, 45), ("combined", 3, 64), ("interleaved", 3, 45)]


@pytest.fixture(scope="module")
def step_runs(llm):
    """The step-layout cases in one generate call."""
    prompts = [{"prompt_token_ids": prompt_ids(p, seed=500 + i)} for i, (_, _, p) in enumerate(STEP_CASES)]
    params = []
    for i, (layout, n, _) in enumerate(STEP_CASES):
        sp = hogwild_params(n, 40, seed=50 + i, layout=layout)
        sp.extra_args["hogwild"]["step_end"] = PARAGRAPH_END
        params.append(sp)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    assert scheduler_of(llm).table.stats.num_lone_preemptions == 0
    return [(p["prompt_token_ids"], out) for p, out in zip(prompts, outputs)], llm.get_tokenizer()


@pytest.mark.parametrize("case", range(len(STEP_CASES)))
def test_step_layouts_match_the_dense_oracle(step_runs, oracle, case: int) -> None:
    """combined / interleaved: steps end where PARAGRAPH_END matches the text (a frequent pattern on
    the tiny random model, so the shared history changes nearly every step); the oracle gets
    the step ends found here from the output tokens, independently of the plugin's tracker."""
    results, tokenizer = step_runs
    layout, n, _ = STEP_CASES[case]
    prompt, out = results[case]
    tokens = [list(c.token_ids) for c in out.outputs]
    ends = [step_ends_for(tokenizer, t, PARAGRAPH_END) for t in tokens]
    assert all(len(e) >= 5 for e in ends), "the pattern should cut many steps"
    expected = oracle.logprobs(prompt, tokens, layout=layout, step_ends=ends)
    got = [sampled_logprobs(c) for c in out.outputs]
    err = max(abs(a - b) for g, e in zip(got, expected) for a, b in zip(g, e))
    print(f"\n{layout}, {n} workers: max |logprob - oracle| {err:.2e}")
    assert err <= 1e-4, f"max |logprob - oracle| = {err:.2e}"
    # The oracle can tell: the same tokens scored with another layout disagree.
    other = "contiguous" if layout == "combined" else "combined"
    wrong = oracle.logprobs(prompt, tokens, layout=other, step_ends=ends)
    assert max(abs(a - b) for g, e in zip(got, wrong) for a, b in zip(g, e)) > 1e-3


NAMED_STEP_END = "[duvxyzjq]"  # frequent in random text, absent from the forced text (prefixes, checks)


def test_named_protocol_places_step_prefixes_and_matches_the_oracle(llm, oracle) -> None:
    """The engine starts every step with "**Alice [k]:** " (forced tokens, one per step); they are
    ordinary lane tokens: in the text, and scored by the oracle like any other."""
    n, prompt = 3, prompt_ids(40, seed=900)
    params = hogwild_params(n, 64 * TEXT_SCALE, seed=90, layout="combined")
    params.extra_args["hogwild"].update(protocol="named", step_end=NAMED_STEP_END, redundancy_every=40)
    (out,) = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)
    tokenizer = llm.get_tokenizer()
    tokens = [list(c.token_ids) for c in out.outputs]
    for w, (name, c) in enumerate(zip(("Alice", "Bob", "Carol"), out.outputs)):
        assert c.text.startswith(f"**{name} [1]:** ")
        num_ends = len(step_ends_for(tokenizer, tokens[w], NAMED_STEP_END))
        assert num_ends >= 3
        # Every step end is followed by the next prefix (the budget may cut the last one short).
        for k in range(2, num_ends + 1):
            assert f"**{name} [{k}]:** " in c.text, (k, c.text)
        assert f"**{name} [{num_ends + 2}]" not in c.text
    # Every 40 tokens of the group, a worker's next paragraph prefix asks whether it repeats work.
    assert any("(Am I repeating someone's work?" in c.text for c in out.outputs)
    assert not any(c.text.startswith(f"**{name} [1]:** (Am I") for name, c in zip(("Alice", "Bob", "Carol"), out.outputs))
    ends = [step_ends_for(tokenizer, t, NAMED_STEP_END) for t in tokens]
    expected = oracle.logprobs(prompt, tokens, layout="combined", step_ends=ends)
    got = [sampled_logprobs(c) for c in out.outputs]
    err = max(abs(a - b) for g, e in zip(got, expected) for a, b in zip(g, e))
    assert err <= 1e-4, f"max |logprob - oracle| = {err:.2e}"


def test_a_group_stops_one_token_after_any_worker_writes_the_answer(llm, oracle) -> None:
    from vllm_hogwild.core.protocol_text import group_answer

    n, prompt, pattern = 3, prompt_ids(30, seed=901), "(k)"  # frequent in the tiny model's random text
    params = hogwild_params(n, 64, seed=91, layout="contiguous")
    params.ignore_eos = False
    params.extra_args["hogwild"]["answer_pattern"] = pattern
    (out,) = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)
    tokenizer = llm.get_tokenizer()
    tokens = [list(c.token_ids) for c in out.outputs]
    texts_until = [[tokenizer.decode(t[: j + 1]) for j in range(len(t))] for t in tokens]
    first = min(j for w in range(n) for j, text in enumerate(texts_until[w]) if re.search(pattern, text))
    # Every worker sampled its end of sequence in the step after the first match.
    assert [len(t) for t in tokens] == [first + 2] * n
    assert all(t[-1] == tokenizer.eos_token_id and c.finish_reason == "stop" for t, c in zip(tokens, out.outputs))
    worker, answer = group_answer([c.text for c in out.outputs], pattern)
    assert answer == "k" and re.search(pattern, texts_until[worker][first])
    expected = oracle.logprobs(prompt, tokens)
    got = [sampled_logprobs(c) for c in out.outputs]
    assert max(abs(a - b) for g, e in zip(got, expected) for a, b in zip(g, e)) <= 1e-4


# -- the collaboration protocol --------------------------------------------------

COLLAB_BUDGET = 64 * TEXT_SCALE  # tokens per worker
# A seed whose finisher starts with no paragraph prefix being forced (its suffix then starts exactly at its reserve).
COLLAB_SEED = 92 if TEXT_SCALE == 1 else 93
COLLAB_STEP_END = "[jqvyz]"  # frequent in random text, absent from every text the engine forces


@pytest.fixture(scope="module")
def collab_run(llm):
    n, prompt = 3, prompt_ids(40, seed=902)
    params = hogwild_params(n, COLLAB_BUDGET, seed=COLLAB_SEED, layout="combined")
    params.ignore_eos, params.logprobs = False, 1
    params.extra_args["hogwild"] = {"protocol": "collab", "step_end": COLLAB_STEP_END,
                                    "redundancy_every": 40 * TEXT_SCALE, "finisher": 6}
    (out,) = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)
    return prompt, out, llm.get_tokenizer(), scheduler_of(llm).table.stats.ended[-1]


def test_collab_prompt_has_the_preamble_and_the_headers_once(collab_run) -> None:
    from vllm_hogwild.core.protocol_text import HEADER_ORDER, HEADERS, preamble

    prompt, out, tokenizer, _ = collab_run
    enc = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    headers = [t for name in HEADER_ORDER for t in enc(HEADERS[name])]
    assert list(out.prompt_token_ids) == enc(preamble(3, "math") + "\n\n") + prompt + enc("\n\n") + headers
    for c in out.outputs:  # none of it is in any worker's text
        assert "### Past steps" not in c.text and "workers (Alice, Bob, Carol)" not in c.text


def test_collab_matches_the_oracle_with_headers_prefixes_and_the_finisher(collab_run, oracle) -> None:
    """Every token, forced or sampled, is scored by the dense oracle given the documented views:
    the prompt up to its headers, each header where the view puts it, the finisher's lane last."""
    from vllm_hogwild.core.protocol_text import FINISHER_SUFFIX

    prompt, out, tokenizer, end = collab_run
    full = list(out.prompt_token_ids)
    tokens = [list(c.token_ids) for c in out.outputs]
    suffix = tokenizer.encode(FINISHER_SUFFIX["math"], add_special_tokens=False)
    reserve = len(suffix) + 6
    # The finisher ran on worker 0 for the budget's last tokens; everyone else ended then.
    assert end.finisher == 0
    start = COLLAB_BUDGET - reserve
    assert tokens[0][start:start + len(suffix)] == suffix
    for w in (1, 2):
        assert len(tokens[w]) == start + 1 and tokens[w][-1] == tokenizer.eos_token_id
        assert out.outputs[w].finish_reason == "stop"
    # Its greedy tokens are the model's most likely ones (logprob rank 1), until the answer closes.
    greedy = range(start + len(suffix), len(tokens[0]))
    assert len(greedy) >= 1
    assert all(out.outputs[0].logprobs[i][tokens[0][i]].rank == 1 for i in greedy)
    err, wrong, ends = collab_errors(oracle, tokenizer, full, tokens, [sampled_logprobs(c) for c in out.outputs],
                                     COLLAB_STEP_END, finisher_worker=0, finisher_tokens=range(start, COLLAB_BUDGET))
    assert all(len(e) >= 2 for e in ends)
    assert len(end.history) >= sum(len(e) for e in ends)  # every finished step joined (plus the stopped rests)
    print(f"\ncollab, 3 workers, headers, prefixes and the finisher: max |logprob - oracle| {err:.2e}")
    assert err <= 1e-4, f"max |logprob - oracle| = {err:.2e}"
    assert wrong > 1e-3  # without the headers the oracle disagrees: they are really read


def test_every_forced_token_is_in_exactly_one_lane_once(collab_run) -> None:
    """Token accounting: each paragraph prefix is in its writer's text once and nowhere else, the
    finisher's suffix once in the finisher's lane, and the cache holds each lane's tokens once."""
    from vllm_hogwild.core.options import blocks_for_group
    from vllm_hogwild.core.protocol_text import FINISHER_SUFFIX, NAMES

    prompt, out, tokenizer, end = collab_run
    texts = [c.text for c in out.outputs]
    for w, text in enumerate(texts):
        numbers = [int(k) for k in re.findall(rf"\*\*{NAMES[w]} \[(\d+)\]:\*\* ", text)]
        assert numbers == list(range(1, len(numbers) + 1)) and len(numbers) >= 2, text
        for o in range(3):
            if o != w:
                assert f"**{NAMES[o]} [" not in text
    assert [t.count(FINISHER_SUFFIX["math"]) for t in texts] == [1, 0, 0]
    checks = sum(t.count("(Am I repeating someone's work?") for t in texts)
    assert checks >= 1
    # The cache: the prompt's full blocks once, then each lane's own tokens (its last sampled one is never fed).
    p = len(out.prompt_token_ids)
    assert end.lane_lens == [p + len(c.token_ids) - 1 for c in out.outputs]
    assert end.num_blocks_owned <= blocks_for_group(p, COLLAB_BUDGET, 3, BLOCK_SIZE)
    assert end.num_prefill_saved == 2 * (p // BLOCK_SIZE) * BLOCK_SIZE


def test_collab_chat_gets_the_preamble_as_a_system_message(llm) -> None:
    from vllm import SamplingParams

    from vllm_hogwild.core.protocol_text import HEADERS, preamble

    params = SamplingParams(n=2, max_tokens=8 * TEXT_SCALE, seed=3,
                            extra_args={"hogwild": {"protocol": "collab", "person": "first"}})
    before = dict(params.extra_args["hogwild"])
    (out,) = llm.chat([{"role": "user", "content": "What is 2 + 3?"}], params, use_tqdm=False)
    tokenizer = llm.get_tokenizer()
    prompt = tokenizer.decode(out.prompt_token_ids)
    assert f"<|im_start|>system\n{preamble(2, 'math', 'first')}<|im_end|>" in prompt
    assert prompt.count(preamble(2, "math", "first")) == 1
    assert prompt.endswith("<|im_start|>assistant\n" + "".join(HEADERS.values()))
    assert params.extra_args == {"hogwild": before}  # the caller's params are untouched
    assert [c.text.startswith(f"**{name} [1]:** ") for name, c in zip(("Alice", "Bob"), out.outputs)] == [True, True]
