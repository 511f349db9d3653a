"""The checking collaborator's vocabulary and policy (vllm_hogwild/models/checks_collaborator.py): a check claim
is one token a letter, and the policy, run in lock-step with errors put in, checks a co-worker's entry that
shares a node and corrects it; the trainer draws its tasks and labels them. No vLLM, no weights."""

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


def test_training_draws_tables_listed_table_repeats_times_and_labels_due_checks_with_their_weight() -> None:
    from vllm_hogwild.training import train_links as T

    vocab, rng = K.ChecksVocab.build(), random.Random(0)
    due = 0
    for _ in range(60):
        task, n = K.draw(rng, 22)
        assert task.repeats == K.TABLE_REPEATS and n in K.GROUP_SIZES
        assert K.task_of_run(K.run_record(task)) == task  # a run file's task, its repeats included
        group, targets = K.labeled_group(vocab, task, n, rng)
        for row in targets:
            for target in row:
                if T._weight(vocab, task, target) == T.CHECK_WEIGHT:
                    due += 1
                    assert all(t in vocab.index_of_check for t in target) and task.mode == "all" and n > 1
    assert due >= 20  # the policy's runs with errors put in hold checks to learn


def test_the_trainer_goes_on_from_the_links_collaborator_and_a_check_is_its_letter_plus_a_role(tmp_path) -> None:
    """A checks folder started from the shipped links folder keeps its layers and every links token's row; a check
    claim's row is its letter's claim row plus one check role's vector (not the claim's own row)."""
    import torch

    from tests.carry_over import trained_from_links

    record, rows_new = trained_from_links(tmp_path / "k", "checks", K.build_tokenizer())
    assert record["command"] == K.COMMAND
    vocab = K.ChecksVocab.build()
    gaps = torch.stack([rows_new[vocab.check[i]] - rows_new[vocab.claim[i]] for i in (0, 5, 19)])
    assert torch.allclose(gaps[0], gaps[1], atol=2e-3) and torch.allclose(gaps[0], gaps[2], atol=2e-3)
    assert gaps[0].norm() > 0.1


def test_the_check_head_is_asked_to_look_at_the_nodes_two_starts_entries_share() -> None:
    """``shared_node_tokens`` names the nodes of a group's entries that two starts pass through, and the check
    head's loss is near 0 where a due check's attention is all on those nodes' tokens, large where it is all on the
    prompt, and 0 in a batch with no check due."""
    import torch

    from vllm_hogwild.training import train_links as T
    from vllm_hogwild.training.presence import check_head_loss, shared_node_tokens

    vocab = K.ChecksVocab.build()
    task = L.make_task(4, 11, "all")
    a, b = task.paths[:2]
    tokens = lambda text: vocab.tokenizer.encode(text, add_special_tokens=False).ids  # noqa: E731
    joined = (a[0], a[1], *b[2:]) if len(a) > 2 else (a[0], *b[1:])  # a's entry runs onto b's nodes
    outputs = [tokens(L.entry(0, joined)), tokens(L.entry(1, b))]
    assert shared_node_tokens(vocab, outputs) == {vocab.node[n] for n in set(joined[1:-1]) & set(b[1:-1])} != set()
    assert shared_node_tokens(vocab, [tokens(L.entry(0, a)), tokens(L.entry(1, b))]) == set()

    stream = T.batches(vocab, 3, lambda: 22, None, K)
    for _ in range(200):
        groups, index, share, weight = next(stream)
        if (weight == T.CHECK_WEIGHT).any():
            break
    else:
        raise AssertionError("no batch with a check due")
    n = weight.shape[1]
    t = max(g.fed(w) for g in groups for w in range(n))
    p = max(len(g.prompt) for g in groups)
    from vllm_hogwild.models.lockstep import _batch

    _, lanes, _, _ = _batch(groups, vocab.pad, "cpu")
    on_shared = torch.zeros(len(groups), n, t, p + n * t)
    for i, g in enumerate(groups):
        keys = torch.isin(lanes[i].reshape(-1), torch.tensor(sorted(shared_node_tokens(vocab, g.outputs)) or [-1]))
        if keys.any():
            on_shared[i, :, :, p + int(keys.nonzero()[0])] = 1.0
    on_prompt = torch.zeros_like(on_shared)
    on_prompt[..., 0] = 1.0
    assert check_head_loss(on_shared, groups, weight, vocab, vocab.pad, T.CHECK_WEIGHT).item() < 1e-4
    assert check_head_loss(on_prompt, groups, weight, vocab, vocab.pad, T.CHECK_WEIGHT).item() > 10
    assert check_head_loss(on_prompt, groups, torch.ones_like(weight), vocab, vocab.pad, T.CHECK_WEIGHT).item() == 0
