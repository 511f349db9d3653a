"""Train the collaborator (:mod:`vllm_hogwild.models.roman_collaborator`): a small Llama vLLM loads unchanged.

    python -m vllm_hogwild.training.train [--out DIR] [--steps 2400] [--seed 0] [--protocols raw multiverse]
                                       [--eval 32]

Seeded and reproducible on one machine: the same seed, steps and thread count
give the same weights (torch's CPU kernels; ``--threads``, default 2). Without
``--out`` it writes a fresh folder under the cache; the shipped weights
(``vllm_hogwild/models/collaborator``) were written by the default command with
``--out vllm_hogwild/models/collaborator`` (the folder's ``training.json`` holds
the arguments, the loss curve, the time it took and the machine).

Each batch is views of simulated lock-step runs (the engine's views, see the
collaborator's docstring) with the policy's target at every position after the
prompt: a soft target over the unclaimed numbers where an entry starts, the
entry's next token elsewhere. ``--eval N`` then runs N fresh tasks with the
trained model over the same simulated views (1, 2 and 4 workers, contiguous,
and 4 isolated) and prints accuracy and sequential steps; the engine's own
figures come from ``python -m benchmarks.bench answer``.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import time
from itertools import islice
from pathlib import Path

from vllm_hogwild.tasks import roman
from vllm_hogwild.models import roman_collaborator as C
from vllm_hogwild.core.machine import machine



PROTOCOLS = ("raw", "multiverse")  # Hogwild groups in raw mode; fork/join requests (collaborator_forkjoin)


def batches(protocol: str, vocab: C.Vocab, seed: int, batch_size: int, end_rule: str = "in-claim",
            lookup_weight: float = C.CLAIM_WEIGHT):
    """Endless ``(model inputs, target [B, L, V], loss weight [B, L])``."""
    if protocol == "raw":
        stream = C.examples(vocab, seed, end_rule=end_rule)
        while True:
            ids, target, mask = C.batch(vocab, list(islice(stream, batch_size)))
            yield {"input_ids": ids}, target, mask
    from vllm_hogwild.models import collaborator_forkjoin as F

    stream = F.examples(vocab, seed)
    while True:
        ids, pos, attn, target, mask = F.batch(vocab, list(islice(stream, batch_size)), lookup_weight)
        yield {"input_ids": ids, "position_ids": pos, "attention_mask": attn}, target, mask


def train(out: Path, steps: int = 2400, batch_size: int = 32, lr: float = 3e-3, seed: int = 0,
          num_layers: int = 4, hidden: int = 128, threads: int = 2, log_every: int = 100,
          protocols: tuple[str, ...] = PROTOCOLS, init: Path | None = None, end_rule: str = "in-claim",
          lookup_weight: float = C.CLAIM_WEIGHT) -> dict:
    """Train and write the folder; one model for every protocol in ``protocols``, whose batches take turns
    (a fork/join batch holds half as many requests: each is a whole tree of lanes)."""
    import torch
    from transformers import LlamaForCausalLM

    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    vocab = C.Vocab.build()
    if init is not None:  # go on from a trained folder (a learning-rate restart)
        model = LlamaForCausalLM.from_pretrained(init, dtype=torch.float32)
        num_layers, hidden = model.config.num_hidden_layers, model.config.hidden_size
    else:
        model = LlamaForCausalLM(C.model_config(vocab, num_layers, hidden)).to(torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.01)
    warmup = max(1, steps // 20)

    def lr_at(step: int) -> float:
        if step < warmup:
            return lr * (step + 1) / warmup
        return lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup))))

    streams = [batches(p, vocab, seed + k, batch_size if p == "raw" else max(1, batch_size // 2), end_rule,
                       lookup_weight)
               for k, p in enumerate(protocols)]
    curve, t0 = [], time.perf_counter()
    model.train()
    for step in range(steps):
        inputs, target, mask = next(streams[step % len(streams)])
        logits = model(**inputs).logits
        loss = -(target * torch.log_softmax(logits, -1)).sum(-1).mul(mask).sum() / mask.sum()
        # The soft targets' own entropy is the floor of that loss: what is left above it is the model's error.
        floor = -(target * torch.log(target.clamp_min(1e-12))).sum(-1).mul(mask).sum() / mask.sum()
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % log_every == 0 or step == steps - 1:
            excess = loss.item() - floor.item()
            curve.append([step, protocols[step % len(protocols)], round(loss.item(), 5), round(excess, 5)])
            print(f"step {step:5d} ({protocols[step % len(protocols)]})  loss {loss.item():.4f}  "
                  f"above the targets' entropy {excess:.4f}  "
                  f"lr {lr_at(step):.2e}  {time.perf_counter() - t0:6.0f} s", flush=True)
    seconds = time.perf_counter() - t0
    out.mkdir(parents=True, exist_ok=True)
    model.eval()
    model.save_pretrained(out, safe_serialization=True)
    C.save_tokenizer(out)
    record = {"command": "python -m vllm_hogwild.training.train", "protocols": list(protocols), "end_rule": end_rule, "lookup_weight": lookup_weight, "steps": steps,
              "batch_size": batch_size, "lr": lr,
              "seed": seed, "num_layers": num_layers, "hidden": hidden, "threads": threads,
              "init": None if init is None else json.loads((Path(init) / "training.json").read_text()),
              "num_parameters": sum(p.numel() for p in model.parameters()), "train_seconds": round(seconds, 1),
              "loss_curve": curve, "machine": machine(), "torch": torch.__version__}
    (out / "training.json").write_text(json.dumps(record, indent=1) + "\n")
    return record


# -- a check over the simulated views (the engine's figures: bench answer) ----------------------------------------


def model_actor(model, vocab: C.Vocab, seed: int, temperature: float = C.TEMPERATURE, min_p: float = C.MIN_P):
    """``act(views) -> tokens``: the model's next token for each view, sampled as the engine would."""
    import torch

    gen = torch.Generator().manual_seed(seed)

    @torch.no_grad()
    def act(views):
        length = max(len(v) for v in views)
        ids = torch.full((len(views), length), vocab.pad, dtype=torch.long)
        for b, v in enumerate(views):
            ids[b, :len(v)] = torch.tensor(v)
        logits = model(input_ids=ids).logits[torch.arange(len(views)), torch.tensor([len(v) - 1 for v in views])]
        probs = torch.softmax(logits / temperature, -1)
        probs = torch.where(probs >= min_p * probs.max(-1, keepdim=True).values, probs, 0)
        return torch.multinomial(probs, 1, generator=gen).squeeze(1).tolist()
    return act


def evaluate(folder: Path, num_tasks: int, seed: int = 1) -> list[dict]:
    import torch
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    vocab = C.Vocab.build()
    tasks = roman.make_tasks(num_tasks, seed)
    rows = []
    for n, layout in ((1, "contiguous"), (2, "contiguous"), (4, "contiguous"), (4, "interleaved"), (4, "isolated")):
        correct, steps, dups = 0, [], []
        for i, task in enumerate(tasks):
            run = C.simulate(vocab, task, n, layout, random.Random(i), act=model_actor(model, vocab, seed + i),
                             keep_views=False)
            score = roman.check(task, C.texts_of(vocab, run))
            correct += score.correct
            steps.append(run.num_steps)
            dups.append(score.duplicated_items)
        row = {"workers": n, "layout": layout, "tasks": num_tasks, "accuracy": correct / num_tasks,
               "mean_sequential_steps": statistics.mean(steps), "duplicated_items": statistics.mean(dups)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--protocols", nargs="+", choices=PROTOCOLS, default=list(PROTOCOLS),
                        help="what the model learns (batches take turns): raw, Hogwild groups; multiverse, "
                             "fork/join requests")
    parser.add_argument("--out", type=Path, default=None, help="folder to write (default: under the cache)")
    parser.add_argument("--steps", type=int, default=2400)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--end-rule", choices=C.END_RULES, default="in-claim",
                        help="where the imitated policy ends (collaborator.policy_targets)")
    parser.add_argument("--lookup-weight", type=float, default=C.CLAIM_WEIGHT,
                        help="multiverse: loss weight of the numbers the goal copies and the conclusion names")
    parser.add_argument("--init", type=Path, default=None, help="start from this trained folder (its training.json "
                                                                 "is kept in the new one)")
    parser.add_argument("--eval", type=int, default=0, metavar="N", help="then check N fresh tasks (simulated views)")
    args = parser.parse_args(argv)
    for name in ("steps", "batch_size", "layers", "hidden", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')}: at least 1")
    out = args.out
    if out is None:
        from vllm_hogwild.models.default import cache_dir

        out = cache_dir() / f"collaborator-{'-'.join(args.protocols)}-{args.seed}-{args.steps}"
    record = train(out, args.steps, args.batch_size, args.lr, args.seed, args.layers, args.hidden, args.threads,
                   protocols=tuple(args.protocols), init=args.init, end_rule=args.end_rule,
                   lookup_weight=args.lookup_weight)
    print(f"wrote {out} ({record['num_parameters']} parameters, {record['train_seconds']} s)")
    if args.eval and "raw" in args.protocols:
        evaluate(out, args.eval)


if __name__ == "__main__":
    main()
