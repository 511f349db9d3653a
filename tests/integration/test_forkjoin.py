"""Fork/join requests (Multiverse, NPR) on a real vLLM engine (CPU, float32, tiny random Llama), offline.

The random model never writes a family's closing tags, so the prompts end in a complete goal (the fork
starts at once) and each branch ends at ``hogwild_branch_end``, a pattern frequent in random text and
absent from every header the engine forces. The model's tokenizer has Multiverse's tags as special tokens,
as Multiverse's own has: the cases keep them in their text (``skip_special_tokens=False``), the nested
request leaves them out (vLLM's default), and the engine must fork all the same. A nested fork and a second
fork after a join need a goal
written mid-stream: there a scripted logits processor writes it for the model (tests/integration/scripted.py,
standing in for a model trained to branch, which cannot run here). Per-token logprobs of every branch and of
the trunk are checked against tests/forkjoin_oracle.py, which imports nothing from the plugin.
"""

from __future__ import annotations

import pytest
import torch

from tests.forkjoin_oracle import DenseForkJoin, Node
from tests.integration.conftest import make_llm, scheduler_of, shutdown
from tests.integration.scripted import KEY, SCRIPTED, START
from tests.integration.tiny_model import build_tagged_llama

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

MAX_WORKERS = 6
BRANCH_END = "[jqyz]"  # frequent in random text; no forced header has one
TRUNK_CHECKED = 40  # trunk tokens after the join compared with the oracle (NPR's budget is 1,024 and more)

GOALS = {
    ("multiverse", 2): "Count them.\n<Parallel>\n<Goal>\n<Outline>\n1: even cases</Outline>\n"
                       "<Outline>\n2: odd cases</Outline>\n</Goal>",
    ("multiverse", 4): "Check each.\n<Parallel>\n<Goal>\n<Outline>\n1: n = 1</Outline>\n<Outline>\n2: n = 2</Outline>\n"
                       "<Outline>\n3: n = 3</Outline>\n<Outline>\n4: n = 4</Outline>\n</Goal>",
    ("multiverse", 3): "Split it.\n<Parallel>\n<Goal>\n<Outline>\n1: left</Outline>\n<Outline>\n2: middle</Outline>\n"
                       "<Outline>\n3: right</Outline>\n</Goal>",
    ("npr", 2): "Solve.\n<guideline>\n<plan> 1: factor it</plan>\n<plan> 2: try small n</plan>\n</guideline>",
}


@pytest.fixture(scope="module")
def tagged_model(tmp_path_factory):
    return build_tagged_llama(tmp_path_factory.mktemp("tagged-llama"))


@pytest.fixture(scope="module")
def llm(tagged_model):
    engine = make_llm(tagged_model, max_model_len=4096, additional_config={"hogwild": {"max_workers": MAX_WORKERS}},
                      logits_processors=[SCRIPTED])
    yield engine
    shutdown(engine)


@pytest.fixture(scope="module")
def oracle(tagged_model):
    from transformers import AutoModelForCausalLM

    return DenseForkJoin(AutoModelForCausalLM.from_pretrained(tagged_model, dtype=torch.float32))


def params(protocol: str, max_tokens: int, seed: int, **options):
    from vllm import SamplingParams

    extra = {"hogwild_protocol": protocol, "hogwild_branch_end": BRANCH_END,
             **{f"hogwild_{k}": v for k, v in options.items()}}
    return SamplingParams(n=1, temperature=1.0, seed=seed, max_tokens=max_tokens, logprobs=0, extra_args=extra,
                          skip_special_tokens=False)


def split(completion):
    """The trunk's and each branch's (tokens, logprobs) from the flat completion and its tree."""
    tree = completion.hogwild
    ids = list(completion.token_ids)
    lps = [step[t].logprob for step, t in zip(completion.logprobs, ids)]
    f = tree["fork_tokens"]
    at, branches = f, []
    for row in tree["branches"]:
        n = row["num_tokens"]
        branches.append((ids[at:at + n], lps[at:at + n]))
        at += n
    trunk = (ids[:f] + ids[at:], lps[:f] + lps[at:])
    return trunk, branches, f


def header_lens(tokenizer, protocol: str, k: int) -> list[int]:
    """Each branch header's tokens (the engine feeds a header's tokens after its first in one step)."""
    header = {"multiverse": "\n<Path>\n{}:", "npr": "\n<step>\n{}:"}[protocol]
    return [len(tokenizer.encode(header.format(i), add_special_tokens=False)) for i in range(1, k + 1)]


def errors(got, expected) -> float:
    return max(abs(a - b) for g, e in zip(got, expected) for a, b in zip(g, e))


CASES = [  # (protocol, parts, branch mode, max_tokens)
    ("multiverse", 2, "isolated", 48),
    ("multiverse", 4, "isolated", 48),
    ("npr", 2, "isolated", 1030),
    ("multiverse", 3, "hogwild", 48),
    ("multiverse", 2, "hogwild", 32),  # with a branch end never written: every branch ends at its budget
]
NEVER = "QQQ"  # the budget case's branch end


SUB_GOAL = " <Parallel>\n<Goal>\n<Outline>\n1.1: left</Outline>\n<Outline>\n1.2: right</Outline>\n</Goal>"
SECOND_GOAL = "Then.\n<Goal>\n<Outline>\n3: check</Outline>\n</Goal>"
NESTED = len(CASES) + 1  # the nested request's index in ``runs`` (after the cases and the plain request)


def nested_params(tokenizer, max_tokens: int, seed: int):
    """A Multiverse request whose branch 1 writes a goal of two parts right after its header (a nested fork) and
    whose trunk writes a goal of one part right after its first join header (a second fork): 5 branch lanes."""
    def enc(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False)

    sp = params("multiverse", max_tokens, seed=seed, max_branches=5)
    sp.skip_special_tokens = True  # vLLM's default: tags that are special tokens are not in the text
    sp.extra_args[KEY] = [[[START, *enc("\n<Path>\n1:")], enc(SUB_GOAL)],
                          [[START, *enc("<Conclusion>\n")], enc(SECOND_GOAL)]]
    return sp


@pytest.fixture(scope="module")
def runs(llm):
    """Every case, a plain request and the nested request, in ONE generate call: they share the engine's steps."""
    from vllm import SamplingParams

    tokenizer = llm.get_tokenizer()
    prompts = [GOALS[(protocol, k)] for protocol, k, _, _ in CASES] + ["A plain request beside them."]
    sps = [params(protocol, n, seed=51 + i, branches=mode, max_branches=4)
           for i, (protocol, _, mode, n) in enumerate(CASES)]
    sps[-1].extra_args["hogwild_branch_end"] = NEVER
    sps.append(SamplingParams(temperature=1.0, seed=7, max_tokens=16))
    prompts.append(GOALS[("multiverse", 2)])
    sps.append(nested_params(tokenizer, 96, seed=60))
    outputs = llm.generate(prompts, sps, use_tqdm=False)
    return [(tokenizer.encode(p), o) for p, o in zip(prompts, outputs)]


def split_tree(ids: list, lps: list, forks: list[dict]) -> tuple[Node, Node]:
    """A flat document (a sequence's part of it) as trees of tokens and of logprobs, by the tree's forks."""
    own_ids, own_lps, fork_ids, fork_lps, at = [], [], [], [], 0
    for fork in forks:
        take = fork["fork_tokens"] - len(own_ids)
        own_ids += ids[at:at + take]
        own_lps += lps[at:at + take]
        at += take
        children = []
        for row in fork["branches"]:
            n = row["num_tokens"]
            children.append(split_tree(ids[at:at + n], lps[at:at + n], row.get("forks", [])))
            at += n
        fork_ids.append((fork["fork_tokens"], [c[0] for c in children]))
        fork_lps.append((fork["fork_tokens"], [c[1] for c in children]))
    return Node(own_ids + ids[at:], fork_ids), Node(own_lps + lps[at:], fork_lps)


def tree_error(got: Node, want: Node) -> float:
    err = max((abs(a - b) for a, b in zip(got.tokens, want.tokens, strict=True)), default=0.0)
    for (j, children), (k, expected) in zip(got.forks, want.forks, strict=True):
        assert j == k
        err = max([err, *(tree_error(c, e) for c, e in zip(children, expected, strict=True))])
    return err


def test_a_nested_fork_and_a_second_fork_match_the_dense_oracle(runs, oracle) -> None:
    prompt, out = runs[NESTED]
    completion = out.outputs[0]
    tree = completion.hogwild
    assert [len(f["branches"]) for f in tree["forks"]] == [2, 1] and tree["forks"][0]["fork_tokens"] == 0
    first, second = tree["forks"]
    assert [b["branch"] for b in first["branches"]] == ["1", "2"] and second["branches"][0]["branch"] == "3"
    nested = first["branches"][0]["forks"]
    assert len(nested) == 1 and [b["branch"] for b in nested[0]["branches"]] == ["1.1", "1.2"]
    assert "forks" not in first["branches"][1]
    assert completion.text.startswith(first["branches"][0]["text"] + first["branches"][1]["text"])
    assert first["branches"][0]["text"].startswith("\n\n1: \n\n\n1.1: left\n\n1.2: right")
    assert "<Goal>" not in completion.text and "<Path>" not in completion.text, "its tags are special tokens"
    assert tree["num_tokens"] == len(completion.token_ids)
    ids = list(completion.token_ids)
    lps = [step[t].logprob for step, t in zip(completion.logprobs, ids)]
    tokens, got = split_tree(ids, lps, tree["forks"])
    err = tree_error(got, oracle.tree_logprobs(prompt, tokens))
    lengths = [len(c.tokens) for _, cs in tokens.forks for c in cs] + [len(c.tokens) for c in tokens.forks[0][1][0].forks[0][1]]
    print(f"nested and second fork: sequence lengths {lengths}, max |logprob - oracle| {err:.2e}")
    assert err <= 1e-4, f"max |logprob - oracle| = {err:.2e}"
    # Controls: a fork's branches forced one after another, or shown the branches before them, miss.
    assert tree_error(got, oracle.tree_logprobs(prompt, tokens, sequential=True)) > 1e-3
    assert tree_error(got, oracle.tree_logprobs(prompt, tokens, siblings_visible=True)) > 1e-3


@pytest.mark.parametrize("case", range(len(CASES)), ids=[f"{p}-{k}-{m}" for p, k, m, _ in CASES])
def test_every_branch_and_the_join_match_the_dense_oracle(llm, runs, oracle, case) -> None:
    protocol, k, mode, _ = CASES[case]
    prompt, out = runs[case]
    assert len(out.outputs) == 1, "one completion, whatever the lanes"
    completion = out.outputs[0]
    tree = completion.hogwild
    assert tree["forked"] and tree["protocol"] == protocol and tree["branches_mode"] == mode
    assert [r["branch"] for r in tree["branches"]] == [str(i) for i in range(1, k + 1)]
    (trunk, trunk_lp), branches, f = split(completion)
    assert f == 0, "the prompt ends in a complete goal: the fork starts at once"
    lengths = [len(b) for b, _ in branches]
    if case == len(CASES) - 1:  # cut by the budget: the last budget token is the end of sequence, the one before fed
        assert lengths == [CASES[case][3] - 1] * k
    else:
        assert len(set(lengths)) > 1, f"branches of different lengths expected, got {lengths}"
    trunk, trunk_lp = trunk[:TRUNK_CHECKED], trunk_lp[:TRUNK_CHECKED]
    hogwild = mode == "hogwild"
    headers = header_lens(llm.get_tokenizer(), protocol, k)
    want_trunk, want_branches = oracle.logprobs(prompt, trunk, [b for b, _ in branches], f, hogwild=hogwild,
                                                headers=headers)
    got = [trunk_lp, *[lp for _, lp in branches]]
    err = errors(got, [want_trunk, *want_branches])
    print(f"{protocol} x{k} {mode}: branch lengths {lengths}, max |logprob - oracle| {err:.2e}")
    assert err <= 1e-4, f"max |logprob - oracle| = {err:.2e}"
    # Controls: the same tokens forced one after another, or isolated branches that see each other, miss.
    seq_trunk, seq_branches = oracle.logprobs(prompt, trunk, [b for b, _ in branches], f, sequential=True)
    assert errors(got, [seq_trunk, *seq_branches]) > 1e-3
    if not hogwild:
        vis_trunk, vis_branches = oracle.logprobs(prompt, trunk, [b for b, _ in branches], f,
                                                  siblings_visible=True)
        assert errors([lp for _, lp in branches], vis_branches) > 1e-3
    else:
        iso_trunk, iso_branches = oracle.logprobs(prompt, trunk, [b for b, _ in branches], f)
        assert errors(got, [iso_trunk, *iso_branches]) > 1e-3
        # and headers forced one token a step (each header token reading its siblings' as the lock-step does)
        step_trunk, step_branches = oracle.logprobs(prompt, trunk, [b for b, _ in branches], f, hogwild=True)
        assert errors(got, [step_trunk, *step_branches]) > 1e-3


def test_the_document_is_the_trunk_the_branches_in_order_and_the_join(llm, runs) -> None:
    headers = {"multiverse": ("\n<Path>\n{}:", "<Conclusion>\n"), "npr": ("\n<step>\n{}:", "<takeaway>\n")}
    for (protocol, k, _, _), (_, out) in zip(CASES, runs):
        completion = out.outputs[0]
        tree = completion.hogwild
        branch_header, join_header = headers[protocol]
        branches = "".join(r["text"] for r in tree["branches"])
        assert completion.text.startswith(branches), "the fork starts at once: the branches come first, in order"
        assert completion.text[len(branches):].startswith(join_header)
        for i, row in enumerate(tree["branches"], start=1):
            assert row["text"].startswith(branch_header.format(i)), row["text"][:40]
        assert tree["num_tokens"] == len(completion.token_ids), "usage counts every branch's tokens"
        # A header's tokens after its first are fed in one step: they share it, in the sequential steps too.
        tokenizer = llm.get_tokenizer()
        heads = header_lens(tokenizer, protocol, k)
        join = len(tokenizer.encode(join_header, add_special_tokens=False))
        assert [r["steps"] for r in tree["branches"]] == [r["num_tokens"] - (h - 1)
                                                          for r, h in zip(tree["branches"], heads)]
        longest = max(r["steps"] for r in tree["branches"])
        assert tree["sequential_steps"] == tree["trunk_tokens"] - (join - 1) + longest < tree["num_tokens"]


def test_a_request_that_does_not_fork_equals_a_plain_request(llm) -> None:
    from vllm import SamplingParams

    prompt = "No goal in this prompt."
    fj = params("multiverse", 24, seed=11)
    plain = SamplingParams(temperature=1.0, seed=11, max_tokens=24, logprobs=0)
    a, b = llm.generate([prompt, prompt], [fj, plain], use_tqdm=False)
    assert len(a.outputs) == 1 and a.outputs[0].hogwild["forked"] is False
    assert list(a.outputs[0].token_ids) == list(b.outputs[0].token_ids)
    assert a.outputs[0].text == b.outputs[0].text
    messages = [{"role": "user", "content": prompt}]  # llm.chat: the same, through the chat template
    c, d = llm.chat([messages, messages], [fj, plain], use_tqdm=False)
    assert len(c.outputs) == 1 and c.outputs[0].text == d.outputs[0].text
    table = scheduler_of(llm).table
    assert not table.groups and table.num_aside == 0, "every lane ended, none held"


def test_a_prompt_goal_that_does_not_fork_says_why_and_one_wider_than_the_lanes_is_refused(llm) -> None:
    """One rule for both families: a prompt goal of more parts than the request's branch lanes is a 400 naming
    hogwild_max_branches; a goal the family's rules do not fork goes on as one sequence, and says why."""
    six = "Solve.\n<guideline>\n" + "".join(f"<plan> {i}: try {i}</plan>\n" for i in range(1, 7)) + "</guideline>"
    with pytest.raises(ValueError, match="hogwild_max_branches"):  # NPR: 5 branch lanes by default
        llm.generate([six], [params("npr", 40, seed=1)], use_tqdm=False)
    with pytest.raises(ValueError, match="hogwild_max_branches"):  # Multiverse: 4 parts, 3 lanes
        llm.generate([GOALS[("multiverse", 4)]], [params("multiverse", 40, seed=1, max_branches=3)], use_tqdm=False)
    mv, npr = llm.generate([GOALS[("multiverse", 2)], GOALS[("npr", 2)]],
                           [params("multiverse", 29, seed=2), params("npr", 1023, seed=3)], use_tqdm=False)
    for out, reason in ((mv, "29 tokens of budget left: multiverse forks with at least 30 left"),
                        (npr, "1023 tokens of budget left: npr forks with at least 1024 left")):
        tree = out.outputs[0].hogwild
        assert tree["forked"] is False
        assert tree["unforked"] == [{"branch": None, "at": 0, "reason": f"the prompt's goal: {reason}"}]
    control = llm.generate([GOALS[("multiverse", 2)]], [params("multiverse", 30, seed=2)], use_tqdm=False)[0]
    assert control.outputs[0].hogwild["forked"] is True and "unforked" not in control.outputs[0].hogwild


def test_bad_fork_options_name_their_field(llm) -> None:
    from vllm import SamplingParams

    goal = GOALS[("multiverse", 4)]
    cases = [
        (SamplingParams(n=2, max_tokens=40, extra_args={"hogwild_protocol": "multiverse"}), "n"),
        (params("multiverse", 40, seed=1, max_branches=9), "max_branches"),
        (params("multiverse", 40, seed=1, max_branches=3), "max_branches"),  # a goal of 4 parts
        (params("multiverse", 40, seed=1, layout="combined"), "hogwild_layout"),
        (params("multiverse", 40, seed=1, branches="both"), "hogwild_branches"),
        (SamplingParams(max_tokens=40, ignore_eos=True, extra_args={"hogwild_protocol": "npr"}), "ignore_eos"),
        (SamplingParams(max_tokens=40, extra_args={"hogwild_branch_end": "x"}), "hogwild_branch_end"),
        (SamplingParams(max_tokens=40, stop=["."], extra_args={"hogwild_protocol": "npr"}), "stop"),
    ]
    for sp, field in cases:
        with pytest.raises(ValueError, match=field):
            llm.generate([goal], [sp], use_tqdm=False)
    ok = llm.generate(["still serving"], [SamplingParams(max_tokens=4)], use_tqdm=False)
    assert len(ok[0].outputs[0].token_ids) == 4


def test_a_streamed_nested_request_sends_its_document_in_order_each_token_once(llm, oracle) -> None:
    """Offline streaming (vLLM's DELTA outputs): the deltas of a request with a nested and a second fork,
    concatenated, are its document in canonical order (the oracle checks the tokens where the tree forces them),
    and the last carries the tree."""
    from vllm.sampling_params import RequestOutputKind

    engine, tokenizer = llm.llm_engine, llm.get_tokenizer()
    params = nested_params(tokenizer, 96, seed=61)
    params.output_kind = RequestOutputKind.DELTA
    prompt = GOALS[("multiverse", 2)]
    engine.add_request("streamed", prompt, params)
    ids, lps, text, trees, deltas = [], [], "", [], 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            assert len(out.outputs) == 1 and out.outputs[0].index == 0
            c = out.outputs[0]
            deltas += 1
            ids += c.token_ids
            lps += [step[t].logprob for step, t in zip(c.logprobs, c.token_ids)]
            text += c.text
            if getattr(c, "hogwild", None) is not None:
                trees.append(c.hogwild)
    assert len(trees) == 1 and deltas > 20, "many deltas; the tree on the last"
    tree = trees[0]
    assert [len(f["branches"]) for f in tree["forks"]] == [2, 1] and tree["num_tokens"] == len(ids)
    assert text.startswith(tree["branches"][0]["text"] + tree["branches"][1]["text"])
    tokens, got = split_tree(ids, lps, tree["forks"])
    assert tree_error(got, oracle.tree_logprobs(tokenizer.encode(prompt), tokens)) <= 1e-4


def test_headers_fed_ahead_enter_the_cache_in_one_step_each(llm) -> None:
    """A fork's branch headers and its join header are each fed in one engine step (their first token forced as
    a sampled one, the rest fed ahead with it), and reach the client in order, each token once with the model's
    log-probability (the oracle cases above check those). The control, feeding them one a step, takes the
    headers' extra tokens in extra steps: (branch header - 1) + (join header - 1) for one fork."""
    scheduler = scheduler_of(llm)
    table, tokenizer = scheduler.table, llm.get_tokenizer()
    original = scheduler.schedule
    log = []

    def schedule(*args, **kwargs):
        output = original(*args, **kwargs)
        log.append(dict(getattr(output, "hogwild_step").fed_ahead))
        return output

    def run() -> tuple[int, object]:
        sp = params("multiverse", 40, seed=5, branch_end=NEVER)  # every branch runs to its budget: fixed lengths
        log.clear()
        out = llm.generate([GOALS[("multiverse", 2)]], [sp], use_tqdm=False)[0]
        return sum(1 for _ in log), out

    scheduler.schedule = schedule
    try:
        steps, out = run()
        forced = [p for step in log for p in step.values()]
        table.feeding_ahead = False  # the control
        control_steps, control = run()
        control_forced = [p for step in log for p in step.values()]
    finally:
        table.feeding_ahead = True
        del scheduler.schedule
    branch = [len(tokenizer.encode(f"\n<Path>\n{i}:", add_special_tokens=False)) for i in (1, 2)]
    join = len(tokenizer.encode("<Conclusion>\n", add_special_tokens=False))
    assert sorted(len(tokens) for _, tokens in forced) == sorted([b - 1 for b in branch] + [join - 1])
    assert not control_forced
    assert control_steps - steps == (max(branch) - 1) + (join - 1), (steps, control_steps)
    for o in (out, control):
        c = o.outputs[0]
        assert c.text.startswith("\n<Path>\n1:") and "<Conclusion>\n" in c.text
        assert [r["num_tokens"] for r in c.hogwild["branches"]] == [39, 39]
        assert len(c.logprobs) == len(c.token_ids)
    print(f"one fork of 2 branches: {steps} engine steps with headers fed ahead, {control_steps} one token a step")
