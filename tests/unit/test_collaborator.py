"""The collaborator's tokenizer, policy and lock-step simulation (no torch, no vLLM)."""

from __future__ import annotations

import random
import statistics

import pytest

from vllm_hogwild.tasks import roman
from vllm_hogwild.core.views.spans import contiguous_views
from vllm_hogwild.models import roman_collaborator as C


@pytest.fixture(scope="module")
def tok():
    return C.build_tokenizer()


@pytest.fixture(scope="module")
def vocab(tok):
    return C.Vocab.build(tok)


def test_tokenizer_round_trips_and_spells_entries(tok, vocab) -> None:
    task = roman.make_task(24, 0)
    text = roman.prompt(task) + "".join(roman.entry(n) for n in task.items)
    ids = tok.encode(text).ids
    assert ids[0] == vocab.bos and tok.decode(ids, skip_special_tokens=True) == text
    assert tok.encode(roman.prompt(task)).ids == vocab.prompt(task)
    for n in range(1, roman.MAX_NUMBER + 1):  # a number is one token, a numeral one token per letter
        assert vocab.entry[n][:2] == (vocab.newline, vocab.claim[n]) and vocab.claim[n] != vocab.item[n]
        assert len(vocab.entry[n]) == 4 + len(roman.to_roman(n))
    assert tok.decode(tok.encode("any other text, é").ids, skip_special_tokens=True) == "any other text, é"


def test_policy_targets(vocab) -> None:
    task = roman.Task((12, 7))
    e12, e7 = list(vocab.entry[12]), list(vocab.entry[7])
    targets = C.policy_targets(vocab, task, e12)
    assert targets[0] == vocab.newline  # after "Answers:": an entry
    assert set(targets[1]) == {vocab.claim[12], vocab.claim[7]}  # its claim: any unclaimed number
    assert targets[2:len(e12)] == e12[2:]  # the entry's next tokens
    assert targets[len(e12)] == vocab.newline
    # A co-worker's unfinished entry, then the reader's own text: the last claim names the entry
    # being written, and every number seen is claimed.
    mixed = e12[:4] + e7
    after = C.policy_targets(vocab, task, mixed)
    assert after[4] == e12[4] and after[5] == (vocab.claim[7],) and after[6] == e7[2]
    assert after[-1] == vocab.newline
    assert C.policy_targets(vocab, task, mixed + [vocab.newline])[-1] == (vocab.eos,)  # all claimed: the end


def test_simulated_views_are_the_engines(vocab) -> None:
    """Raw mode, contiguous: token k of every worker comes from [prompt][others' 0..k-1][own 0..k-1]."""
    task = roman.make_task(10, 2)
    run = C.simulate(vocab, task, 3, "contiguous", random.Random(0))
    p = len(run.prompt)
    assert len(run.views) == run.num_steps
    for step, views in enumerate(run.views):
        for w, tokens in views:
            want = list(run.prompt)
            for o in [*[o for o in range(3) if o != w], w]:
                fed = run.outputs[o][:step]
                want += [t for t in fed if t != vocab.eos]
            assert tokens == want, (step, w)
    lens = [p + len(o) - 1 for o in run.outputs]  # every lane's fed tokens at the end
    assert all(v.num_tokens == sum(lens) - 2 * p for v in contiguous_views(p, lens))


def test_policy_shares_the_work_only_when_workers_read_each_other(vocab) -> None:
    rng = random.Random(0)
    tasks = roman.make_tasks(16, 0)

    def mean_steps(n: int, layout: str) -> float:
        return statistics.mean(C.simulate(vocab, t, n, layout, rng, keep_views=False).num_steps for t in tasks)

    one = mean_steps(1, "contiguous")
    assert mean_steps(2, "contiguous") < 0.6 * one and mean_steps(4, "contiguous") < 0.35 * one
    assert mean_steps(4, "isolated") >= 0.99 * one
    assert 0.35 * one < mean_steps(4, "interleaved") < 0.6 * one  # claims seen late: less gain
    runs = [C.simulate(vocab, t, 4, "contiguous", rng) for t in tasks]
    assert all(roman.check(r.task, C.texts_of(vocab, r)).correct for r in runs)


def test_bad_layout(vocab) -> None:
    with pytest.raises(ValueError, match="^layout: "):
        C.simulate(vocab, roman.Task((1,)), 2, "combined", random.Random(0))


def test_forkjoin_training_tree_is_the_engines_views(tok, vocab) -> None:
    """Every token of a training request sits where the engine's fork/join views put it, and reads what they
    show: the text before the fork and its own branch (a branch), or everything (after the join)."""
    from vllm_hogwild.core.views.forks import ForkNode, ForkState, fork_view
    from vllm_hogwild.models import collaborator_forkjoin as F

    task = roman.make_task(7, 3)
    request = F.sample_request(task, random.Random(1))
    tree = F.tree(vocab, tok, request)
    prompt_len = len(tok.encode(F.prompt(task)).ids)
    assert tree.ids[:prompt_len] == tok.encode(F.prompt(task)).ids
    parts = sorted({p for p in tree.part if p >= 0})
    p0 = tree.part.index(0)
    lens = [len([p for p in tree.part if p == j]) for j in parts]
    trunk_len = p0 + tree.part.count(-2)
    lane_lens = [trunk_len] + [prompt_len + n for n in lens]
    state = ForkState((ForkNode(0, p0, tuple(range(1, len(parts) + 1)), tuple(lane_lens[1:])),))
    # Where each lane's stored tokens sit in the tree (the trunk: its text before the fork, then after the join).
    where = {0: [i for i, p in enumerate(tree.part) if p in (-1, -2)]}
    where.update({j + 1: [None] * prompt_len + [i for i, p in enumerate(tree.part) if p == j] for j in parts})
    reads = F.mask(tree)
    for lane in range(len(lane_lens)):
        view = fork_view(prompt_len, lane_lens, lane, state)
        seen = {}
        for span, start in zip(view.spans, view.view_starts()):
            for k, pos in enumerate(range(span.start, span.end)):
                seen[where[span.lane][pos] if span.lane else where[0][pos]] = start + k
        own = where[lane][lane_lens[lane] - 1]  # the lane's last token reads exactly its view
        assert {i for i in range(len(tree.ids)) if reads[own, i]} == set(seen)
        assert all(tree.positions[i] == v for i, v in seen.items())
    assert F.check(task, [request.branch(j) for j in parts], request.conclusion()).correct
