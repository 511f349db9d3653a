"""``decode``, ``recompute`` and ``overhead``: decode speed, the re-prefill alternative, the scheduler's time."""

from __future__ import annotations

import json
import math
import statistics
import time

from . import common as c


# -- decode -------------------------------------------------------------------


def median_known(values: list[float]) -> float:
    """The median of the values that are not nan (unknown); nan when none is known."""
    known = [v for v in values if not math.isnan(v)]
    return statistics.median(known) if known else math.nan


def decode(llm, args) -> dict:
    scheduler = c.scheduler_of(llm)
    bs = llm.llm_engine.vllm_config.cache_config.block_size
    results, salt = [], 0
    for n in args.workers:
        for p in args.prompt_lens:
            times: dict[str, list[float]] = {"stock": [], "hogwild": []}
            for r in range(args.rounds):
                for kind in ("stock", "hogwild"):
                    hogwild = {"layout": "contiguous"} if kind == "hogwild" else None
                    # Decode time: a whole run less a run of its first token alone, the two in turn (the whole
                    # run first in even rounds, second in odd ones). With few tokens the two differ by
                    # milliseconds, and a hiccup of the machine in the short run can make the difference
                    # negative: such a pair is measured again (up to 3 times), else it counts as unknown (nan),
                    # never as a negative rate, and the median leaves it out.
                    for _attempt in range(3):
                        runs = {}
                        for max_tokens in (args.max_tokens, 1) if r % 2 == 0 else (1, args.max_tokens):
                            salt += 1
                            runs[max_tokens], _ = c.timed(llm, [c.prompt(p, salt)],
                                                          c.params(n, max_tokens, salt, hogwild))
                            if kind == "hogwild" and max_tokens == args.max_tokens:
                                group = scheduler.table.stats.ended[-1]
                        full, first = runs[args.max_tokens], runs[1]
                        if full > first:
                            break
                        print(f"decode: {kind} N={n} prompt {p}: the whole run ({full:.4f} s) took no longer than "
                              f"its first token alone ({first:.4f} s); measuring again", flush=True)
                    times[kind].append(full - first if full > first else math.nan)
            tps = {k: n * (args.max_tokens - 1) / median_known(v) for k, v in times.items()}
            view = p + sum(length - p for length in group.lane_lens)  # every worker's final view
            copies = n * -(-view // bs)
            row = {
                "workers": n, "prompt_len": p, "max_tokens": args.max_tokens,
                "stock_decode_tok_s": tps["stock"], "hogwild_decode_tok_s": tps["hogwild"],
                "ratio": tps["hogwild"] / tps["stock"],
                "prefill_tokens_per_group": group.num_prefill_tokens,
                "kv_blocks_group": group.num_blocks_owned, "kv_blocks_copies": copies,
                "memory_ratio": copies / group.num_blocks_owned,
            }
            results.append(row)
            print(json.dumps(row), flush=True)
    return {"benchmark": "decode", "block_size": bs, "dtype": str(llm.llm_engine.vllm_config.model_config.dtype),
            "attention": c.attention_of(llm), "machine": c.machine(), "results": results}


# -- recompute ----------------------------------------------------------------


def recompute(llm, args) -> dict:
    results, salt = [], 10_000
    for n in args.workers:
        for p in args.prompt_lens:
            salt += 1
            prompt = c.prompt(p, salt)["prompt_token_ids"]
            t_hogwild, _ = c.timed(llm, [{"prompt_token_ids": prompt}],
                                  c.params(n, args.max_tokens, salt, {"layout": "contiguous"}))
            for k in args.every:
                salt += 1
                prompt = c.prompt(p, salt)["prompt_token_ids"]  # fresh: no cache shared with other runs
                texts: list[list[int]] = [[] for _ in range(n)]
                rounds, t0 = 0, time.perf_counter()
                while len(texts[0]) < args.max_tokens:
                    m = min(k, args.max_tokens - len(texts[0]))
                    views = [{"prompt_token_ids": prompt + [t for o in range(n) if o != w for t in texts[o]]
                              + texts[w]} for w in range(n)]
                    outs = llm.generate(views, [c.params(1, m, salt * 100 + w, None) for w in range(n)],
                                        use_tqdm=False)
                    for w, out in enumerate(outs):
                        texts[w] += list(out.outputs[0].token_ids)
                    rounds += 1
                t_recompute = time.perf_counter() - t0
                row = {"workers": n, "prompt_len": p, "max_tokens": args.max_tokens, "every": k,
                       "rounds": rounds, "hogwild_s": t_hogwild, "recompute_s": t_recompute,
                       "hogwild_speedup": t_recompute / t_hogwild}
                results.append(row)
                print(json.dumps(row), flush=True)
    return {"benchmark": "recompute", "results": results}



# -- scheduler overhead --------------------------------------------------------



def overhead(llm, args) -> dict:
    """Each side in its own process: for each round, a stock engine's runs, then a Hogwild engine's
    (``--repeats`` runs of each load per process, each a row); medians over every row."""
    results = []
    for _ in range(args.rounds):
        for kind in ("stock", "hogwild"):
            argv = ["overhead-side", "--kind", kind,
                    "--groups", *map(str, args.groups), "--workers", str(args.workers), "--plain", str(args.plain),
                    "--prompt-len", str(args.prompt_len), "--max-tokens", str(args.max_tokens),
                    "--repeats", str(args.repeats)]
            if args.model:
                argv += ["--model", args.model]
            results += c.side_rows(argv, len(args.groups) * args.repeats, f"overhead {kind} run")
    results.sort(key=lambda r: (r["groups"], r["kind"] != "stock"))
    per_step = {}
    for groups in args.groups:
        for kind in ("stock", "hogwild"):
            per_step[f"{kind} {groups}"] = statistics.median(
                r["schedule_ms_per_step"] + r["update_ms_per_step"] for r in results
                if r["kind"] == kind and r["groups"] == groups)
    ratios = {g: per_step[f"hogwild {g}"] / per_step[f"stock {g}"] for g in args.groups}
    steady = {f"{kind} {g}": statistics.median(r["steady_step_ms"] for r in results
                                               if r["kind"] == kind and r["groups"] == g)
              for g in args.groups for kind in ("stock", "hogwild")}
    # The plugin's own code over stock's step, measured inside one engine (no noise between processes): the
    # Hogwild scheduler's time beyond vLLM's own calls, against the stock engine's whole step.
    own = {g: statistics.median(r["own_ms_per_step"] for r in results if r["kind"] == "hogwild" and r["groups"] == g)
           for g in args.groups}
    return {"benchmark": "overhead", "results": results, "ms_per_step": per_step, "ratio": ratios,
            "steady_ms_per_step": steady,
            "steady_ratio": {g: steady[f"hogwild {g}"] / steady[f"stock {g}"] for g in args.groups},
            "own_ratio": {g: 1 + own[g] / per_step[f"stock {g}"] for g in args.groups}}


def overhead_blocks(groups: int, workers: int, plain: int, prompt_len: int, max_tokens: int, max_model_len: int,
                    block_size: int = 128) -> int:
    """KV blocks for every sequence of ``bench overhead`` at once, with no pressure on either side: a group's (or
    a stock ``n=N`` request's) prompt's full blocks once (prefix caching shares them), each worker's tail and
    text its own, each plain request whole; and two blocks more a sequence, so that the pool never runs short of
    what a step may ask (one block a decoding sequence: below that the Hogwild scheduler counts each one's need,
    work a stock engine never does); at least one whole context (vLLM wants one, and keeps a block)."""
    whole = -(-(prompt_len + max_tokens) // block_size)
    shared = prompt_len // block_size
    need = groups * (shared + workers * (whole - shared)) + plain * whole
    return max(need + 2 * (groups * workers + plain) + 16, max_model_len // block_size + 2)


def overhead_side(args) -> None:
    """One engine (``--kind stock``: no plugin switch, vLLM's own scheduler) through every point; a JSON row each."""
    from vllm import SamplingParams

    total = max(args.groups) * args.workers + args.plain
    max_model_len = max(4096, -(-(args.prompt_len + args.max_tokens) // 128) * 128)
    blocks = overhead_blocks(max(args.groups), args.workers, args.plain, args.prompt_len, args.max_tokens,
                             max_model_len)
    c.check_kv_room(args.model, blocks, 128, "bench overhead",
                    "fewer --groups or --plain, a shorter --prompt-len or --max-tokens, or --model tiny")
    llm = c.engine(args.model, max_model_len, hogwild=args.kind == "hogwild", max_num_seqs=total, block_size=128,
                  num_gpu_blocks_override=blocks, max_num_batched_tokens=max(4096, total * args.prompt_len))
    hogwild = {"layout": "contiguous"} if args.kind == "hogwild" else None
    # Warm up: the first run of an engine pays one-time costs (first calls, allocations) on either side.
    warm = [c.prompt(args.prompt_len, 10 ** 6 + i) for i in range(8)]
    llm.generate(warm, [c.params(args.workers, 4, i, hogwild) for i in range(4)]
                 + [SamplingParams(max_tokens=4, seed=i, ignore_eos=True) for i in range(4)], use_tqdm=False)
    for k, groups, rep in [(k, g, rep) for k, g in enumerate(args.groups) for rep in range(args.repeats)]:
        prompts = [c.prompt(args.prompt_len, 50_000 * (k + 1) + 1_000 * rep + i) for i in range(groups + args.plain)]
        params = [c.params(args.workers, args.max_tokens, i, hogwild) for i in range(groups)]
        params += [SamplingParams(max_tokens=args.max_tokens, seed=i, ignore_eos=True) for i in range(args.plain)]
        with c.vllm_timing() as vllm_spent, c.timing(c.scheduler_of(llm)) as spent:
            wall, _ = c.timed(llm, prompts, params)
        # Every sequence starts in the first step and ends in the last: those two carry the admissions and the
        # ends; the steps between are the steady decode steps (their median: one step's cost).
        each = [1e3 * (s + u) for s, u in zip(spent["schedule_each"], spent["update_each"])]
        # The scheduler's own code: its time beyond vLLM's own two calls (stock: the timers' own cost alone).
        own = [e - 1e3 * (s + u) for e, s, u in zip(each, vllm_spent["schedule_each"], vllm_spent["update_each"])]
        print(json.dumps({"kind": args.kind, "groups": groups, "workers": args.workers, "plain": args.plain,
                          "sequences": groups * args.workers + args.plain, "steps": spent["steps"],
                          "schedule_ms_per_step": 1e3 * spent["schedule"] / spent["steps"],
                          "update_ms_per_step": 1e3 * spent["update"] / spent["steps"],
                          "first_step_ms": each[0], "last_step_ms": each[-1],
                          "steady_step_ms": statistics.median(each[1:-1] or each),
                          "own_ms_per_step": sum(own) / len(own), "own_steady_ms": statistics.median(own[1:-1] or own),
                          "wall_s": wall}), flush=True)


