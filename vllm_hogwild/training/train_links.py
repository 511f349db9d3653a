"""Train the links collaborator (:mod:`vllm_hogwild.models.links_collaborator`) or, with ``--collaborator merges``,
the merges collaborator (:mod:`vllm_hogwild.models.merges_collaborator`) on what the engine computes.

    python -m vllm_hogwild.training.train_links [--collaborator links|merges] [--out DIR] [--steps 1500] [--seed 0]

Each batch is whole groups simulated in lock-step (the same number of workers in a batch), every worker's every
output token labeled with the policy's target for the view it was written from, and the logits are the engine's:
:func:`vllm_hogwild.models.lockstep.group_logits` computes each token's K/V in its writer's own view at its step
and lets co-workers read it at their view positions, as vLLM's KV cache and Hogwild's attention do. Tasks start
at :data:`FIRST_ITEMS` paths and grow by one after each batch whose next-node accuracy reaches :data:`GROW_AT`, up
to :data:`MAX_ITEMS` (a run whose tasks grew on a schedule, from 1 path to 22 over 450 steps, had not learned to
follow a link after 325). A link token's embedding is trained as the sum of
its source's and its end's (:class:`FactoredTable`); the folder holds the sums, as a plain Llama's embedding,
stored in float16 (the engine computes in float32). Seeded and reproducible on one machine (the same seed, steps
and thread count give the same weights). Without ``--out`` it writes a fresh folder under the cache.

    python -m vllm_hogwild.training.train_links --sample-runs RUNS --init DIR [--groups 256] [--seed K]
    python -m vllm_hogwild.training.train_links --init DIR --runs RUNS [RUNS ...] --out NEXT ...

The first lets the engine run a trained folder and writes its runs; the second trains the next phase on them (on
several files' runs, as if one file held them all, in the order given) as
well (:data:`RUNS_SHARE` of the batches), every token labeled with the policy's target from its view. The shipped
weights (``vllm_hogwild/models/links-collaborator``) are such a chain of phases; its ``training.json`` nests every
phase's arguments, runs, loss curve, time, machine and commit (``docs/user_guide.md`` tells what each phase
changed).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from pathlib import Path
from typing import Sequence

from vllm_hogwild.tasks import links as L
from vllm_hogwild.models import links_collaborator as LC
from vllm_hogwild.models import merges_collaborator as MC
from vllm_hogwild.models import checks_collaborator as KC
from vllm_hogwild.models.lockstep import group_logits
from vllm_hogwild.training.folders import carry_over, export
from vllm_hogwild.training.presence import CHECK_HEAD, PRESENCE_HEAD, check_head_loss, presence_loss, presence_tables
from vllm_hogwild.core.machine import machine

COLLABORATORS = {"links": LC, "merges": MC, "checks": KC}  # what --collaborator trains: the module of its vocabulary and policy

CLAIM_WEIGHT = 4.0  # a claim's loss counts this many times a fixed token's (and its end of sequence, when all are claimed)
CHECK_WEIGHT = 8.0  # checks: a choice between entries where a check is due (rare: a co-worker's error seen)
END_WEIGHT, FOUND_WEIGHT = 4.0, 16.0  # find mode: a path's end, ";" or (the terminal to find) "!"
RUNS_SHARE = 0.5  # with --runs: the share of batches drawn from the engine's sampled runs
TOKENS_PER_BATCH = 6000  # about: prompts and outputs of a batch's groups together
FIRST_ITEMS, GROW_AT = 2, 0.9
MAX_ITEMS = LC.MAX_TRAIN_ITEMS  # the links collaborator's (each collaborator's: its MAX_TRAIN_ITEMS)


def _shared_nodes(task) -> frozenset:
    """The nodes on two paths or more (merges: where a path may end by reference, or must not)."""
    seen, shared = set(), set()
    for path in task.paths:
        for node in path[1:-1]:
            (shared if node in seen else seen).add(node)
    return frozenset(shared)


def _weight(vocab: LC.LinksVocab, task, target, shared: frozenset = frozenset()) -> float:
    if target is None:
        return 0.0
    if isinstance(target, tuple) and any(t in getattr(vocab, "index_of_check", ()) for t in target):
        return CHECK_WEIGHT  # checks: which co-worker's entry to check
    if isinstance(target, tuple) or target == vocab.eos or target in getattr(vocab, "node_of_reference", ()):
        return CLAIM_WEIGHT  # a claim, the end, or (merges) a reference: the decisions
    if shared and vocab.node_of.get(target) in shared:
        return CLAIM_WEIGHT  # merges: a node written whole where another path passes (it was not written before)
    if task.mode == "find" and target in (vocab.path_end, vocab.found):
        return FOUND_WEIGHT if target == vocab.found else END_WEIGHT
    return 1.0


def _from_runs(C, vocab: LC.LinksVocab, runs: list, rng: random.Random):
    """Endless ``(task, labeled group)`` drawn from the engine's runs of one group size."""
    while True:
        task, outputs = rng.choice(runs)
        yield task, C.labeled_run(vocab, task, outputs)


def _from_policy(C, vocab: LC.LinksVocab, task, n: int, cap: int, rng: random.Random):
    """Endless ``(task, labeled group)``: the policy's runs of ``n`` workers on ``task``, then on tasks like it."""
    while True:
        yield task, C.labeled_group(vocab, task, n, rng)
        task = C.draw_like(rng, task, cap)


def batches(vocab: LC.LinksVocab, seed: int, max_items, runs: dict | None = None, C=LC):
    """Endless ``(groups, index [B, N, T, K], share [B, N, T, K], weight [B, N, T])``: each output token's target
    tokens and their shares (one token, or a uniform choice among ``K`` at most), position 0 every worker's token 0
    (from the prompt), position ``j + 1`` its token ``j + 1`` (from its fed token ``j``). ``max_items()``: the
    largest task now."""
    import torch

    rng = random.Random(seed)
    while True:
        cap = max_items()
        if runs and rng.random() < RUNS_SHARE:  # the engine's own runs of an earlier model, labeled by the policy
            n = rng.choice(sorted(runs))
            examples = _from_runs(C, vocab, runs[n], rng)
        else:
            task, n = C.draw(rng, cap)  # the batch's group size, and about its tasks' size (little padding)
            examples = _from_policy(C, vocab, task, n, cap, rng)
        groups, labels, tasks, size = [], [], [], 0
        for task, (group, targets) in examples:
            groups.append(group)
            labels.append(targets)
            tasks.append(task)
            size += len(group.prompt) + sum(len(o) for o in group.outputs)
            if size >= TOKENS_PER_BATCH or len(groups) == 48:
                break
        t = max(len(o) for g in groups for o in g.outputs)
        k = max((len(x) for rows in labels for row in rows for x in row if isinstance(x, tuple)), default=1)
        index = torch.zeros(len(groups), n, t, k, dtype=torch.long)
        share = torch.zeros(len(groups), n, t, k)
        weight = torch.zeros(len(groups), n, t)
        for b, targets in enumerate(labels):
            shared = _shared_nodes(tasks[b]) if hasattr(vocab, "reference") else frozenset()
            for w, row in enumerate(targets):
                for j, tgt in enumerate(row):
                    weight[b, w, j] = _weight(vocab, tasks[b], tgt, shared)
                    if isinstance(tgt, tuple):
                        index[b, w, j, :len(tgt)] = torch.tensor(tgt)
                        share[b, w, j, :len(tgt)] = 1.0 / len(tgt)
                    elif tgt is not None:
                        index[b, w, j, 0] = tgt
                        share[b, w, j, 0] = 1.0
        yield groups, index, share, weight


def _modules():
    import torch
    import torch.nn.functional as F

    class FactoredTable(torch.nn.Module):
        """The embedding (tied to the output layer): a row per token, where a link token's row is its source's
        vector plus its end's, a node's or terminal's token on a path or to find is the entity's vector plus the
        role's, a claim is its letter's vector plus the claim role's, and a listed start ``" b=12"`` its letter's,
        its node's and the start role's."""

        def __init__(self, vocab: LC.LinksVocab, hidden: int, std: float) -> None:
            super().__init__()
            ids, sources, ends = LC.link_parts(vocab)
            entities = L.MAX_NODE + len(L.TERMINALS)
            self.table = torch.nn.Parameter(torch.randn(vocab.size, hidden) * std)
            self.source = torch.nn.Parameter(torch.randn(L.MAX_NODE, hidden) * std)
            self.end = torch.nn.Parameter(torch.randn(entities, hidden) * std)
            self.entity = torch.nn.Parameter(torch.randn(entities, hidden) * std)
            self.role = torch.nn.Parameter(torch.randn(len(vocab.roles), hidden) * std)
            self.roles_named = vocab.roles
            self.register_buffer("ids", torch.tensor(ids), persistent=False)
            self.register_buffer("sources", torch.tensor(sources), persistent=False)
            self.register_buffer("ends", torch.tensor(ends), persistent=False)
            role_ids, which, roles = LC.role_parts(vocab)
            self.register_buffer("role_ids", torch.tensor(role_ids), persistent=False)
            self.register_buffer("which", torch.tensor(which), persistent=False)
            self.register_buffer("roles", torch.tensor(roles), persistent=False)
            claims, claim_letters, listed, listed_letters = LC.letter_parts(vocab)
            self.letter = torch.nn.Parameter(torch.randn(len(L.SLOTS), hidden) * std)
            self.register_buffer("claim_ids", torch.tensor(claims), persistent=False)
            self.register_buffer("claim_letters", torch.tensor(claim_letters), persistent=False)
            self.register_buffer("listed_ids", torch.tensor(listed), persistent=False)
            self.register_buffer("listed_letters", torch.tensor(listed_letters), persistent=False)
            self.register_buffer("listed_nodes", torch.tensor(LC.listed_nodes()), persistent=False)
            checks, check_letters = KC.check_parts(vocab) if "check" in vocab.roles else ([], [])
            self.register_buffer("check_ids", torch.tensor(checks, dtype=torch.long), persistent=False)
            self.register_buffer("check_letters", torch.tensor(check_letters, dtype=torch.long), persistent=False)

        def forward(self) -> torch.Tensor:
            claim, start = self.roles_named.index("claim"), self.roles_named.index("start")
            rows = self.table.index_put((self.ids,), self.source[self.sources] + self.end[self.ends])
            rows = rows.index_put((self.role_ids,), self.entity[self.which] + self.role[self.roles])
            rows = rows.index_put((self.claim_ids,), self.letter[self.claim_letters] + self.role[claim])
            if len(self.check_ids):
                check = self.roles_named.index("check")
                rows = rows.index_put((self.check_ids,), self.letter[self.check_letters] + self.role[check])
            return rows.index_put((self.listed_ids,), self.letter[self.listed_letters]
                                  + self.entity[self.listed_nodes] + self.role[start])

    class Embedding(torch.nn.Module):
        def __init__(self, table) -> None:
            super().__init__()
            self.table = table

        def forward(self, ids):
            return F.embedding(ids, self.table())

    return FactoredTable, Embedding


def hidden_of(model, groups, pad: int, attention: tuple[int, int] | None = None):
    """``[B, N, T, d]``: each worker's final hidden state for its output tokens 0..T-1 (token 0's from the prompt);
    the model's output layer is the identity while training. With ``attention``, also that head's attention of
    each fed token (:func:`vllm_hogwild.models.lockstep.group_logits`)."""
    import torch

    first, lanes, _, _, *looked = group_logits(model, groups, pad=pad, attention=attention)
    b, n, t, d = lanes.shape
    width = max(len(o) for g in groups for o in g.outputs)
    out = torch.cat([first[:, None, None, :].expand(b, n, 1, d), lanes], dim=2)
    return (out[:, :, :width], *looked) if attention is not None else out[:, :, :width]


def train(out: Path, steps: int = 1500, lr: float = 1e-3, seed: int = 0, num_layers: int = 4, hidden: int = 128,
          threads: int = 2, log_every: int = 25, init: Path | None = None, first_items: int = FIRST_ITEMS,
          runs: Path | Sequence[Path] | None = None, collaborator: str = "links", presence: float = 0.0,
          check_head: float = 0.0) -> dict:
    import torch
    from transformers import LlamaForCausalLM

    C = COLLABORATORS[collaborator]
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    vocab = C.Vocab.build()
    before = None if init is None else LlamaForCausalLM.from_pretrained(init, dtype=torch.float32)
    if before is not None:
        num_layers, hidden = before.config.num_hidden_layers, before.config.hidden_size
    config = C.model_config(vocab, num_layers, hidden)
    model = LlamaForCausalLM(config).to(torch.float32)
    FactoredTable, Embedding = _modules()
    table = FactoredTable(vocab, hidden, config.initializer_range)
    if before is not None:
        carry_over(before, init, model, table, C)
    model.model.embed_tokens = Embedding(table)
    model.lm_head = torch.nn.Identity()
    params = [p for name, p in model.named_parameters()]
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.98), weight_decay=0.01)
    warmup = max(1, steps // 20)

    def lr_at(step: int) -> float:
        if step < warmup:
            return lr * (step + 1) / warmup
        return lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup))))

    cap = [first_items]
    grew = []  # (step, paths) each time tasks grew
    most = C.MAX_TRAIN_ITEMS
    stream = batches(vocab, seed, lambda: cap[0], None if runs is None else load_runs(runs, C), C)
    nodes = torch.zeros(vocab.size, dtype=torch.bool)
    nodes[list(vocab.node.values())] = True
    references = torch.zeros(vocab.size, dtype=torch.bool)
    references[list(getattr(vocab, "reference", {}).values())] = True
    curve, t0 = [], time.perf_counter()
    model.train()
    # a head asked to look: (layer, head), its name in the log, its loss's weight and the loss
    looks = None
    if "reference" in vocab.roles and presence:  # merges: the presence head
        tables = presence_tables(vocab)
        looks, name, aux_weight = PRESENCE_HEAD, "presence", presence

        def aux(att, groups, index, share, weight):
            return presence_loss(att, groups, index, share, weight, vocab, vocab.pad, tables)
    elif "check" in vocab.roles and check_head:  # checks: the check head
        looks, name, aux_weight = CHECK_HEAD, "check head", check_head

        def aux(att, groups, index, share, weight):
            return check_head_loss(att, groups, weight, vocab, vocab.pad, CHECK_WEIGHT)
    for step in range(steps):
        groups, index, share, weight = next(stream)
        h, *att = hidden_of(model, groups, vocab.pad, looks) if looks else (hidden_of(model, groups, vocab.pad),)
        keep = weight > 0
        logp = torch.log_softmax(h[keep] @ table().T, -1)  # [M, V]: the labeled positions only
        idx, sh, w = index[keep], share[keep], weight[keep]
        nll = -(logp.gather(-1, idx) * sh).sum(-1)
        loss = (nll * w).sum() / w.sum()
        looked = aux(att[0], groups, index, share, weight) if looks else None
        total = loss if looked is None else loss + aux_weight * looked
        floor = (-(sh * sh.clamp_min(1e-12).log()).sum(-1) * w).sum() / w.sum()
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        opt.zero_grad(set_to_none=True)
        total.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        hop = (sh[:, 0] == 1) & nodes[idx[:, 0]]  # a path's next node
        acc = (logp.argmax(-1) == idx[:, 0])[hop].float().mean().item() if hop.any() else 0.0
        # between entries: a start nobody has claimed, any of them, or the end (not a merges node's decision)
        claims = (w == CLAIM_WEIGHT) & ~nodes[idx[:, 0]] & ~references[idx[:, 0]]
        picked = ((idx == logp.argmax(-1, keepdim=True)) & (sh > 0)).any(-1)
        claim_acc = picked[claims].float().mean().item() if claims.any() else 0.0
        finds = w == FOUND_WEIGHT
        find_acc = picked[finds].float().mean().item() if finds.any() else float("nan")
        due = w == CHECK_WEIGHT  # checks: where a check is due, one of them chosen
        check_acc = picked[due].float().mean().item() if due.any() else float("nan")
        refs = (sh[:, 0] == 1) & references[idx[:, 0]]  # merges: where the policy ends a path by reference
        ref_acc = picked[refs].float().mean().item() if refs.any() else float("nan")
        if acc >= GROW_AT and cap[0] < most:
            cap[0] += 1
            grew.append([step, cap[0]])
        if step % log_every == 0 or step == steps - 1:
            excess = loss.item() - floor.item()
            curve.append([step, round(loss.item(), 5), round(excess, 5), round(acc, 4), round(claim_acc, 4),
                          *(None if math.isnan(x) else round(x, 4) for x in (find_acc, ref_acc)
                            + ((check_acc,) if "check" in vocab.roles else ()))])
            shown = "" if looked is None else f"{name} {looked.item():.3f}  "
            print(f"step {step:5d}  workers {groups[0].num_workers}  groups {len(groups):2d}  prompts <= "
                  f"{max(len(g.prompt) for g in groups):3d} tokens  paths <= {cap[0]:2d}  loss {loss.item():.4f}  above the targets' entropy "
                  f"{excess:.4f}  next node right {acc:.3f}  claims free {claim_acc:.3f}  finds {find_acc:.2f}  references {ref_acc:.2f}  checks {check_acc:.2f}  {shown}lr {lr_at(step):.2e}  {time.perf_counter() - t0:6.0f} s",
                  flush=True)
    seconds = time.perf_counter() - t0
    export(model, table, config, out, C)
    record = {"command": C.COMMAND, "steps": steps, "lr": lr, "seed": seed,
              "num_layers": num_layers, "hidden": hidden, "threads": threads, "tokens_per_batch": TOKENS_PER_BATCH,
              "claim_weight": CLAIM_WEIGHT, "curriculum": {"first_items": first_items, "grow_at": GROW_AT,
                                                          "max_items": most, "grew": grew},
              "end_weight": END_WEIGHT, "found_weight": FOUND_WEIGHT,
              "presence": {"head": list(looks), "weight": aux_weight} if looks == PRESENCE_HEAD else None,
              "check_head": {"head": list(looks), "weight": aux_weight} if looks == CHECK_HEAD else None,
              "runs": None if runs is None else _runs_record(runs),
              "init": None if init is None else json.loads((Path(init) / "training.json").read_text()),
              "num_parameters": sum(p.numel() for p in model.parameters()), "train_seconds": round(seconds, 1),
              "loss_curve": curve, "machine": machine(), "torch": torch.__version__, "commit": _commit()}
    (out / "training.json").write_text(json.dumps(record, indent=1) + "\n")
    return record


def _commit() -> str | None:
    """The checkout's commit (a phase's record names the code that ran it), or None outside a git checkout."""
    import subprocess

    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent, capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def sample_runs(model: Path, out: Path, groups: int = 256, seed: int = 0, collaborator: str = "links") -> None:
    """Let the engine run a trained folder on ``groups`` tasks per group size (1, 2, 4 and 8 workers; paths as
    :func:`links_collaborator.draw_size` draws them, either mode) and write each run to ``out`` (JSON lines: a
    header, then a task and each worker's output tokens a line). Training on these runs, every token labeled with what the policy would
    have written from that view, teaches the model to go on right from where its own sampling takes it (a claim
    of a taken start, a wrong find), which runs of the policy alone never show it."""
    from vllm_hogwild.models import solve

    C = COLLABORATORS[collaborator]
    rng = random.Random(seed)
    llm = solve.links_engine(str(model))
    lines = [json.dumps({"model": json.loads((Path(model) / "training.json").read_text()).get("command"),
                         "groups_per_size": groups, "seed": seed})]
    for n in (1, 2, 4, 8):
        tasks = [C.make_task(C.draw_size(rng, C.MAX_TRAIN_ITEMS), rng.randrange(1 << 62), rng.choice(L.MODES))
                 for _ in range(groups)]
        for i in range(0, groups, 64):
            chunk = tasks[i:i + 64]
            if collaborator == "merges":  # find mode: cancelled at the find, as the benchmark's client does
                runs, _ = solve.run_merges_groups(llm, chunk, n, "contiguous", rng.randrange(1 << 31), "sample")
                lanes_of = [r.token_ids for r in runs]
            else:
                outs, _ = solve.run_links_groups(llm, chunk, n, "contiguous", rng.randrange(1 << 31))
                lanes_of = [[list(c.token_ids) for c in sorted(o.outputs, key=lambda c: c.index)] for o in outs]
            for task, lanes in zip(chunk, lanes_of):
                lines.append(json.dumps({**C.run_record(task), "outputs": lanes}))
        print(f"sampled {groups} groups of {n}", flush=True)
    out.write_text("\n".join(lines) + "\n")


def _paths(runs: Path | Sequence[Path]) -> list[Path]:
    return [Path(runs)] if isinstance(runs, (str, Path)) else [Path(p) for p in runs]


def load_runs(runs: Path | Sequence[Path], C=LC) -> dict[int, list]:
    """:func:`sample_runs`' files as ``{workers: [(task, outputs), ...]}``: each file's runs after its header line,
    the files in the order given (two files read as one that holds the second's runs after the first's)."""
    out: dict[int, list] = {}
    for path in _paths(runs):
        for line in path.read_text().splitlines()[1:]:
            r = json.loads(line)
            out.setdefault(len(r["outputs"]), []).append((C.task_of_run(r), r["outputs"]))
    return out


def _runs_record(runs: Path | Sequence[Path]) -> dict:
    """What ``training.json`` says of the runs: the file (and the header :func:`sample_runs` wrote), or the files
    and each one's header."""
    paths = _paths(runs)
    headers = []
    for path in paths:
        with path.open() as f:  # the header line alone: a phase's runs run to megabytes
            headers.append(json.loads(f.readline()))
    names = [p.name for p in paths]
    if len(names) == 1:
        return {"file": names[0], "share": RUNS_SHARE, **headers[0]}
    return {"files": names, "share": RUNS_SHARE, "sampled": headers}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None, help="folder to write (default: under the cache)")
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--init", type=Path, default=None, help="go on from this trained folder")
    parser.add_argument("--first-items", type=int, default=FIRST_ITEMS, help="the paths of the first tasks")
    parser.add_argument("--runs", type=Path, nargs="+", default=None, metavar="RUNS",
                        help="also train on these runs the engine sampled (files written by --sample-runs)")
    parser.add_argument("--sample-runs", type=Path, default=None, metavar="FILE",
                        help="instead of training: let the engine run the --init folder and write its runs to FILE")
    parser.add_argument("--groups", type=int, default=256, help="--sample-runs: tasks per group size")
    parser.add_argument("--collaborator", choices=tuple(COLLABORATORS), default="links",
                        help="which to train: links (vllm_hogwild/models/links_collaborator.py), merges "
                             "(merges_collaborator.py) or checks (checks_collaborator.py): the last two's tokenizers "
                             "extend the links one, and --init may be a links folder")
    parser.add_argument("--presence", type=float, default=0.0, metavar="WEIGHT",
                        help="merges: also train the presence head (PRESENCE_HEAD) to look at a due node's tokens "
                             "in the lanes, its loss this many times the tokens' (default 0: off)")
    parser.add_argument("--check-head", type=float, default=0.0, metavar="WEIGHT",
                        help="checks: also train the check head (CHECK_HEAD) to look, where a check is due, at the "
                             "tokens of nodes two starts' entries pass through, its loss this many times the tokens' "
                             "(default 0: off)")
    args = parser.parse_args(argv)
    if args.presence < 0:
        parser.error("--presence: at least 0")
    if args.presence and args.collaborator != "merges":
        parser.error("--presence: of --collaborator merges")
    if args.check_head < 0:
        parser.error("--check-head: at least 0")
    if args.check_head and args.collaborator != "checks":
        parser.error("--check-head: of --collaborator checks")
    if args.sample_runs is not None:
        if args.init is None:
            parser.error("--sample-runs: needs --init, the folder to run")
        sample_runs(args.init, args.sample_runs, args.groups, args.seed, args.collaborator)
        return
    for path in args.runs or ():
        if not path.is_file():
            parser.error(f"--runs: no such file {path}")
    most = COLLABORATORS[args.collaborator].MAX_TRAIN_ITEMS
    if not 1 <= args.first_items <= most:
        parser.error(f"--first-items: 1 to {most}")
    for name in ("steps", "layers", "hidden", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name}: at least 1")
    out = args.out
    if out is None:
        from vllm_hogwild.models.default import cache_dir

        out = cache_dir() / f"{args.collaborator}-collaborator-{args.seed}-{args.steps}"
    record = train(out, args.steps, args.lr, args.seed, args.layers, args.hidden, args.threads, init=args.init,
                   first_items=args.first_items, runs=args.runs, collaborator=args.collaborator,
                   presence=args.presence, check_head=args.check_head)
    print(f"wrote {out} ({record['num_parameters']} parameters, {record['train_seconds']} s)")


if __name__ == "__main__":
    main()
