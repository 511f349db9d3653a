"""Train the links collaborator (:mod:`vllm_hogwild.tools.links_collaborator`) on what the engine computes.

    python -m vllm_hogwild.tools.train_links [--out DIR] [--steps 3000] [--seed 0] [--threads 2]

Each batch is whole groups simulated in lock-step (the same number of workers in a batch), every worker's every
output token labeled with the policy's target for the view it was written from, and the logits are the engine's:
:func:`vllm_hogwild.tools.lockstep.group_logits` computes each token's K/V in its writer's own view at its step
and lets co-workers read it at their view positions, as vLLM's KV cache and Hogwild's attention do. Seeded and
reproducible on one machine (the same seed, steps and thread count give the same weights). Without ``--out`` it
writes a fresh folder under the cache; the shipped weights (``vllm_hogwild/models/links-collaborator``) were
written with ``--out vllm_hogwild/models/links-collaborator`` (its ``training.json`` holds the arguments, the loss
curve, the time it took and the machine).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from pathlib import Path

from vllm_hogwild.tools import links_collaborator as C
from vllm_hogwild.tools.lockstep import group_logits
from vllm_hogwild.tools.machine import machine

CLAIM_WEIGHT = 4.0  # a claim's loss counts this many times a fixed token's
TOKENS_PER_BATCH = 6000  # about: prompts and outputs of a batch's groups together


def batches(vocab: C.LinksVocab, seed: int):
    """Endless ``(groups, target [B, N, T + 1, V], weight [B, N, T + 1])``: position 0 is every worker's token 0
    (from the prompt), position ``j + 1`` its token ``j + 1`` (from its fed token ``j``)."""
    import torch

    rng = random.Random(seed)
    while True:
        task, n = C.draw(rng)  # the batch's group size, and about its tasks' size (little padding)
        groups, labels, size = [], [], 0
        while size < TOKENS_PER_BATCH and len(groups) < 48:
            if groups:
                task = C.draw_like(rng, task)
            group, targets = C.labeled_group(vocab, task, n, rng)
            groups.append(group)
            labels.append(targets)
            size += len(group.prompt) + sum(len(o) for o in group.outputs)
        t = max(len(o) for g in groups for o in g.outputs)
        target = torch.zeros(len(groups), n, t, vocab.size)
        weight = torch.zeros(len(groups), n, t)
        for b, targets in enumerate(labels):
            for w, row in enumerate(targets):
                for j, tgt in enumerate(row):
                    if isinstance(tgt, tuple):
                        target[b, w, j, list(tgt)] = 1.0 / len(tgt)
                        weight[b, w, j] = CLAIM_WEIGHT
                    else:
                        target[b, w, j, tgt] = 1.0
                        weight[b, w, j] = 1.0
        yield groups, target, weight


def logits_of(model, groups, pad: int):
    """``[B, N, T, V]``: each worker's logits for its output tokens 0..T-1 (token 0's from the prompt)."""
    import torch

    first, lanes, _, _ = group_logits(model, groups, pad=pad)
    b, n, t, v = lanes.shape
    width = max(len(o) for g in groups for o in g.outputs)
    out = torch.cat([first[:, None, None, :].expand(b, n, 1, v), lanes], dim=2)
    return out[:, :, :width]


def train(out: Path, steps: int = 3000, lr: float = 3e-3, seed: int = 0, num_layers: int = 4, hidden: int = 128,
          threads: int = 2, log_every: int = 50, init: Path | None = None) -> dict:
    import torch
    from transformers import LlamaForCausalLM

    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    vocab = C.LinksVocab.build()
    if init is not None:
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

    stream = batches(vocab, seed)
    curve, t0 = [], time.perf_counter()
    model.train()
    for step in range(steps):
        groups, target, weight = next(stream)
        logits = logits_of(model, groups, vocab.pad)
        loss = -(target * torch.log_softmax(logits, -1)).sum(-1).mul(weight).sum() / weight.sum()
        floor = -(target * torch.log(target.clamp_min(1e-12))).sum(-1).mul(weight).sum() / weight.sum()
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % log_every == 0 or step == steps - 1:
            excess = loss.item() - floor.item()
            curve.append([step, round(loss.item(), 5), round(excess, 5)])
            print(f"step {step:5d}  workers {groups[0].num_workers}  groups {len(groups):2d}  loss {loss.item():.4f}  "
                  f"above the targets' entropy {excess:.4f}  lr {lr_at(step):.2e}  {time.perf_counter() - t0:6.0f} s",
                  flush=True)
    seconds = time.perf_counter() - t0
    out.mkdir(parents=True, exist_ok=True)
    model.eval()
    model.save_pretrained(out, safe_serialization=True)
    C.save_tokenizer(out)
    record = {"command": "python -m vllm_hogwild.tools.train_links", "steps": steps, "lr": lr, "seed": seed,
              "num_layers": num_layers, "hidden": hidden, "threads": threads,
              "tokens_per_batch": TOKENS_PER_BATCH, "claim_weight": CLAIM_WEIGHT,
              "init": None if init is None else json.loads((Path(init) / "training.json").read_text()),
              "num_parameters": sum(p.numel() for p in model.parameters()), "train_seconds": round(seconds, 1),
              "loss_curve": curve, "machine": machine(), "torch": torch.__version__}
    (out / "training.json").write_text(json.dumps(record, indent=1) + "\n")
    return record


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None, help="folder to write (default: under the cache)")
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--init", type=Path, default=None, help="start from this trained folder")
    args = parser.parse_args(argv)
    for name in ("steps", "layers", "hidden", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name}: at least 1")
    out = args.out
    if out is None:
        from vllm_hogwild.tools.default_model import cache_dir

        out = cache_dir() / f"links-collaborator-{args.seed}-{args.steps}"
    record = train(out, args.steps, args.lr, args.seed, args.layers, args.hidden, args.threads, init=args.init)
    print(f"wrote {out} ({record['num_parameters']} parameters, {record['train_seconds']} s)")


if __name__ == "__main__":
    main()
