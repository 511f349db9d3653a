"""The links task (vllm_hogwild/tasks/links.py) and its collaborator's policy (links_collaborator.py): generator,
prompt, checker, the splits' costs, the tokenizer and the lock-step simulation. No vLLM."""

from __future__ import annotations

import random
import statistics

import pytest

from vllm_hogwild.tasks import links as L
from vllm_hogwild.tasks import links_review as R
from vllm_hogwild.models import links_collaborator as C


def test_the_generator_is_seeded_and_its_prompt_reads_back() -> None:
    for mode in L.MODES:
        task = L.make_task(12, 5, mode)
        assert task == L.make_task(12, 5, mode) != L.make_task(12, 6, mode)
        assert L.task_of_prompt(task.prompt()) == task
        assert (task.target is not None) == (mode == "find")
        ends = [p[-1] for p in task.paths]  # the goal ends the answer's path only, and none in all mode
        assert ends.count(L.GOAL) == (mode == "find") and (mode == "all" or ends[task.answer_index] == L.GOAL)
    assert L.make_tasks(3, 1) == L.make_tasks(3, 1)
    big = [L.make_task(L.MAX_ITEMS, s, mode) for s in range(20) for mode in L.MODES]
    assert all(len(t.paths) == L.MAX_ITEMS for t in big)


def test_item_costs_are_heavy_tailed_and_nothing_in_the_prompt_tells_them() -> None:
    costs = [c for i in range(2000) for c in L.make_task(18, i).costs()]
    cv = statistics.pstdev(costs) / statistics.mean(costs)
    assert cv >= 0.6, cv
    assert min(costs) == 1 + L.ITEM_OVERHEAD and max(costs) == L.MAX_HOPS + L.ITEM_OVERHEAD
    # the links are listed in a shuffled order: their order does not follow the paths
    task = L.make_task(10, 3)
    in_path_order = [(a, b) for p in task.paths for a, b in zip(p, p[1:])]
    assert task.links != in_path_order and sorted(map(str, task.links)) == sorted(map(str, in_path_order))


def test_the_checker_scores_exactly() -> None:
    task = L.make_task(6, 9, "all")
    right = [L.entry(i, p) for i, p in enumerate(task.paths)]
    assert L.check(task, ["".join(right[:2]), "".join(right[2:])]).correct
    score = L.check(task, ["".join(right[:2]), "".join(right[1:])])  # a duplicated item: waste, not an error
    assert score.correct and score.duplicated_items == 1
    assert L.check(task, ["".join(right[:-1])]).missing == (task.paths[-1][0],)
    wrong = list(task.paths[0])
    wrong[-1] = next(t for t in L.TERMINALS if t not in {p[-1] for p in task.paths})
    score = L.check(task, ["".join(right[1:]) + L.entry(0, wrong)])
    assert not score.correct and score.wrong == (task.paths[0][0],)
    assert not L.check(task, ["".join(right) + "\nb: 4"]).correct  # an unfinished entry, in all mode
    # a claim's letter names the start: the same path under another start's letter is wrong
    assert L.check(task, ["".join(right[2:]) + L.entry(1, task.paths[0]) + right[1]]).wrong == (task.paths[1][0],)
    # a letter no start has is no entry
    score = L.check(task, ["".join(right) + L.entry(6, task.paths[0])])
    assert not score.correct and score.malformed == len(L.entry(6, task.paths[0])) - 1 and score.wrong == ()


def test_find_mode_is_done_by_the_find_and_lets_readers_stop_mid_path() -> None:
    task = L.make_task(6, 4, "find")
    a = task.answer_index
    answer = task.paths[a]
    o = next(i for i in range(len(task.paths)) if i != a)
    other = task.paths[o]
    stopped = f"\n{L.SLOTS[o]}:" + "".join(f" {x}" for x in other[:2])  # a worker that read the find mid-path
    score = L.check(task, [L.entry(a, answer, found=True), stopped])
    assert score.correct and score.found == answer[0]
    assert not L.check(task, [L.entry(a, answer)]).correct  # not reported as the find
    assert not L.check(task, [L.entry(o, other, found=True)]).correct  # a wrong find


def test_the_splits_costs() -> None:
    tasks = L.make_tasks(300, 0)
    for n in (2, 4, 8):
        rr = sum(L.round_robin_steps(t, n) for t in tasks)
        ideal = sum(L.ideal_steps(t, n) for t in tasks)
        lpt = sum(L.longest_first_steps(t, n) for t in tasks)
        bound = sum(L.makespan_bound(t, n) for t in tasks)
        assert bound <= lpt <= ideal < rr
        assert ideal / rr < (0.95 if n == 2 else 0.9)  # claiming as you go pays on these costs
    task = L.make_task(8, 2, "find")
    costs, a = task.costs(), task.answer_index
    assert L.ideal_steps(task, 1) == sum(costs[:a + 1]) + 1
    assert L.round_robin_steps(task, 1) == sum(costs[:a + 1]) + 1
    assert L.makespan_bound(task, 4) == costs[a] + 1


def test_the_split_with_cancel_stops_in_the_step_the_find_is_written() -> None:
    task = L.make_task(9, 5, "find")
    costs, a = task.costs(), task.answer_index
    for n in (1, 2, 4, 8):
        share = range(a % n, a + 1, n)  # the finder's share up to the find, whole, in order
        assert L.split_cancel_steps(task, n) == sum(costs[i] for i in share) + 1
        assert L.split_cancel_steps(task, n) <= L.round_robin_steps(task, n)
    tasks = L.make_tasks(200, 3, "find")
    assert sum(map(lambda t: L.split_cancel_steps(t, 4), tasks)) < sum(map(lambda t: L.round_robin_steps(t, 4), tasks))
    every = L.make_tasks(20, 3)  # all mode: nothing to cancel
    assert [L.split_cancel_steps(t, 4) for t in every] == [L.round_robin_steps(t, 4) for t in every]


def test_a_table_may_list_each_link_twice_or_three_times_the_paths_unchanged() -> None:
    for mode in L.MODES:
        once = L.make_task(14, 7, mode)
        for repeats in (2, 3):
            task = L.make_task(14, 7, mode, repeats)
            assert task.paths == once.paths and task.target == once.target and task.repeats == repeats
            assert sorted(map(str, task.links)) == sorted(map(str, once.links * repeats))
            assert L.task_of_prompt(task.prompt()) == task
            right = "".join(L.entry(i, p, p[-1] == task.target) for i, p in enumerate(task.paths))
            assert L.check(task, [right]).correct  # the answer is the one-listing task's
    assert [t.paths for t in L.make_tasks(5, 2, repeats=2)] == [t.paths for t in L.make_tasks(5, 2)]
    assert once.repeats == 1 and L.make_task(14, 7) == L.make_task(14, 7, "all", 1)


def test_error_kinds_name_where_an_entry_leaves_its_path() -> None:
    task = L.make_task(4, 11, "all")
    a, b, c, d = task.paths  # b is the long one; node 149 is on no path
    assert len(b) > 10 and 149 not in {n for p in task.paths for n in p}
    right = "".join(L.entry(i, p) for i, p in enumerate(task.paths))
    assert R.error_kinds(task, [right]) == dict.fromkeys(R.ERROR_KINDS, 0)
    texts = [L.entry(0, b),  # a's letter, b's path: the wrong start
             L.entry(1, (b[0], b[1], *d[1:])),  # off its path onto d's nodes
             L.entry(2, (c[0], 149, "A")),  # onto a node on no path
             L.entry(3, d[:-1] + ("J",)) + "junk"]  # onto a's terminal: another path's; and malformed
    assert R.error_kinds(task, texts) == {"wrong start": 1, "joins another path": 2, "wrong next node": 1,
                                          "wrong end": 0, "missing": 0, "malformed": 1}
    assert R.error_kinds(task, texts, L.check(task, texts)) == R.error_kinds(task, texts)  # the caller's score
    assert R.error_kinds(task, [right.replace("J;", "J!")])["wrong end"] == 1  # all mode: nothing is the find
    assert R.error_kinds(task, [right + L.entry(5, (1, "B"))])["malformed"] == 1  # a letter no start has
    assert R.error_kinds(task, [L.entry(1, b)])["missing"] == 3


def _check(index: int, path, found: bool = False) -> str:
    return L.entry(index, path, found).replace(":", L.CHECK, 1)


def test_a_check_replaces_its_starts_entries_and_is_scored_by_what_it_did() -> None:
    task = L.make_task(3, 4, "all")
    a, b, c = task.paths
    rest = L.entry(1, b) + L.entry(2, c)
    wrong_a = (a[0], *b[1:])  # a's start, then b's nodes
    cases = [  # (texts, group right, the check's kind)
        ([L.entry(0, wrong_a) + rest, _check(0, a)], True, "corrected"),
        ([L.entry(0, a) + rest, _check(0, a)], True, "confirmed"),
        ([L.entry(0, a) + rest, _check(0, wrong_a)], False, "unnecessary"),
        ([L.entry(0, wrong_a) + rest, _check(0, wrong_a)], False, "missed"),
        ([L.entry(0, wrong_a) + rest, _check(0, (a[0], *c[1:]))], False, "wrong correction"),
        ([rest, _check(0, a)], True, "without an entry"),
    ]
    for texts, right, kind in cases:
        score = L.check(task, texts)
        assert score.correct == right and [k.kind for k in score.checks] == [kind], (texts, score)
        assert score.checks_by_kind()[kind] == 1 and sum(score.checks_by_kind().values()) == 1
        assert score.missing == () and len(score.entries) == texts[0].count(":")
    # two checks that disagree: one of them is wrong
    assert not L.check(task, [L.entry(0, wrong_a) + rest, _check(0, a), _check(0, wrong_a)]).correct
    # a check of a letter no start has is malformed; parse (entries only) reads a check as malformed
    assert L.check(task, [L.entry(0, a) + rest + _check(5, (1, "B"))]).malformed > 0
    assert L.parse(L.entry(0, a) + _check(1, b))[1] > 0 and L.parse_checked(L.entry(0, a) + _check(1, b))[1] == 0
    assert [r[3] for r in L.parse_checked(_check(1, b) + L.entry(0, a) + _check(2, c))[0]] == [True, False, True]
    # the errors by kind count the entries a check replaced, and a check is no malformed text (a letter no start has is)
    kinds = R.error_kinds(task, [L.entry(0, wrong_a) + rest, _check(0, a)])
    assert kinds["joins another path"] == 1 and kinds["malformed"] == 0
    assert R.error_kinds(task, [L.entry(0, a) + rest + _check(5, (1, "B"))])["malformed"] == 1


def test_checks_barred_is_a_logit_bias_on_each_check_claim() -> None:
    from vllm_hogwild.models import solve

    params = solve.links_params(4, "contiguous", 0, 64, barred=[7, 9])
    assert params.logit_bias == {7: -100.0, 9: -100.0} and solve.links_params(4, "contiguous", 0, 64).logit_bias is None


def test_a_check_in_find_mode_may_report_the_find_and_be_cut_off() -> None:
    task = L.make_task(4, 2, "find")
    k = task.answer_index
    goal = task.paths[k]
    others = "".join(L.entry(i, p) for i, p in enumerate(task.paths) if i != k)
    wrong = (goal[0], *next(p for i, p in enumerate(task.paths) if i != k)[1:])
    score = L.check(task, [others + L.entry(k, wrong), _check(k, goal, True)])
    assert score.correct and score.found == goal[0] and score.checks[0].kind == "corrected"
    cut = L.check(task, [L.entry(k, goal, True), _check(0, task.paths[0])[:-3]])  # an unfinished check
    assert cut.correct and cut.checks == [] and cut.malformed == 0


def test_the_vote_takes_each_starts_most_written_path_and_a_tie_answers_nothing() -> None:
    task = L.make_task(3, 4, "all")
    right = "".join(L.entry(i, p) for i, p in enumerate(task.paths))
    wrong_a = right.replace(L.entry(0, task.paths[0]), L.entry(0, task.paths[1]))
    assert R.vote(task, [right, right, wrong_a]).correct
    tie = R.vote(task, [right, wrong_a])
    assert not tie.correct and tie.ties == 1 and tie.answers[0] is None and tie.wrong == (task.paths[0][0],)
    assert not R.vote(task, [wrong_a, wrong_a, right]).correct
    twice = right + L.entry(0, task.paths[1])  # a worker's first entry for a start is its vote
    assert R.vote(task, [twice, wrong_a, right]).correct
    assert R.vote(task, [""]).answers == (None, None, None)
    with pytest.raises(ValueError, match="^task"):
        R.vote(L.make_task(3, 4, "find"), [right])


@pytest.mark.parametrize("call, field", [
    (lambda: L.make_task(0, 1), "num_items"),
    (lambda: L.make_task(3, 1, "some"), "mode"),
    (lambda: L.make_task(True, 1), "num_items"),
    (lambda: L.make_tasks(2, 1, min_items=5, max_items=4), "max_items"),
    (lambda: L.make_task(3, 1, "all", 4), "repeats"),
    (lambda: L.make_tasks(2, 1, repeats=0), "repeats"),
    (lambda: L.LinksTask(((1, 2, "A"),), (0, 1, 0)), "link_order"),  # a link listed more often than another
    (lambda: L.task_of_prompt(L.make_task(3, 1).prompt().replace("Links:", "Links:\n" + "{}>{}".format(
        *L.make_task(3, 1).links[0]))), "prompt"),  # one link listed twice, the others once
    (lambda: L.LinksTask(((1, 2, "A"),), (0, 1), "find"), "target"),
    (lambda: L.LinksTask(((1, 2, "A"), (3, "Z")), (0, 1, 2), "find", "A"), "target"),  # the goal is Z
    (lambda: L.LinksTask(((1, 2, "A"), (3, "Z")), (0, 1, 2)), "paths"),  # all mode: nobody's goal
    (lambda: L.make_task(L.MAX_ITEMS + 1, 1), "num_items"),
    (lambda: L.LinksTask(((1, "A"), (1, "B")), (0, 1)), "paths"),
    (lambda: L.LinksTask(((1, "A"), (2, "A")), (0, 1)), "paths"),
    (lambda: L.LinksTask(((1, 2, "A"),), (0, 0)), "link_order"),
    (lambda: L.task_of_prompt("Links:\n 1 2\nStarts: 1\nPaths:"), "prompt"),
    (lambda: L.task_of_prompt(17), "prompt"),
    (lambda: L.task_of_prompt(L.make_task(3, 1).prompt().replace(" b=", " c=")), "prompt"),
    (lambda: L.entry(26, (1, "A")), "index"),
    (lambda: L.check(L.make_task(2, 1), "text"), "texts"),
    (lambda: L.check(L.make_task(2, 1), [3]), "texts"),
    (lambda: L.round_robin_steps(L.make_task(2, 1), 0), "num_workers"),
])
def test_malformed_input_names_the_field(call, field: str) -> None:
    with pytest.raises(ValueError, match=f"^{field}"):
        call()


def test_every_node_is_one_token_in_each_role() -> None:
    tok, vocab = C.build_tokenizer(), C.LinksVocab.build()
    task = L.make_task(20, 1, "find")
    ids = vocab.prompt(task)
    assert tok.decode(ids[1:]) == task.prompt()
    assert len(ids) == 1 + 1 + len(task.links) + 1 + 2 * len(task.paths) + 2 + 1  # a link is one token
    assert ids[2:2 + len(task.links)] == [vocab.link(a, b) for a, b in task.links]
    # a start in the list, with its letter, and the terminal to find are tokens of their own
    at = 3 + len(task.links)
    listed = [tok.decode([i]) for i in ids[at:at + 2 * len(task.paths)]]
    assert listed == [x for i, s in enumerate(task.starts) for x in (f" {L.SLOTS[i]}={s}", ",")]
    assert tok.decode([ids[-2]]) == f" {task.target}."
    assert [tok.decode([vocab.claim[i]]) for i in range(len(L.SLOTS))] == [f"\n{x}:" for x in L.SLOTS]
    links, sources, ends = C.link_parts(vocab)
    assert len(set(links)) == len(links) == L.MAX_NODE * (L.MAX_NODE + len(L.TERMINALS))
    assert tok.decode([links[0]]) == "\n1>1" and (sources[0], ends[0]) == (0, 0)
    assert tok.decode([links[-1]]) == f"\n{L.MAX_NODE}>Z" and sources[-1] == L.MAX_NODE - 1
    for i, p in enumerate(task.paths):
        assert len(tok.encode(L.entry(i, p), add_special_tokens=False).ids) == len(p) - 1 + L.ITEM_OVERHEAD


@pytest.mark.parametrize("mode", L.MODES)
def test_the_policy_answers_and_shares_the_work(mode: str) -> None:
    vocab = C.LinksVocab.build()
    steps = {}
    for n, layout in ((1, "contiguous"), (4, "contiguous"), (4, "isolated")):
        total = 0
        for i in range(30):
            task = L.make_task(16, 100 + i, mode)
            outs = C.simulate(vocab, task, n, random.Random(i), layout)
            assert L.check(task, [C.text_of(vocab, o) for o in outs]).correct
            total += max(len(o) for o in outs)
        steps[n, layout] = total
    assert steps[4, "contiguous"] < 0.5 * steps[1, "contiguous"]  # reading each other pays
    assert steps[4, "isolated"] >= 0.9 * steps[1, "contiguous"]  # the control: it does not without reading


def test_labels_are_the_policy_at_every_token() -> None:
    vocab = C.LinksVocab.build()
    task = L.make_task(8, 3, "find")
    group, targets = C.labeled_group(vocab, task, 3, random.Random(0))
    for out, row in zip(group.outputs, targets):
        assert len(out) == len(row)
        for token, target in zip(out, row):
            assert token in target if isinstance(target, tuple) else token == target


def test_the_trainer_writes_a_plain_llama_whose_links_are_sums(tmp_path) -> None:
    """Two short runs of the trainer give the same folder (seeded); the folder is a plain tied Llama the engine
    computes in float32, and a link token's embedding is its source's vector plus its end's."""
    import json

    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from vllm_hogwild.training.train_links import train

    a = train(tmp_path / "a", steps=2, num_layers=1, hidden=32, threads=1, log_every=1)
    b = train(tmp_path / "b", steps=2, num_layers=1, hidden=32, threads=1, log_every=1)
    assert a["loss_curve"] == b["loss_curve"]
    wa, wb = load_file(tmp_path / "a" / "model.safetensors"), load_file(tmp_path / "b" / "model.safetensors")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    assert json.loads((tmp_path / "a" / "config.json").read_text())["dtype"] == "float32"
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "a", dtype=torch.float32)
    table = model.get_input_embeddings().weight
    assert model.get_output_embeddings().weight.data_ptr() == table.data_ptr()  # tied
    vocab = C.LinksVocab.build()
    link = lambda s, e: table[vocab.link(s, e)]  # noqa: E731
    assert torch.allclose(link(3, 7) - link(3, "B"), link(90, 7) - link(90, "B"), atol=2e-3)
    assert not torch.allclose(link(3, 7) - link(3, "B"), link(90, 8) - link(90, "B"), atol=2e-3)
    # a listed start is its letter's vector, its node's and the start role's; a claim its letter's and the claim
    # role's: a listed start less its node's path token is the same for every node, and less the claim of its
    # letter the same for every letter
    claims, _, listed, _ = C.letter_parts(vocab)
    start = lambda letter, n: table[listed[letter * L.MAX_NODE + n - 1]]  # noqa: E731
    assert C.build_tokenizer().decode([listed[2 * L.MAX_NODE + 76]]) == " c=77"
    assert torch.allclose(start(2, 5) - table[vocab.node[5]], start(2, 77) - table[vocab.node[77]], atol=2e-3)
    assert torch.allclose(start(2, 5) - table[claims[2]] - table[vocab.node[5]],
                          start(9, 5) - table[claims[9]] - table[vocab.node[5]], atol=2e-3)
    assert not torch.allclose(start(2, 5) - table[vocab.node[5]], start(9, 5) - table[vocab.node[5]], atol=2e-3)
    # going on from a folder: its training record is kept, and its table is recovered exactly (a step at lr 0
    # writes back the rows it read: links, entities, roles and letters)
    c = train(tmp_path / "c", steps=1, lr=0.0, threads=1, log_every=1, init=tmp_path / "a")
    assert c["init"]["loss_curve"] == a["loss_curve"] and c["hidden"] == 32
    wc = load_file(tmp_path / "c" / "model.safetensors")
    assert torch.allclose(wc["model.embed_tokens.weight"].float(), wa["model.embed_tokens.weight"].float(), atol=2e-3)
    assert all(torch.equal(wc[k], wa[k]) for k in wa if "embed" not in k)


def test_a_sampled_run_is_labeled_by_the_policy_and_what_it_cannot_label_is_not_taught(tmp_path) -> None:
    """The engine's own runs (a duplicate claim, a wrong node, a wrong find) are labeled with the policy's target
    from each token's view; after a node the table has no link from there is none, and such a token weighs 0."""
    import json

    from vllm_hogwild.training import train_links as T

    vocab = C.LinksVocab.build()
    task = L.make_task(4, 5, "find")
    a = task.answer_index
    b = next(i for i in range(4) if i != a)
    tok = C.build_tokenizer()
    ids = lambda text: tok.encode(text, add_special_tokens=False).ids  # noqa: E731
    worker0 = ids(L.entry(b, task.paths[b])) + ids(f"\n{L.SLOTS[b]}:")  # does b, then claims it again
    stray = next(n for n in range(1, L.MAX_NODE + 1) if n not in {x for p in task.paths for x in p})
    worker1 = ids(f"\n{L.SLOTS[a]}: {task.paths[a][0]} {stray} 7")  # a node no link leaves
    group, targets = C.labeled_run(vocab, task, [worker0, worker1])
    assert group.outputs == (tuple(worker0), tuple(worker1))
    assert targets[0][1:len(worker0) - 1] == worker0[1:-1]  # its entry, token by token: the policy's own
    assert worker0[0] in targets[0][0] and targets[0][-1] == tuple(
        vocab.claim[i] for i in range(4) if i not in (a, b))  # the second claim of b: b and a are taken
    assert targets[1][2] == vocab.node[task.paths[a][1]]  # the start's link, though the worker wrote the stray node
    assert targets[1][3] is None  # after the stray node: nothing to teach
    assert T._weight(vocab, task, None) == 0.0
    assert T._weight(vocab, task, vocab.found) == T.FOUND_WEIGHT > T._weight(vocab, task, vocab.path_end) > 1.0
    assert T._weight(vocab, task, targets[0][0]) == T._weight(vocab, task, vocab.eos) == T.CLAIM_WEIGHT
    # the file --sample-runs writes reads back
    path = tmp_path / "runs.jsonl"
    row = {"paths": task.paths, "link_order": task.link_order, "mode": task.mode, "target": task.target,
           "outputs": [worker0, worker1]}
    path.write_text(json.dumps({"seed": 0}) + "\n" + json.dumps(row) + "\n")
    assert T.load_runs(path) == {2: [(task, [worker0, worker1])]}
    # several files read as one that holds them all in order (--runs A B), each header line skipped
    other = tmp_path / "more.jsonl"
    other.write_text(json.dumps({"seed": 1}) + "\n" + json.dumps({**row, "outputs": [worker1, worker0]}) + "\n")
    assert T.load_runs([path, other]) == {2: [(task, [worker0, worker1]), (task, [worker1, worker0])]}
    assert T._runs_record(path) == {"file": "runs.jsonl", "share": T.RUNS_SHARE, "seed": 0}
    assert T._runs_record([path, other]) == {"files": ["runs.jsonl", "more.jsonl"], "share": T.RUNS_SHARE,
                                              "sampled": [{"seed": 0}, {"seed": 1}]}


def test_the_demo_board_names_each_claim_by_its_letter_and_start(capsys) -> None:
    from vllm_hogwild.tools.demo import PathBoard

    task = L.make_task(4, 2, "find")
    board = PathBoard(2, task)
    a = task.answer_index
    other = next(i for i in range(4) if i != a)
    board.update(1, 0, f"\n{L.SLOTS[a]}:")
    board.update(1, 1, f"\n{L.SLOTS[other]}:")
    board.update(2, 1, f"\n{L.SLOTS[other]}: {task.paths[other][0]}")  # the same entry: no second claim
    board.update(9, 0, L.entry(a, task.paths[a], found=True))
    out = capsys.readouterr().out
    assert f"Alice  takes {L.SLOTS[a]}={task.paths[a][0]}" in out and out.count(" takes ") == 2
    assert f"FOUND: {L.SLOTS[a]}={task.paths[a][0]} leads to {task.target} ({len(task.paths[a]) - 1} links)" in out
    board.update(10, 1, "\nz:")  # a letter no start has
    assert "takes z=?" in capsys.readouterr().out


@pytest.mark.parametrize("argv,message", [
    (["--runs", "no-such-runs.jsonl"], "--runs: no such file no-such-runs.jsonl"),
    (["--presence", "1"], "--presence: of --collaborator merges"),
    (["--presence", "-1"], "--presence: at least 0"),
    (["--first-items", "0"], "--first-items: 1 to"),
    (["--steps", "0"], "--steps: at least 1"),
])
def test_the_trainers_command_line_refuses_bad_arguments_naming_them(argv, message, capsys) -> None:
    from vllm_hogwild.training import train_links as T

    with pytest.raises(SystemExit) as exit_:
        T.main(argv)
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_the_checking_policy_played_on_corrects_an_entry_a_reader_can_see_is_wrong() -> None:
    task = L.make_task(4, 11, "all")
    a, b, c, d = task.paths  # b is long
    wrong_a = (a[0], *d[1:])  # a's start, then d's nodes: shares them with d's entry
    texts = [L.entry(0, wrong_a) + L.entry(2, c), L.entry(1, b), L.entry(3, d)]
    assert not L.check(task, texts).correct
    played, steps = R.checked_replay(task, texts, random.Random(0))
    score = L.check(task, played)
    assert score.correct and score.checks_by_kind()["corrected"] == 1 and score.checks_by_kind()["confirmed"] == 1
    for check in score.checks:  # both sides of the shared nodes, each by a worker that did not write it
        assert {e.worker for e in score.entries if e.start == check.start} == {0 if check.start == a[0] else 2}
        assert check.worker not in {0 if check.start == a[0] else 2}
    lengths = [sum(len(n) + 2 for _, n, _ in L.parse(t)[0]) for t in texts]  # a token a node, claim and end
    assert steps == max(lengths) + 1  # both checks fit while b's long entry is written: no step more
    right = [L.entry(0, a) + L.entry(2, c) + L.entry(3, d), L.entry(1, b)]  # nothing shared: nothing to check
    assert R.checked_replay(task, right, random.Random(0)) == (right, len(b) + 2 + 1)
    # a worker free in the step a co-worker claims c has not read that claim yet: it takes c too
    played, _ = R.checked_replay(task, [L.entry(0, a) + L.entry(2, c), L.entry(1, b), L.entry(3, d)], random.Random(0))
    assert played[2].endswith(L.entry(2, c)) and L.check(task, played).duplicated_items == 1
    # a start nobody wrote is claimed and written; a malformed text gives no replay
    played, _ = R.checked_replay(task, [L.entry(0, a), L.entry(1, b)], random.Random(0))
    assert L.check(task, played).correct and L.check(task, played).checks == []
    assert R.checked_replay(task, ["junk"], random.Random(0)) is None
    with pytest.raises(ValueError, match="^task"):
        R.checked_replay(L.make_task(3, 1, "find"), [""], random.Random(0))
