"""The merges collaborator's tokenizer, policy and training examples (vllm_hogwild/models/merges_collaborator.py),
and the trainer going on from the links collaborator's folder. No engine: the shipped model's runs are in
tests/server/test_merges_server.py and the main job's (tests/integration/test_examples_offline.py)."""

from __future__ import annotations

import random

import pytest

from vllm_hogwild.models import links_collaborator as LC
from vllm_hogwild.models import merges_collaborator as MC
from vllm_hogwild.tasks import links as L
from vllm_hogwild.tasks import merges as M
from vllm_hogwild.tasks import merges_policy as P


def test_a_reference_and_a_count_are_one_token_and_the_links_tokens_keep_their_text() -> None:
    tok, vocab = MC.build_tokenizer(), MC.MergesVocab.build()
    assert [tok.decode([vocab.reference[n]]) for n in (1, 7, 149)] == [" 1=", " 7=", " 149="]
    assert [tok.decode([vocab.count[k]]) for k in (1, 26)] == ["\nFind: 1", "\nFind: 26"]
    assert set(LC.build_tokenizer().get_vocab()) <= set(tok.get_vocab())  # what a links folder carries over
    task = M.make_tasks(1, 3, "find")[0]
    ids = vocab.prompt(task)
    assert tok.decode(ids[1:]) == task.prompt()
    assert ids[2:2 + len(task.links)] == [vocab.link(a, b) for a, b in task.links]
    assert vocab.count[len(task.answer)] in ids and vocab.found not in ids
    # an entry ending by reference: its nodes and the last node fused with "=": one token fewer than "=" alone
    text = M.entry_for(task, 0, 2)
    assert tok.decode(tok.encode(text, add_special_tokens=False).ids) == text
    roles = LC.role_parts(vocab)
    assert len(roles[0]) == len(set(roles[0])) and vocab.roles[-1] == "reference"
    assert sum(r == vocab.roles.index("reference") for r in roles[2]) == L.MAX_NODE


@pytest.mark.parametrize("mode", M.MODES)
def test_the_policy_answers_by_reference_and_shares_the_work(mode: str) -> None:
    vocab = MC.MergesVocab.build()
    tasks = M.make_tasks(20, 5, mode)
    steps = {}
    for n, layout in ((1, "contiguous"), (4, "contiguous"), (4, "isolated")):
        total = refs = 0
        for i, task in enumerate(tasks):
            outs = MC.simulate(vocab, task, n, random.Random(i), layout)
            score = M.check(task, [MC.text_of(vocab, o) for o in outs])
            assert score.correct, (n, layout, score)
            total += max(len(o) for o in outs)
            refs += len(score.references)
        steps[n, layout] = total
        assert refs >= len(tasks)  # it ends paths by reference, and every one is right
    assert steps[4, "contiguous"] < 0.35 * steps[1, "contiguous"]  # reading and reusing the others' paths pays
    if mode == "all":
        assert steps[4, "isolated"] >= 0.95 * steps[1, "contiguous"]  # the control: nothing read, nothing reused


def test_the_policy_writes_what_the_computed_sampled_policy_writes() -> None:
    """Its tokens, as text, are the lock-step policy of tasks/merges_policy.py (claims drawn among the free
    starts, everyone's lane read the step after): the same steps on average over the same tasks."""
    vocab = MC.MergesVocab.build()
    tasks = M.make_tasks(24, 9, "all")
    model = sum(max(len(o) for o in MC.simulate(vocab, t, 4, random.Random(i))) for i, t in enumerate(tasks))
    computed = sum(P.run(t, 4, "sample", "shared", True, True, random.Random(i)).steps for i, t in enumerate(tasks))
    assert abs(model - computed) <= 0.05 * computed
    one = MC.simulate(vocab, tasks[0], 1, random.Random(0))
    assert len(one[0]) == P.run(tasks[0], 1).steps  # one worker: the same tokens in another order


def test_labels_are_the_policy_at_every_token() -> None:
    vocab = MC.MergesVocab.build()
    for mode in M.MODES:
        task = M.make_task(12, 4, mode)
        group, targets = MC.labeled_group(vocab, task, 3, random.Random(1))
        assert any(t in vocab.node_of_reference for row in targets for t in row if not isinstance(t, tuple))
        for out, row in zip(group.outputs, targets):
            assert len(out) == len(row)
            for token, target in zip(out, row):
                assert token in target if isinstance(target, tuple) else token == target


def test_in_find_mode_the_policy_counts_nothing_and_its_client_cancels_at_the_last_find() -> None:
    """No end of sequence for a count: with every start reaching the goal written, a worker still claims a free
    start; the group is cut where its client cancels it, the step its texts first hold every find."""
    vocab = MC.MergesVocab.build()
    for i, task in enumerate(M.make_tasks(12, 6, "find")):
        outs = MC.simulate(vocab, task, 4, random.Random(i))
        texts = [MC.text_of(vocab, o) for o in outs]
        assert M.check(task, texts).correct
        assert M.written_finds(texts, len(task.paths)) == set(task.answer)
        last = max(map(len, outs))
        before = [MC.text_of(vocab, o[:last - 1]) for o in outs]
        assert len(M.written_finds(before, len(task.paths))) < len(task.answer)
        assert all(vocab.eos not in o for o in outs if len(o) == last)
    task = M.MergesTask(((10, "Z"), (20, "A")), (0, 1), "find")
    reader = MC.MergesReader(task, vocab)
    seen = MC.MergesVisible(reader, 2)
    for token in (vocab.claim[0], vocab.node[10], vocab.node["Z"], vocab.found):
        seen.add(0, token)
    assert seen.found == {0} and MC.policy_target(reader, seen, []) == (vocab.claim[1],)


def test_a_node_written_in_this_step_is_not_read_before_the_next() -> None:
    """Lock-step: a co-worker's node is in the view from the step after it was written, so two workers that
    reach a node in one step both go on past it (both right), and a reference needs the node written before."""
    vocab = MC.MergesVocab.build()
    task = M.MergesTask(((10, 11, 12, "A"), (20, 11, 12, "A")), (0, 1, 2, 3), "all")
    reader = MC.MergesReader(task, vocab)
    seen = MC.MergesVisible(reader, 2)
    a, b = [vocab.claim[0], vocab.node[10]], [vocab.claim[1], vocab.node[20]]
    for token_a, token_b in zip(a, b):
        seen.add(0, token_a)
        seen.add(1, token_b)
    assert MC.policy_target(reader, seen, a) == vocab.node[11] == MC.policy_target(reader, seen, b)
    seen.add(0, vocab.node[11])
    assert MC.policy_target(reader, seen, b) == vocab.reference[11]  # a wrote 11 a step before
    text_a, text_b = M.entry(0, (10, 11, 12, "A")), M.entry(1, (20, 11), M.REFERENCE)
    assert M.check(task, [text_a, text_b]).correct


def test_the_trainer_goes_on_from_the_links_collaborator(tmp_path) -> None:
    """A merges folder started from the shipped links folder keeps every token the links tokenizer has (its
    layers as they were, its rows by their text), and a reference starts as its node's row plus a role."""
    import torch

    from tests.carry_over import trained_from_links

    record, rows_new = trained_from_links(tmp_path / "m", "merges", MC.build_tokenizer())
    assert record["command"] == MC.COMMAND and record["init"]["command"].startswith("python -m")
    vocab = MC.MergesVocab.build()
    gap = rows_new[vocab.reference[7]] - rows_new[vocab.node[7]]
    assert torch.allclose(gap, rows_new[vocab.reference[90]] - rows_new[vocab.node[90]], atol=2e-3)


def test_the_presence_loss_asks_for_the_written_node_or_the_first_token() -> None:
    """The presence head's target (training with --presence): at a due reference, the lanes' tokens of its node; at
    a due node, the prompt's first token. Attention on exactly those costs nothing; anywhere else, a lot."""
    import torch

    from vllm_hogwild.training.train_links import batches, presence_loss

    vocab = MC.MergesVocab.build()
    stream = batches(vocab, seed=3, max_items=lambda: 12, C=MC)
    for groups, index, share, weight in stream:
        if any(t in vocab.node_of_reference for t in index[..., 0].flatten().tolist()) and groups[0].num_workers > 1:
            break
    b, n, width = index.shape[:3]
    t, p = max(g.fed(w) for g in groups for w in range(n)), max(len(g.prompt) for g in groups)
    keys = torch.full((b, p + n * t), vocab.pad)
    for i, g in enumerate(groups):
        keys[i, :len(g.prompt)] = torch.tensor(g.prompt)
        for w in range(n):
            fed = g.outputs[w][:g.fed(w)]
            keys[i, p + w * t:p + w * t + len(fed)] = torch.tensor(fed)
    right = torch.zeros(b, n, t, p + n * t)
    right[..., 0] = 1.0
    for i in range(b):
        for w in range(n):
            for j in range(min(t, width - 1)):
                target = int(index[i, w, j + 1, 0])
                if target in vocab.node_of_reference and share[i, w, j + 1, 0] == 1:
                    match = keys[i] == vocab.node[vocab.node_of_reference[target]]
                    assert match.any()  # the node some lane wrote
                    right[i, w, j] = match / match.sum()
    assert float(presence_loss(right, groups, index, share, weight, vocab, vocab.pad)) < 1e-6
    uniform = torch.full_like(right, 1.0 / right.shape[-1])
    assert float(presence_loss(uniform, groups, index, share, weight, vocab, vocab.pad)) > 3.0


def test_the_demo_board_names_whose_path_a_reference_reuses(capsys) -> None:
    from vllm_hogwild.tools.demo import MergesBoard

    task = M.MergesTask(((10, 11, 12, 13, "A"), (20, 11, 12, 13, "A"), (30, "B")), (0, 1, 2, 3, 4, 5), "all")
    board = MergesBoard(2, task)
    board.update(1, 0, "\na:")
    board.update(1, 1, "\nc:")
    board.update(2, 1, "\nc: 30")  # the same entry: no second claim
    board.update(3, 0, "\na: 10 11")
    board.update(4, 1, "\nc: 30 B;\nb: 20")
    board.update(5, 1, "\nc: 30 B;\nb: 20 11=")
    board.update(6, 0, "\na: 10 11 12 13 A;")
    out = capsys.readouterr().out
    assert "Alice  takes a=10" in out and "Bob    takes c=30" in out and out.count(" takes ") == 3
    assert "Bob    c=30 leads to B (1 links)" in out
    assert "Bob    b=20 runs into 11: the rest as Alice's path for a=10 goes on (skips 3 links)" in out
    assert "Alice  a=10 leads to A (4 links)" in out
    assert M.check(task, board.texts).correct
