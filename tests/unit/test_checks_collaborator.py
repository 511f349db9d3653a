"""The checking collaborator's vocabulary and policy (vllm_hogwild/models/checks_collaborator.py): a check claim
is one token a letter, and the policy, run in lock-step with errors put in, checks a co-worker's entry that
shares a node and corrects it. No vLLM, no weights (none ship yet)."""

from __future__ import annotations

import random
import statistics

from vllm_hogwild.models import checks_collaborator as K
from vllm_hogwild.tasks import links as L
from vllm_hogwild.tasks import links_review as R


def test_a_check_claim_is_one_token_and_the_links_ids_are_kept() -> None:
    from vllm_hogwild.models import links_collaborator as LC

    vocab, links = K.ChecksVocab.build(), LC.LinksVocab.build()
    assert len(set(vocab.check.values())) == len(L.SLOTS) and not set(vocab.check.values()) & set(vocab.claim.values())
    assert vocab.claim == links.claim and vocab.node == links.node
    assert K.text_of(vocab, [vocab.check[1], vocab.node[12], vocab.node["A"], vocab.path_end]) == "\nb? 12 A;"


def test_without_errors_nothing_is_checked_and_the_run_is_the_links_policys() -> None:
    vocab = K.ChecksVocab.build()
    for task in L.make_tasks(8, 3, "all", 10, 14):
        outs = K.simulate(vocab, task, 4, random.Random(1))
        score = L.check(task, [K.text_of(vocab, o) for o in outs])
        assert score.correct and score.checks == []


def test_with_errors_the_group_checks_what_shares_a_node_and_is_more_often_right() -> None:
    vocab = K.ChecksVocab.build()
    tasks = L.make_tasks(24, 0, "all", 18, 22, 2)
    rng = random.Random(0)
    before, after, kinds = [], [], dict.fromkeys(L.CHECK_KINDS, 0)
    for task in tasks:
        texts = [K.text_of(vocab, o) for o in K.simulate(vocab, task, 4, rng, error_rate=0.003)]
        before.append(sum(R.error_kinds(task, texts).values()) == 0)
        score = L.check(task, texts)
        after.append(score.correct)
        for kind, count in score.checks_by_kind().items():
            kinds[kind] += count
        for check in score.checks:  # a co-worker's entry is checked (two may have written it, in the same step)
            assert {e.worker for e in score.entries if e.start == check.start} - {check.worker}
    assert kinds["corrected"] >= 3 and statistics.mean(after) >= statistics.mean(before) + 0.15, (before, after)
    find = L.make_task(12, 2, "find")  # find mode checks nothing
    texts = [K.text_of(vocab, o) for o in K.simulate(vocab, find, 4, random.Random(2), error_rate=0.05)]
    assert L.check(find, texts).checks == []
