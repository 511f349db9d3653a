"""``capacity``: engine steps under tight KV caches, each configuration an engine in a process of its own."""

from __future__ import annotations

import json
import statistics

from . import common as c
from .forkjoin import goal_prompt


# -- capacity under a tight KV cache -------------------------------------------

CAPACITY_KINDS = ("stock", "on-demand", "reserve")


def capacity_kinds(protocol: str) -> tuple[str, ...]:
    """The configurations ``capacity`` compares: a stock engine has no fork, so fork/join runs Hogwild's only."""
    return CAPACITY_KINDS if protocol == "raw" else CAPACITY_KINDS[1:]


# Bytes per cached element: the benchmark's model runs in float32, so an unquantized ("auto") cache is float32.
ELEMENT_BYTES = {"auto": 4, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}
BLOCK_SIZE = 128


def blocks_for(size: int, kv_cache_dtype: str) -> int:
    """A cache of the bytes of ``size`` unquantized blocks holds this many blocks of ``kv_cache_dtype``."""
    return size * ELEMENT_BYTES["auto"] // ELEMENT_BYTES[kv_cache_dtype]


def groups_held(blocks: int, args) -> int:
    """Groups a cache of ``blocks`` holds at once with every lane at its whole budget (what ``reserve`` admits)."""
    per_lane = -(-(args.prompt_len + args.max_tokens) // BLOCK_SIZE)
    return min(args.groups, blocks // (per_lane * args.workers))


def capacity(llm, args) -> dict:
    """Each (KV size, cache dtype, configuration) in its own process; steps relative to the same configuration's
    at the largest size. ``--blocks`` sizes a cache in unquantized (float32) blocks: an FP8 cache of the same
    bytes holds 4 times as many."""
    results = []
    for size in args.blocks:
        for kv_cache_dtype in args.kv_cache_dtypes:
            blocks = blocks_for(size, kv_cache_dtype)
            for kind in capacity_kinds(args.protocol):
                argv = ["capacity-side", "--kind", kind, "--protocol", args.protocol,
                        "--blocks", str(blocks), "--groups", str(args.groups), "--workers", str(args.workers),
                        "--max-tokens", str(args.max_tokens), "--prompt-len", str(args.prompt_len),
                        "--stop-every", str(args.stop_every), "--model", args.model or "tiny",
                        "--kv-cache-dtype", kv_cache_dtype]
                for row in c.side_rows(argv, 1, f"capacity {kind} {kv_cache_dtype} {blocks}"):
                    results.append({**row, "size": size, "groups_held": groups_held(blocks, args)})
    largest = max(args.blocks)
    base = {(r["kind"], r["kv_cache_dtype"]): r for r in results if r["size"] == largest}
    for r in results:
        own = base[r["kind"], r["kv_cache_dtype"]]
        r["steps_vs_largest"] = r["steps"] / own["steps"]
        # The fewest steps a cache of this size could take for the same sequences: the largest cache's blocks held
        # step by step (block-steps) spread over every usable block, and never fewer than the largest cache's steps.
        r["steps_floor"] = max(own["steps"], -(-own["block_steps"] // (r["blocks"] - 1)))
    return {"benchmark": "capacity", "protocol": args.protocol, "results": results}


class held_blocks:
    """Sum the KV blocks held after each engine step that ran tokens (vLLM keeps one block of the pool, the null
    block, for itself; blocks of the prefix cache that no request holds count as free)."""

    def __init__(self, scheduler) -> None:
        self.scheduler, self.total = scheduler, [0]

    def __enter__(self) -> list[int]:
        s, total = self.scheduler, self.total
        pool, self.original = s.kv_cache_manager.block_pool, s.schedule

        def schedule(*args, **kwargs):
            output = self.original(*args, **kwargs)
            if output.total_num_scheduled_tokens:
                total[0] += pool.num_gpu_blocks - 1 - pool.get_num_free_blocks()
            return output

        s.schedule = schedule
        return total

    def __exit__(self, *exc) -> None:
        self.scheduler.schedule = self.original


def capacity_side(args) -> None:
    """One engine: every group at once, through ``generate``; one JSON row."""
    from vllm import SamplingParams

    total = args.groups * args.workers
    block_size = BLOCK_SIZE
    context = args.prompt_len + args.workers * args.max_tokens
    hogwild = args.kind != "stock"
    options = {"hogwild": {"kv": args.kind, "max_workers": args.workers}} if hogwild else {}
    llm = c.engine(args.model, max(context, min(4096, (args.blocks - 1) * block_size)), hogwild=hogwild,
                  max_num_seqs=total, num_gpu_blocks_override=args.blocks, block_size=block_size,
                  max_num_batched_tokens=4096, additional_config=options, kv_cache_dtype=args.kv_cache_dtype)
    stops = list(range(args.stop_every, 49152, args.stop_every))
    if args.protocol == "raw":
        prompts = [c.prompt(args.prompt_len, 70_000 + i) for i in range(args.groups)]
        params = [SamplingParams(n=args.workers, temperature=1.0, seed=i, max_tokens=args.max_tokens, ignore_eos=True,
                                 stop_token_ids=stops, extra_args={"hogwild": {"layout": "contiguous"}} if hogwild else None)
                  for i in range(args.groups)]
    else:  # one trunk and workers - 1 branch lanes; the prompt ends in a goal of as many parts: the fork starts at once
        parts = args.workers - 1
        prompts = [goal_prompt(parts, 70_000 + i, context=max(0, (args.prompt_len - 40) // 14)) for i in range(args.groups)]
        params = [SamplingParams(temperature=1.0, seed=i, max_tokens=args.max_tokens, stop_token_ids=stops,
                                 extra_args={"hogwild_protocol": args.protocol, "hogwild_max_branches": parts})
                  for i in range(args.groups)]
    with c.timing(c.scheduler_of(llm)) as spent, held_blocks(c.scheduler_of(llm)) as held:
        wall, outs = c.timed(llm, prompts, params)
    table = getattr(c.scheduler_of(llm), "table", None)
    lens = [len(c.token_ids) for o in outs for c in o.outputs]
    if args.protocol != "raw" and not all(o.outputs[0].hogwild["forked"] for o in outs):
        raise RuntimeError("a fork/join request of the workload did not fork")
    print(json.dumps({"kind": args.kind, "kv_cache_dtype": args.kv_cache_dtype, "blocks": args.blocks, "groups": args.groups, "workers": args.workers,
                      "max_tokens": args.max_tokens, "steps": spent["steps"], "block_steps": held[0], "wall_s": wall,
                      "mean_tokens": statistics.mean(lens), "max_tokens_seen": max(lens),
                      "group_preemptions": None if table is None else table.stats.num_group_preemptions,
                      "replayed_tokens": None if table is None else table.stats.num_replayed_tokens,
                      "generated_tokens": sum(lens)}), flush=True)


