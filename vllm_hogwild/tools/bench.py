"""Benchmarks against stock vLLM and the alternatives, measured side by side in one engine.

    python -m vllm_hogwild.tools.bench decode    [--workers 2 4 8] [--prompt-lens 200 1500] [--max-tokens 128] [--rounds 2]
    python -m vllm_hogwild.tools.bench recompute [--workers 2 4] [--prompt-lens 1000] [--max-tokens 64] [--every 1 16 64]
    python -m vllm_hogwild.tools.bench overhead  [--groups 64] [--workers 4] [--plain 64] [--max-tokens 16]
    python -m vllm_hogwild.tools.bench answer    [--workers 1 2 4 8] [--tasks 64] [--seed 0]
                                                 [--layouts contiguous isolated interleaved]
    python -m vllm_hogwild.tools.bench speculative [--workers 2 4] [--temperatures 0.1 0.7] [--methods ngram draft]
                                                   [--items 40] [--max-tokens 160] [--rounds 2]
    python -m vllm_hogwild.tools.bench verify    [--workers 2] [--temperature 0.1] [--items 40] [--max-tokens 160]
    python -m vllm_hogwild.tools.bench split     [--workers 8] [--prompt-len 1500] [--max-tokens 128] [--dtype float32]
                                                   [--compiled]
    python -m vllm_hogwild.tools.bench capacity  [--groups 16] [--workers 4] [--max-tokens 448] [--blocks 2000 96 64 48]
                                                 [--protocol raw|multiverse]
    python -m vllm_hogwild.tools.bench forkjoin  [--parts 2 4 8] [--requests 2] [--max-tokens 48] [--rounds 2]
    (each: [--model DIR] [--json OUT.json] [--plot OUT.png])

- ``decode``: decode tokens/s of a Hogwild group of N workers vs stock ``n=N``
  sampling of the same prompt. Decode time is a run's wall time minus the
  wall time of the same request with ``max_tokens=1`` (prefill and first
  token), so both sides pay the same prefill. Runs alternate stock and
  Hogwild with fresh prompts (no prefix-cache reuse between runs); medians.
  Also the KV memory: the blocks the group held at its end (from the
  scheduler) against N independent copies of the final view, which is what N
  sequences that each carry the whole shared text would hold.
- ``recompute``: the alternative to a shared cache: N independent sequences,
  each re-prefilling its co-workers' new text every K tokens (its prompt is
  the contiguous view ``[prompt][co-workers' text][own text]``; vLLM's prefix
  cache reuses what did not move). Whole wall time of N x T tokens, prefill
  included, against one Hogwild group (contiguous layout) making the same.
- ``overhead``: scheduler time per engine step (``schedule`` plus
  ``update_from_output``) with G Hogwild groups of N workers and P plain
  requests in a Hogwild engine, against the same load as stock ``n=N``
  requests in a stock engine (vLLM's own scheduler, no plugin switch), for
  each G of ``--groups``; every sequence runs at once (``max_num_seqs`` and
  the KV cache are set to fit them), rounds alternate the two engines. ``--model tiny`` uses a
  tiny random model: the scheduler's work does not depend on the model.
- ``answer``: time to a correct answer with the trained collaborator
  (``vllm_hogwild/tools/bench_answer.py``): Roman numerals for 12 to 24 listed
  numbers, N workers in raw mode, accuracy, mean sequential steps and
  duplicated items per layout, with two controls (``isolated``: nobody sees a
  claim; ``interleaved``: claims are seen only once an entry is finished), a
  computed fixed split, and the planner's wall-clock model fitted on N=1 and
  N=2 against the other N.
- ``speculative``: speculative decoding inside Hogwild groups, on a workload
  where n-gram lookup accepts well: every worker copies a numbered list from
  the prompt and goes on with it. For each N and temperature, four
  configurations on the same prompts: stock ``n=N``, stock ``n=N`` with
  speculation, a Hogwild group, a Hogwild group with speculation. One engine
  without ``speculative_config``, then one per method: a draft model (the
  model as its own draft: the mechanics, at a target's cost per draft token)
  and n-gram lookup (plain requests in a Hogwild engine run exactly as in
  stock vLLM). Per configuration: engine steps, tokens per step, wall time
  (medians over rounds) and the acceptance rate. The summary gives each
  speedup over stock ``n=N`` in wall time, speculation's and Hogwild's, and
  the two together against their product. A greedy stock ``n=1`` request per
  engine is the reference. On the CPU the plugin's worker first fixes vLLM
  0.32's rejection sampler (``vllm_hogwild/runner/cpu_sampling.py``); the
  stock rows run in the same Hogwild engine, so they get the fix too.
- ``verify``: where a speculative step's time goes: milliseconds per engine
  step of stock ``n=N`` and of a Hogwild group, with n-gram speculation on the
  ``speculative`` workload, split into the model forward (and within it the
  native and the segment attention), the segment plan, the sampler and the
  drafting; the group twice, its verify rows on the compiled CPU op and on
  the block buckets (where every step with a multi-token row went before).
  Timed by wrapping those functions in the engine's process (the worker runs
  in-process here).
- ``split``: where a decode step's time goes, stock ``n=N`` against a Hogwild
  group of N (the ``decode`` workload at one N and prompt length): milliseconds
  per decode step for the weights and the rest of the model, the native
  attention (plain rows, and the Hogwild rows' K/V writes), the segment
  attention, the plan, the runner's Python, sampling and the scheduler; a
  run's parts minus those of its ``max_tokens=1`` twin, over the decode steps.
  Timed like ``verify``.
- ``capacity``: many groups with long budgets whose workers mostly stop early
  (at one of a few stop tokens, the reasoning-serving case), all submitted at
  once, in KV caches of decreasing size (``num_gpu_blocks_override``, block
  size 128): Hogwild with ``kv: on-demand`` (lanes take blocks as they grow,
  groups preempted whole and resumed by exact replay), Hogwild with ``kv:
  reserve`` (every lane's whole budget at admission) and stock ``n=N``
  sampling of the same prompts (no plugin switch). Engine steps, wall time,
  groups preempted and tokens replayed, and each configuration's steps against
  its own with the largest cache. Every configuration is an engine of its own,
  in its own process; ``--model tiny`` (the default here) keeps the steps cheap.
  ``--protocol multiverse``: the groups are fork/join requests instead (a
  trunk and ``--workers - 1`` branch lanes, the prompt ending in a goal of as
  many parts, every sequence stopping at the same stop tokens), on-demand and
  reserve only (a stock engine has no fork).
- ``forkjoin``: a fork-heavy workload: requests whose prompts end in a
  Multiverse goal of 2, 4 or 8 outlines (the fork starts at once), each
  branch ending at ``--branch-end``. Three sides in one engine, the last two
  with the fork/join run's own token counts (``ignore_eos``) and prompts
  salted apart: fork/join in the plugin; the same tokens decoded one after
  another by one plain request (an engine without branches); the branches as
  plain requests side by side, then the join as one request that re-prefills
  them (an engine with a prefix cache only). Sequential decode steps (per
  request), engine steps, prompt tokens the engine computed, wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time


def _engine(model: str | None, max_model_len: int, hogwild: bool = True, dtype: str = "float32",
            enforce_eager: bool = True, **kw):
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the scheduler's stats are read in-process
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
    from vllm import LLM

    from vllm_hogwild.tools.default_model import prepare
    from vllm_hogwild.tools.tiny_model import build_tiny_llama

    # A prompt is prefilled in one step: vLLM 0.32 on CPU fails a seeded request whose prefill is
    # chunked in a stock engine (it rewinds the request's CPU generator, which has no offset).
    kw.setdefault("max_num_batched_tokens", max(max_model_len, 4096))
    model = str(build_tiny_llama()) if model == "tiny" else model or str(prepare())
    kw.setdefault("additional_config", {"hogwild": {}} if hogwild else {})
    return LLM(model=model, dtype=dtype, enforce_eager=enforce_eager, seed=0, max_model_len=max_model_len, **kw)


def _scheduler(llm):
    return llm.llm_engine.engine_core.engine_core.scheduler


def _prompt(length: int, salt: int) -> dict:
    # Distinct token ids per run: nothing is served from the prefix cache.
    return {"prompt_token_ids": [(1000 + 7919 * salt + 31 * i) % 40000 + 100 for i in range(length)]}


def _timed(llm, prompts, params) -> tuple[float, list]:
    t = time.perf_counter()
    out = llm.generate(prompts, params, use_tqdm=False)
    return time.perf_counter() - t, out


def _params(n: int, max_tokens: int, seed: int, hogwild: dict | None):
    from vllm import SamplingParams

    return SamplingParams(n=n, temperature=1.0, seed=seed, max_tokens=max_tokens, ignore_eos=True,
                          extra_args={"hogwild": hogwild} if hogwild is not None else None)


# -- speculative --------------------------------------------------------------

FRUITS = ("apple banana cherry date elderberry fig grape honeydew kiwi lemon mango nectarine orange papaya "
          "quince raspberry strawberry tangerine ugli vanilla watermelon yam zucchini apricot blueberry "
          "cantaloupe dragonfruit gooseberry guava jackfruit lime lychee mulberry olive peach pear plum "
          "pomegranate starfruit tomato").split()


def list_prompt(items: int, salt: int) -> str:
    rng = random.Random(salt)
    names = [rng.choice(FRUITS) + f" {rng.randint(10, 99)}" for _ in range(items)]
    listing = "\n".join(f"{i + 1}. {name}" for i, name in enumerate(names))
    return f"Here is a list.\n{listing}\n\nThe same list, copied exactly:\n1."


def _count_steps(llm) -> list[int]:
    """Engine steps that ran tokens, counted from now (the scheduler's ``schedule`` wrapped on the instance)."""
    scheduler, counter = _scheduler(llm), [0]
    original = scheduler.schedule

    def schedule(*args, **kwargs):
        output = original(*args, **kwargs)
        counter[0] += bool(output.total_num_scheduled_tokens)
        return output

    scheduler.schedule = schedule
    return counter


def _spec_counts(llm) -> tuple[float, float]:
    values = {m.name: m.value for m in llm.get_metrics() if m.name in (
        "vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens")}
    return (values.get("vllm:spec_decode_num_draft_tokens", 0) or 0,
            values.get("vllm:spec_decode_num_accepted_tokens", 0) or 0)


SPEC_KINDS = ("stock", "hogwild")
SPEC_METHODS = {"ngram": "n-gram", "draft": "draft model"}


def _speculative_config(method: str | None, args, model: str) -> dict | None:
    if method is None:
        return None
    if method == "ngram":
        return {"method": "ngram", "num_speculative_tokens": args.num_spec, "prompt_lookup_min": 2,
                "prompt_lookup_max": 5}
    # the model as its own draft: every draft is what the target would sample greedily, so this shows
    # the mechanics (acceptance, tokens per step); the draft costs a target's forward pass per token
    return {"method": "draft_model", "model": model, "num_speculative_tokens": args.num_spec}


def speculative(llm, args) -> dict:
    """Stock ``n=N`` and a Hogwild group of N, each without and with speculation, for every N and temperature.

    Engines in order: none, the draft model, n-gram (once the n-gram proposer has loaded numba, vLLM 0.32 cannot
    start another engine in the same process: its CPU kernel-override scan trips on llvmlite objects)."""
    from vllm import SamplingParams

    from vllm_hogwild.scheduler.scheduler import HogwildScheduler  # noqa: F401  (the plugin is installed)
    from vllm_hogwild.tools.default_model import prepare
    from vllm_hogwild.tools.tiny_model import build_tiny_llama

    model = str(build_tiny_llama()) if args.model == "tiny" else args.model or str(prepare())
    length = max(2048, 16 * args.items + max(args.workers) * args.max_tokens + 64)
    methods = [None] + [m for m in ("draft", "ngram") if m in args.methods]
    rows = []
    for method in methods:
        what = f" + {SPEC_METHODS[method]}" if method else ""
        if llm is None:
            llm = _engine(model, length, speculative_config=_speculative_config(method, args, model),
                          disable_log_stats=False, block_size=32)
        steps = _count_steps(llm)
        llm.generate([list_prompt(4, salt=-1)], SamplingParams(max_tokens=8), use_tqdm=False)  # warm-up
        points = [(kind, n, t) for n in args.workers for t in args.temperatures for kind in SPEC_KINDS]
        points.append(("stock n=1 greedy", 1, 0.0))  # the reference: vLLM refuses n > 1 with greedy sampling
        for kind, n, temperature in points:
            walls, counts, tokens = [], [], []
            drafted0, accepted0 = _spec_counts(llm)
            for r in range(args.rounds):
                params = SamplingParams(n=n, temperature=temperature, seed=r, max_tokens=args.max_tokens,
                                        ignore_eos=True,
                                        extra_args={"hogwild": {"layout": "contiguous"}} if kind == "hogwild" else None)
                before = steps[0]
                wall, (out,) = _timed(llm, [list_prompt(args.items, salt=r)], params)
                walls.append(wall)
                counts.append(steps[0] - before)
                tokens.append(sum(len(c.token_ids) for c in out.outputs))
            drafted, accepted = (a - b for a, b in zip(_spec_counts(llm), (drafted0, accepted0)))
            row = {"config": kind + what, "kind": kind, "speculation": SPEC_METHODS.get(method), "workers": n,
                   "temperature": temperature, "max_tokens": args.max_tokens, "steps": statistics.median(counts),
                   "tokens_per_step": sum(tokens) / sum(counts), "wall_s": statistics.median(walls),
                   "acceptance": accepted / drafted if drafted else None}
            rows.append(row)
            print(json.dumps(row), flush=True)
        llm.llm_engine.engine_core.shutdown()
        llm = None
    return {"benchmark": "speculative", "results": rows, "summary": _speculative_summary(rows)}


def _speculative_summary(rows: list[dict]) -> list[dict]:
    """Per speculation method, N and temperature: the speedups over stock ``n=N`` (wall time), and whether they
    multiply: a Hogwild group with speculation against the product of speculation's on stock and Hogwild's."""
    at = {(r["kind"], r["speculation"], r["workers"], r["temperature"]): r for r in rows}
    summary = []
    for (kind, method, n, t), row in at.items():
        if kind != "hogwild" or method is None:
            continue
        stock, stock_spec, hog = at["stock", None, n, t], at["stock", method, n, t], at["hogwild", None, n, t]
        speculation, hogwild, both = (stock["wall_s"] / x["wall_s"] for x in (stock_spec, hog, row))
        summary.append({"speculation": method, "workers": n, "temperature": t,
                        "speculation_speedup": speculation, "hogwild_speedup": hogwild, "combined_speedup": both,
                        "vs_product": both / (speculation * hogwild),
                        "speculation_steps_ratio": stock["steps"] / stock_spec["steps"],
                        "combined_steps_ratio": stock["steps"] / row["steps"]})
    return summary


# -- verify: where a speculative step's time goes ------------------------------------------------------

# (part, module, qualified name): what is timed, in the engine's own process (the worker runs in-process here).
# "model forward" holds both attention parts; the plan is built before the forward, the sampler after it.
VERIFY_PARTS = (
    ("model forward", "vllm.v1.worker.gpu_model_runner", "GPUModelRunner._model_forward"),
    ("native attention", "vllm.v1.attention.backends.cpu_attn", "CPUAttentionBackendImpl.forward"),
    ("segment attention", "vllm_hogwild.attention.segment_attention", "run"),
    ("segment plan", "vllm_hogwild.attention.segment_attention", "plan"),
    ("sampler", "vllm.v1.worker.gpu_model_runner", "GPUModelRunner._sample"),
    ("drafting", "vllm.v1.worker.gpu_model_runner", "GPUModelRunner.propose_draft_token_ids"),
)
VERIFY_CONFIGS = ("stock", "hogwild", "hogwild, verify rows on the block buckets")


def _time_parts(totals: dict, parts=VERIFY_PARTS) -> None:
    """Wrap every target of ``parts`` (class or module attribute) to add its seconds to ``totals[part]``."""
    import importlib

    for part, module, name in parts:
        owner = importlib.import_module(module)
        *path, attr = name.split(".")
        for step in path:
            owner = getattr(owner, step)
        _time_attribute(owner, attr, part, totals)


def _time_attribute(owner, attr: str, part: str, totals: dict) -> None:
    """Replace ``owner.attr`` (a class's, a module's or an instance's) by a wrapper that adds its seconds to
    ``totals[part]``."""
    import functools

    original = getattr(owner, attr)

    @functools.wraps(original)
    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            totals[part] = totals.get(part, 0.0) + time.perf_counter() - start

    setattr(owner, attr, timed)


def verify(llm, args) -> dict:
    """Milliseconds per engine step, split by part, of stock ``n=N`` and a Hogwild group with n-gram speculation;
    the group once with its verify rows on the compiled op (one row per token) and once on the block buckets
    (where every step with a multi-token row went before)."""
    from vllm import SamplingParams

    from vllm_hogwild.attention import segment_attention as sa

    totals: dict[str, float] = {}
    _time_parts(totals)  # before the engine exists: the runner hook wraps the runner's methods as they are then
    length = max(2048, 16 * args.items + args.workers * args.max_tokens + 64)
    llm = _engine(args.model, length, disable_log_stats=False, block_size=32,
                  speculative_config={"method": "ngram", "num_speculative_tokens": args.num_spec,
                                      "prompt_lookup_min": 2, "prompt_lookup_max": 5})
    steps = _count_steps(llm)
    llm.generate([list_prompt(4, salt=-1)], SamplingParams(max_tokens=8), use_tqdm=False)  # warm-up
    rows, limit = [], sa.CPU_OP_MAX_ROW_TOKENS
    for config in VERIFY_CONFIGS:
        sa.CPU_OP_MAX_ROW_TOKENS = 1 if "buckets" in config else limit
        totals.clear()
        before, wall, tokens = steps[0], 0.0, 0
        drafted0, accepted0 = _spec_counts(llm)
        for r in range(args.rounds):
            params = SamplingParams(n=args.workers, temperature=args.temperature, seed=r, max_tokens=args.max_tokens,
                                    ignore_eos=True,
                                    extra_args=None if config == "stock" else {"hogwild": {"layout": "contiguous"}})
            seconds, (out,) = _timed(llm, [list_prompt(args.items, salt=r)], params)
            wall += seconds
            tokens += sum(len(c.token_ids) for c in out.outputs)
        count = steps[0] - before
        drafted, accepted = (a - b for a, b in zip(_spec_counts(llm), (drafted0, accepted0)))
        row = {"config": config, "workers": args.workers, "temperature": args.temperature, "steps": count,
               "tokens_per_step": tokens / count, "acceptance": accepted / drafted if drafted else None,
               "step_ms": 1e3 * wall / count,
               "parts_ms": {part: 1e3 * totals.get(part, 0.0) / count for part, _, _ in VERIFY_PARTS}}
        rows.append(row)
        print(json.dumps(row), flush=True)
    sa.CPU_OP_MAX_ROW_TOKENS = limit
    llm.llm_engine.engine_core.shutdown()
    return {"benchmark": "verify", "results": rows}


# -- split: where a decode step's time goes -----------------------------------------------------------

SPLIT_PARTS = (
    ("execute", "vllm.v1.worker.gpu_model_runner", "GPUModelRunner.execute_model"),
    ("model forward", "vllm.v1.worker.gpu_model_runner", "GPUModelRunner._model_forward"),
    ("native attention", "vllm.v1.attention.backends.cpu_attn", "CPUAttentionBackendImpl.forward"),
    ("segment attention", "vllm_hogwild.attention.segment_attention", "run"),
    ("segment plan", "vllm_hogwild.attention.segment_attention", "plan"),
    ("sample", "vllm.v1.worker.gpu_model_runner", "GPUModelRunner.sample_tokens"),
)
# What the split reports, in ms per decode step: each a sum of timed parts (+1) and (-1).
SPLIT_ROWS = (
    ("weights and the rest of the model", {"model forward": 1, "native attention": -1, "segment attention": -1}),
    ("native attention (plain rows; Hogwild rows' K/V writes)", {"native attention": 1}),
    ("segment attention (Hogwild rows)", {"segment attention": 1}),
    ("segment plan", {"segment plan": 1}),
    ("runner Python (inputs, runner hook, outputs)", {"execute": 1, "model forward": -1, "segment plan": -1}),
    ("sampling", {"sample": 1}),
    ("scheduler", {"schedule": 1, "update": 1}),
)


def _time_scheduler(llm, totals: dict) -> None:
    """The engine's own scheduler's ``schedule`` and ``update_from_output``, timed on the instance."""
    scheduler = _scheduler(llm)
    for part, name in (("schedule", "schedule"), ("update", "update_from_output")):
        _time_attribute(scheduler, name, part, totals)


def split(llm, args) -> dict:
    """Milliseconds per decode step of stock ``n=N`` and a Hogwild group, split by part (SPLIT_ROWS). A run's parts
    minus those of the same request with ``max_tokens=1`` (its prefill and first token), over ``max_tokens - 1``
    steps; runs alternate, medians over rounds."""
    totals: dict[str, float] = {}
    _time_parts(totals, SPLIT_PARTS)  # before the engine exists (the runner hook wraps the runner as it is then)
    length = max(2048, args.prompt_len + args.workers * args.max_tokens + 16)
    llm = _engine(args.model, length, dtype=args.dtype, enforce_eager=not args.compiled)
    _time_scheduler(llm, totals)
    steps = _count_steps(llm)
    samples: dict[str, list[dict]] = {"stock": [], "hogwild": []}
    salt = 50_000
    for _ in range(args.rounds):
        for kind in ("stock", "hogwild"):
            hogwild = {"layout": "contiguous"} if kind == "hogwild" else None
            parts = []
            for max_tokens in (args.max_tokens, 1):
                salt += 1
                totals.clear()
                before = steps[0]
                wall, _ = _timed(llm, [_prompt(args.prompt_len, salt)], _params(args.workers, max_tokens, salt, hogwild))
                parts.append({**totals, "wall": wall, "steps": steps[0] - before})
            full, first = parts
            decode_steps = full["steps"] - first["steps"]
            samples[kind].append({k: 1e3 * (full.get(k, 0.0) - first.get(k, 0.0)) / decode_steps
                                  for k in {*full, *first} if k != "steps"})
    rows = []
    for kind, runs in samples.items():
        per_step = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        split_ms = {name: sum(sign * per_step.get(part, 0.0) for part, sign in terms.items())
                    for name, terms in SPLIT_ROWS}
        split_ms["other (engine loop, output processing)"] = per_step["wall"] - sum(split_ms.values())
        row = {"kind": kind, "workers": args.workers, "prompt_len": args.prompt_len, "max_tokens": args.max_tokens,
               "dtype": args.dtype, "compiled": args.compiled, "step_ms": per_step["wall"], "split_ms": split_ms}
        rows.append(row)
        print(json.dumps(row), flush=True)
    attention = _attention_of(llm)
    llm.llm_engine.engine_core.shutdown()
    return {"benchmark": "split", "attention": attention, "machine": machine(), "results": rows}


# -- decode -------------------------------------------------------------------


def decode(llm, args) -> dict:
    scheduler = _scheduler(llm)
    bs = llm.llm_engine.vllm_config.cache_config.block_size
    results, salt = [], 0
    for n in args.workers:
        for p in args.prompt_lens:
            times: dict[str, list[float]] = {"stock": [], "hogwild": []}
            for _ in range(args.rounds):
                for kind in ("stock", "hogwild"):
                    hogwild = {"layout": "contiguous"} if kind == "hogwild" else None
                    salt += 1
                    full, _ = _timed(llm, [_prompt(p, salt)], _params(n, args.max_tokens, salt, hogwild))
                    if kind == "hogwild":
                        group = scheduler.table.stats.ended[-1]
                    salt += 1
                    first, _ = _timed(llm, [_prompt(p, salt)], _params(n, 1, salt, hogwild))
                    times[kind].append(full - first)
            tps = {k: n * (args.max_tokens - 1) / statistics.median(v) for k, v in times.items()}
            view = p + sum(length - p for length in group.lane_lens)  # every worker's final view
            copies = n * -(-view // bs)
            row = {
                "workers": n, "prompt_len": p, "max_tokens": args.max_tokens,
                "stock_decode_tok_s": tps["stock"], "hogwild_decode_tok_s": tps["hogwild"],
                "ratio": tps["hogwild"] / tps["stock"],
                "prefill_tokens_per_group": group.num_prefill_tokens,
                "kv_blocks_group": group.num_blocks_held, "kv_blocks_copies": copies,
                "memory_ratio": copies / group.num_blocks_held,
            }
            results.append(row)
            print(json.dumps(row), flush=True)
    return {"benchmark": "decode", "block_size": bs, "dtype": str(llm.llm_engine.vllm_config.model_config.dtype),
            "attention": _attention_of(llm), "machine": machine(), "results": results}


ISA_FLAGS = ("avx2", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16")


def machine() -> dict:
    """The CPU's model, core count and the vector-ISA flags that matter here (from /proc/cpuinfo)."""
    model, flags = "unknown", set()
    try:
        for line in open("/proc/cpuinfo"):
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    except OSError:
        pass
    return {"cpu": model, "cores": os.cpu_count(), "isa": [f for f in ISA_FLAGS if f in flags]}


def _attention_of(llm) -> str:
    """The engine's Hogwild attention path as its start-up line names it: ``cpu-op (avx512)``, ..."""
    from vllm_hogwild.attention.paths import describe

    return describe(llm.llm_engine.vllm_config.additional_config)


# -- recompute ----------------------------------------------------------------


def recompute(llm, args) -> dict:
    results, salt = [], 10_000
    for n in args.workers:
        for p in args.prompt_lens:
            salt += 1
            prompt = _prompt(p, salt)["prompt_token_ids"]
            t_hogwild, _ = _timed(llm, [{"prompt_token_ids": prompt}],
                                  _params(n, args.max_tokens, salt, {"layout": "contiguous"}))
            for k in args.every:
                salt += 1
                prompt = _prompt(p, salt)["prompt_token_ids"]  # fresh: no cache shared with other runs
                texts: list[list[int]] = [[] for _ in range(n)]
                rounds, t0 = 0, time.perf_counter()
                while len(texts[0]) < args.max_tokens:
                    m = min(k, args.max_tokens - len(texts[0]))
                    views = [{"prompt_token_ids": prompt + [t for o in range(n) if o != w for t in texts[o]]
                              + texts[w]} for w in range(n)]
                    outs = llm.generate(views, [_params(1, m, salt * 100 + w, None) for w in range(n)],
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


def _side_rows(argv: list[str], expected: int, what: str) -> list[dict]:
    """Run one side of a benchmark (``python -m vllm_hogwild.tools.bench <side> ...``) in a process of its own
    (two engines in one process share vLLM's global parallel state, and shutting one down breaks the other);
    its JSON rows, each printed as it comes."""
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-m", "vllm_hogwild.tools.bench", *argv], capture_output=True, text=True,
                         timeout=3600)
    rows = [json.loads(line) for line in run.stdout.splitlines() if line.startswith('{"kind"')]
    if run.returncode != 0 or len(rows) != expected:
        raise RuntimeError(f"{what} failed:\n{run.stdout[-2000:]}{run.stderr[-3000:]}")
    for row in rows:
        print(json.dumps(row), flush=True)
    return rows


def overhead(llm, args) -> dict:
    """Each side in its own process: for each round, a stock engine's run, then a Hogwild engine's."""
    results = []
    for _ in range(args.rounds):
        for kind in ("stock", "hogwild"):
            argv = ["overhead-side", "--kind", kind,
                    "--groups", *map(str, args.groups), "--workers", str(args.workers), "--plain", str(args.plain),
                    "--prompt-len", str(args.prompt_len), "--max-tokens", str(args.max_tokens)]
            if args.model:
                argv += ["--model", args.model]
            results += _side_rows(argv, len(args.groups), f"overhead {kind} run")
    results.sort(key=lambda r: (r["groups"], r["kind"] != "stock"))
    per_step = {}
    for groups in args.groups:
        for kind in ("stock", "hogwild"):
            per_step[f"{kind} {groups}"] = statistics.median(
                r["schedule_ms_per_step"] + r["update_ms_per_step"] for r in results
                if r["kind"] == kind and r["groups"] == groups)
    ratios = {g: per_step[f"hogwild {g}"] / per_step[f"stock {g}"] for g in args.groups}
    return {"benchmark": "overhead", "results": results, "ms_per_step": per_step, "ratio": ratios}


def overhead_side(args) -> None:
    """One engine (``--kind stock``: no plugin switch, vLLM's own scheduler) through every point; a JSON row each."""
    from vllm import SamplingParams

    total = max(args.groups) * args.workers + args.plain
    # Every sequence at once, in KV too, with room to spare (no preemption on either side); vLLM wants at
    # least one whole context in the cache (and it keeps one block for itself).
    max_model_len = 4096
    blocks = max(3 * total * -(-(args.prompt_len + args.max_tokens) // 128), max_model_len // 128 + 2)
    llm = _engine(args.model, max_model_len, hogwild=args.kind == "hogwild", max_num_seqs=total, block_size=128,
                  num_gpu_blocks_override=blocks, max_num_batched_tokens=max(4096, total * args.prompt_len))
    hogwild = {"layout": "contiguous"} if args.kind == "hogwild" else None
    # Warm up: the first run of an engine pays one-time costs (first calls, allocations) on either side.
    warm = [_prompt(args.prompt_len, 10 ** 6 + i) for i in range(8)]
    llm.generate(warm, [_params(args.workers, 4, i, hogwild) for i in range(4)]
                 + [SamplingParams(max_tokens=4, seed=i, ignore_eos=True) for i in range(4)], use_tqdm=False)
    for k, groups in enumerate(args.groups):
        prompts = [_prompt(args.prompt_len, 50_000 * (k + 1) + i) for i in range(groups + args.plain)]
        params = [_params(args.workers, args.max_tokens, i, hogwild) for i in range(groups)]
        params += [SamplingParams(max_tokens=args.max_tokens, seed=i, ignore_eos=True) for i in range(args.plain)]
        with _timing(_scheduler(llm)) as spent:
            wall, _ = _timed(llm, prompts, params)
        print(json.dumps({"kind": args.kind, "groups": groups, "workers": args.workers, "plain": args.plain,
                          "sequences": groups * args.workers + args.plain, "steps": spent["steps"],
                          "schedule_ms_per_step": 1e3 * spent["schedule"] / spent["steps"],
                          "update_ms_per_step": 1e3 * spent["update"] / spent["steps"], "wall_s": wall}), flush=True)


class _timing:
    """Time a scheduler's ``schedule`` and ``update_from_output`` (this instance) while in the block."""

    def __init__(self, scheduler) -> None:
        self.scheduler, self.spent = scheduler, {"schedule": 0.0, "update": 0.0, "steps": 0}

    def __enter__(self) -> dict:
        s, spent = self.scheduler, self.spent
        self.originals = (s.schedule, s.update_from_output)

        def timed(fn, key: str):
            def wrapper(*a, **kw):
                t = time.perf_counter()
                try:
                    return fn(*a, **kw)
                finally:
                    spent[key] += time.perf_counter() - t
                    spent["steps"] += key == "schedule"
            return wrapper

        s.schedule, s.update_from_output = timed(self.originals[0], "schedule"), timed(self.originals[1], "update")
        return spent

    def __exit__(self, *exc) -> None:
        self.scheduler.schedule, self.scheduler.update_from_output = self.originals


# -- time to answer ------------------------------------------------------------


def answer(llm, args) -> dict:
    from vllm_hogwild.tools import bench_answer

    report = bench_answer.answer(llm, args)
    report.update(machine=machine(), dtype="float32", attention=_attention_of(llm))
    return report


# -- capacity under a tight KV cache -------------------------------------------

CAPACITY_KINDS = ("stock", "on-demand", "reserve")


def capacity_kinds(protocol: str) -> tuple[str, ...]:
    """The configurations ``capacity`` compares: a stock engine has no fork, so fork/join runs Hogwild's only."""
    return CAPACITY_KINDS if protocol == "raw" else CAPACITY_KINDS[1:]


def capacity(llm, args) -> dict:
    """Each (KV size, configuration) in its own process; steps relative to the same configuration's at the
    largest size."""
    results = []
    for blocks in args.blocks:
        for kind in capacity_kinds(args.protocol):
            argv = ["capacity-side", "--kind", kind, "--protocol", args.protocol,
                    "--blocks", str(blocks), "--groups", str(args.groups), "--workers", str(args.workers),
                    "--max-tokens", str(args.max_tokens), "--prompt-len", str(args.prompt_len),
                    "--stop-every", str(args.stop_every), "--model", args.model or "tiny"]
            results += _side_rows(argv, 1, f"capacity {kind} {blocks}")
    largest = max(args.blocks)
    base = {r["kind"]: r["steps"] for r in results if r["blocks"] == largest}
    for r in results:
        r["steps_vs_largest"] = r["steps"] / base[r["kind"]]
    return {"benchmark": "capacity", "protocol": args.protocol, "results": results}


def capacity_side(args) -> None:
    """One engine: every group at once, through ``generate``; one JSON row."""
    from vllm import SamplingParams

    total = args.groups * args.workers
    block_size = 128
    context = args.prompt_len + args.workers * args.max_tokens
    hogwild = args.kind != "stock"
    options = {"hogwild": {"kv": args.kind, "max_workers": args.workers}} if hogwild else {}
    llm = _engine(args.model, max(context, min(4096, (args.blocks - 1) * block_size)), hogwild=hogwild,
                  max_num_seqs=total, num_gpu_blocks_override=args.blocks, block_size=block_size,
                  max_num_batched_tokens=4096, additional_config=options)
    stops = list(range(args.stop_every, 49152, args.stop_every))
    if args.protocol == "raw":
        prompts = [_prompt(args.prompt_len, 70_000 + i) for i in range(args.groups)]
        params = [SamplingParams(n=args.workers, temperature=1.0, seed=i, max_tokens=args.max_tokens, ignore_eos=True,
                                 stop_token_ids=stops, extra_args={"hogwild": {"layout": "contiguous"}} if hogwild else None)
                  for i in range(args.groups)]
    else:  # one trunk and workers - 1 branch lanes; the prompt ends in a goal of as many parts: the fork starts at once
        parts = args.workers - 1
        prompts = [goal_prompt(parts, 70_000 + i, context=max(0, (args.prompt_len - 40) // 14)) for i in range(args.groups)]
        params = [SamplingParams(temperature=1.0, seed=i, max_tokens=args.max_tokens, stop_token_ids=stops,
                                 extra_args={"hogwild_protocol": args.protocol, "hogwild_max_branches": parts})
                  for i in range(args.groups)]
    with _timing(_scheduler(llm)) as spent:
        wall, outs = _timed(llm, prompts, params)
    table = getattr(_scheduler(llm), "table", None)
    lens = [len(c.token_ids) for o in outs for c in o.outputs]
    if args.protocol != "raw" and not all(o.outputs[0].hogwild["forked"] for o in outs):
        raise RuntimeError("a fork/join request of the workload did not fork")
    print(json.dumps({"kind": args.kind, "blocks": args.blocks, "groups": args.groups, "workers": args.workers,
                      "max_tokens": args.max_tokens, "steps": spent["steps"], "wall_s": wall,
                      "mean_tokens": statistics.mean(lens), "max_tokens_seen": max(lens),
                      "group_preemptions": None if table is None else table.stats.num_group_preemptions,
                      "replayed_tokens": None if table is None else table.stats.num_replayed_tokens,
                      "generated_tokens": sum(lens)}), flush=True)


# -- output -------------------------------------------------------------------


def markdown(report: dict) -> str:
    kind = report["benchmark"]
    rows = report["results"]
    if kind == "decode":
        head = ("| N | prompt | new tokens | stock n=N tok/s | Hogwild tok/s | ratio | KV blocks: group | "
                "N copies of the view | memory ratio |")
        body = [f"| {r['workers']} | {r['prompt_len']} | {r['max_tokens']} | {r['stock_decode_tok_s']:.1f} | "
                f"{r['hogwild_decode_tok_s']:.1f} | {r['ratio']:.2f} | {r['kv_blocks_group']} | "
                f"{r['kv_blocks_copies']} | {r['memory_ratio']:.2f}x |" for r in rows]
    elif kind == "recompute":
        head = "| N | prompt | tokens per worker | K | rounds | Hogwild s | recompute s | Hogwild faster by |"
        body = [f"| {r['workers']} | {r['prompt_len']} | {r['max_tokens']} | {r['every']} | {r['rounds']} | "
                f"{r['hogwild_s']:.2f} | {r['recompute_s']:.2f} | {r['hogwild_speedup']:.2f}x |" for r in rows]
    elif kind == "overhead":
        head = "| engine: load | sequences | engine steps | schedule ms/step | update ms/step | total ms/step | wall s |"
        body = [f"| {r['kind']}: {r['groups']} x n={r['workers']} + {r['plain']} plain | {r['sequences']} | "
                f"{r['steps']} | {r['schedule_ms_per_step']:.2f} | {r['update_ms_per_step']:.2f} | "
                f"{r['schedule_ms_per_step'] + r['update_ms_per_step']:.2f} | {r['wall_s']:.1f} |" for r in rows]
        body += [f"| Hogwild / stock, {g} groups (medians) | | | | | {ratio:.2f}x | |"
                 for g, ratio in report["ratio"].items()]
    elif kind == "split":
        names = list(rows[0]["split_ms"])
        head = "| part, ms per decode step | " + " | ".join(
            f"{r['kind']} n={r['workers']}" for r in rows) + " |"
        body = [f"| {name} | " + " | ".join(f"{r['split_ms'][name]:.1f}" for r in rows) + " |" for name in names]
        body.append("| **step** | " + " | ".join(f"**{r['step_ms']:.1f}**" for r in rows) + " |")
        if len(rows) == 2:
            body.append(f"| Hogwild / stock (per token: stock step / Hogwild step) | | "
                        f"{rows[0]['step_ms'] / rows[1]['step_ms']:.2f}x |")
    elif kind == "verify":
        parts = [part for part, _, _ in VERIFY_PARTS]
        head = "| configuration | N | engine steps | tokens per step | acceptance | ms per step | " + " | ".join(
            f"{p} ms" for p in parts) + " |"
        body = [f"| {r['config']} | {r['workers']} | {r['steps']} | {r['tokens_per_step']:.2f} | "
                f"{'-' if r['acceptance'] is None else format(r['acceptance'], '.2f')} | {r['step_ms']:.1f} | "
                + " | ".join(f"{r['parts_ms'][p]:.1f}" for p in parts) + " |" for r in rows]
    elif kind == "speculative":
        head = ("| configuration | N | temperature | engine steps | tokens per step | wall s | acceptance |")
        body = [f"| {r['config']} | {r['workers']} | {r['temperature']:g} | {r['steps']:.0f} | "
                f"{r['tokens_per_step']:.2f} | {r['wall_s']:.2f} | "
                f"{'-' if r['acceptance'] is None else format(r['acceptance'], '.2f')} |" for r in rows]
        body += ["", "| speculation | N | temperature | speculation on stock | Hogwild over stock | both | "
                 "both / product | steps: speculation on stock, both |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
        body += [f"| {s['speculation']} | {s['workers']} | {s['temperature']:g} | {s['speculation_speedup']:.2f}x | "
                 f"{s['hogwild_speedup']:.2f}x | {s['combined_speedup']:.2f}x | {s['vs_product']:.2f} | "
                 f"{s['speculation_steps_ratio']:.2f}x, {s['combined_steps_ratio']:.2f}x |" for s in report["summary"]]
    elif kind == "capacity":
        head = ("| KV blocks (x128 tokens) | configuration | engine steps | steps vs largest cache | wall s | "
                "groups preempted | tokens replayed / generated |")
        body = [f"| {r['blocks']} | {r['kind']} | {r['steps']} | {r['steps_vs_largest']:.2f}x | {r['wall_s']:.2f} | "
                f"{_or_dash(r['group_preemptions'])} | {_replayed(r)} |" for r in rows]
    elif kind == "forkjoin":
        head = ("| outlines | side | tokens per request | sequential decode steps | engine steps | prefilled tokens | "
                "wall s | wall vs fork/join |")
        body = [f"| {r['parts']} | {r['side']} | {r['tokens']:.0f} | {r['sequential_steps']:.0f} | "
                f"{r['engine_steps']:.0f} | {r['prefilled_tokens']:.0f} | {r['wall_s']:.2f} | "
                f"{r['wall_vs_forkjoin']:.2f}x |" for r in report["summary"]]
    else:
        from vllm_hogwild.tools import bench_answer

        return bench_answer.markdown(report)
    sep = "|" + "|".join("---:" for _ in range(head.count("|") - 1)) + "|"
    return "\n".join([head, sep, *body])


def _or_dash(value) -> str:
    return "-" if value is None else str(value)


def _replayed(row: dict) -> str:
    if row["replayed_tokens"] is None:
        return "-"
    return f"{row['replayed_tokens']} / {row['generated_tokens']}"


def plot(report: dict, path: str) -> None:
    """One PNG per report (matplotlib, no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kind, rows = report["benchmark"], report["results"]
    fig, ax = plt.subplots(figsize=(6, 4))
    if kind == "decode":
        for p in sorted({r["prompt_len"] for r in rows}):
            pts = [r for r in rows if r["prompt_len"] == p]
            ax.plot([r["workers"] for r in pts], [r["ratio"] for r in pts], "o-", label=f"prompt {p}")
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set(xlabel="workers N", ylabel="Hogwild / stock n=N decode tok/s", title="Decode throughput")
    elif kind == "recompute":
        for n in sorted({r["workers"] for r in rows}):
            pts = [r for r in rows if r["workers"] == n]
            ax.plot([r["every"] for r in pts], [r["hogwild_speedup"] for r in pts], "o-", label=f"N={n}")
        ax.set_xscale("log", base=2)
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set(xlabel="recompute every K tokens", ylabel="recompute time / Hogwild time",
               title="Shared cache vs re-prefilling co-workers' text")
    elif kind == "overhead":
        for k in ("stock", "hogwild"):
            pts = [r for r in rows if r["kind"] == k]
            ax.plot([r["sequences"] for r in pts], [r["schedule_ms_per_step"] + r["update_ms_per_step"] for r in pts],
                    "o", label=k)
        ax.set(xlabel="sequences running", ylabel="scheduler ms per engine step", title="Scheduler time per step")
    elif kind == "capacity":
        for k in dict.fromkeys(r["kind"] for r in rows):
            pts = sorted((r for r in rows if r["kind"] == k), key=lambda r: r["blocks"])
            ax.plot([r["blocks"] for r in pts], [r["steps_vs_largest"] for r in pts], "o-", label=k)
        ax.set_xscale("log", base=2)
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set(xlabel="KV blocks", ylabel="engine steps / own steps with the largest cache",
               title="Capacity under a tight cache")
    elif kind == "split":
        bottom = [0.0] * len(rows)
        for name in rows[0]["split_ms"]:
            values = [r["split_ms"][name] for r in rows]
            ax.bar([f"{r['kind']} n={r['workers']}" for r in rows], values, bottom=bottom, label=name)
            bottom = [b + v for b, v in zip(bottom, values)]
        ax.set(ylabel="ms per decode step", title="A decode step, by part")
    elif kind == "verify":
        bottom = [0.0] * len(rows)
        for part in ("segment plan", "model forward", "sampler", "drafting"):
            values = [r["parts_ms"][part] for r in rows]
            ax.bar([r["config"] for r in rows], values, bottom=bottom, label=part)
            bottom = [b + v for b, v in zip(bottom, values)]
        ax.set(ylabel="ms per engine step", title="A speculative step, by part")
        ax.tick_params(axis="x", labelrotation=15)
    elif kind == "forkjoin":
        summary = report["summary"]
        for side in FORKJOIN_SIDES:
            pts = [r for r in summary if r["side"] == side]
            ax.plot([r["parts"] for r in pts], [r["sequential_steps"] for r in pts], "o-", label=side)
        ax.set(xlabel="outlines per goal (branches)", ylabel="sequential decode steps per request",
               title="Fork/join vs sequential decoding and re-prefilled joins")
    elif kind == "speculative":
        ax.bar([f"{r['config']} N={r['workers']} t={r['temperature']:g}" for r in rows],
               [r["tokens_per_step"] for r in rows], label="tokens per engine step")
        ax.tick_params(axis="x", labelrotation=90)
        ax.set(ylabel="tokens per engine step", title="Speculative decoding, stock and Hogwild")
    else:
        from vllm_hogwild.tools import bench_answer

        bench_answer.plot(report, ax)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# -- fork/join ------------------------------------------------------------------

FORKJOIN_SIDES = ("fork/join", "sequential", "re-prefill join")


def goal_prompt(parts: int, salt: int, context: int = 0) -> str:
    """A prompt that ends in a Multiverse goal of ``parts`` outlines (the fork starts at once), after
    ``context`` numbered facts (the problem and the reasoning before the goal)."""
    facts = "".join(f"Fact {i}: item {i} weighs {(salt + 7 * i) % 90 + 10} grams.\n" for i in range(context))
    outlines = "".join(f"<Outline>\n{i}: case {i} of {parts}</Outline>\n" for i in range(1, parts + 1))
    return (f"Request {salt}.\n{facts}Check every case of the claim, each on its own, then conclude.\n"
            f"<Parallel>\n<Goal>\n{outlines}</Goal>")


def _count_prefill(llm) -> list[int]:
    """Prompt tokens the engine computed, counted from now (prefix-cache hits are not computed)."""
    scheduler, counter = _scheduler(llm), [0]
    original = scheduler.schedule

    def schedule(*args, **kwargs):
        output = original(*args, **kwargs)
        for request_id, n in output.num_scheduled_tokens.items():
            request = scheduler.requests.get(request_id)
            if request is not None:
                before = request.num_computed_tokens - n
                counter[0] += max(0, min(n, request.num_prompt_tokens - before))
        return output

    scheduler.schedule = schedule
    return counter


def forkjoin(llm, args) -> dict:
    """Fork/join in the plugin against the same token streams decoded one after another, and against a join
    that re-prefills the branches (an engine with a prefix cache only). One engine; the other sides' token
    counts are the fork/join run's (``ignore_eos``), their prompts salted apart (no prefix-cache reuse)."""
    from vllm import SamplingParams

    tokenizer = llm.get_tokenizer()
    steps, prefill = _count_steps(llm), _count_prefill(llm)
    results = []

    def measure(prompts, params) -> tuple[float, int, int, list]:
        s0, p0 = steps[0], prefill[0]
        wall, outs = _timed(llm, prompts, params)
        return wall, steps[0] - s0, prefill[0] - p0, outs

    fork = {"hogwild_protocol": "multiverse", "hogwild_branch_end": args.branch_end}
    for parts in args.parts:
        for rnd in range(args.rounds):
            salt = 1000 * parts + 10 * rnd
            prompts = [goal_prompt(parts, salt + i, args.context) for i in range(args.requests)]
            fj = SamplingParams(n=1, temperature=args.temperature, seed=salt, max_tokens=args.max_tokens,
                                extra_args={**fork, "hogwild_max_branches": parts})
            wall, n_steps, n_prefill, outs = measure(prompts, [fj] * len(prompts))
            trees = [o.outputs[0].hogwild for o in outs]
            if not all(t["forked"] for t in trees):
                raise RuntimeError("a fork/join request of the workload did not fork")
            rows = {"fork/join": (wall, n_steps, n_prefill, statistics.mean(t["sequential_steps"] for t in trees))}
            # The same token streams, one after another: one plain request per request, as long as the document.
            seq = [goal_prompt(parts, salt + 500 + i, args.context) for i in range(len(prompts))]
            sp = [SamplingParams(temperature=args.temperature, seed=salt, max_tokens=t["num_tokens"], ignore_eos=True)
                  for t in trees]
            wall, n_steps, n_prefill, _ = measure(seq, sp)
            rows["sequential"] = (wall, n_steps, n_prefill, statistics.mean(t["num_tokens"] for t in trees))
            # Branches as plain requests side by side, then the join re-prefills them.
            stage1, sp1 = [], []
            for i, tree in enumerate(trees):
                base = goal_prompt(parts, salt + 700 + i, args.context)
                for b in tree["branches"]:
                    header = "\n<Path>\n" + b["branch"] + ":"
                    n_header = len(tokenizer.encode(header, add_special_tokens=False))
                    stage1.append(base + header)
                    sp1.append(SamplingParams(temperature=args.temperature, seed=salt, ignore_eos=True,
                                              max_tokens=max(1, b["num_tokens"] - n_header)))
            w1, s1, f1, _ = measure(stage1, sp1)
            stage2 = [goal_prompt(parts, salt + 700 + i, args.context) + "".join(b["text"] for b in t["branches"]) + "<Conclusion>\n"
                      for i, t in enumerate(trees)]
            n_join = len(tokenizer.encode("<Conclusion>\n", add_special_tokens=False))
            sp2 = [SamplingParams(temperature=args.temperature, seed=salt, ignore_eos=True,
                                  max_tokens=max(1, t["trunk_tokens"] - n_join)) for t in trees]
            w2, s2, f2, _ = measure(stage2, sp2)
            longest = statistics.mean(max(b["num_tokens"] for b in t["branches"]) + t["trunk_tokens"] for t in trees)
            rows["re-prefill join"] = (w1 + w2, s1 + s2, f1 + f2, longest)
            for side, (wall, n_steps, n_prefill, seq_steps) in rows.items():
                row = {"parts": parts, "round": rnd, "side": side, "requests": len(prompts), "wall_s": wall,
                       "engine_steps": n_steps, "prefilled_tokens": n_prefill, "sequential_steps": seq_steps,
                       "tokens": statistics.mean(t["num_tokens"] for t in trees)}
                results.append(row)
                print(json.dumps(row), flush=True)
    summary = []
    for parts in args.parts:
        base = {}
        for side in FORKJOIN_SIDES:
            rows = [r for r in results if r["parts"] == parts and r["side"] == side]
            base[side] = {k: statistics.median(r[k] for r in rows)
                          for k in ("wall_s", "engine_steps", "prefilled_tokens", "sequential_steps", "tokens")}
        for side in FORKJOIN_SIDES:
            row = {"parts": parts, "side": side, **base[side],
                   "wall_vs_forkjoin": base[side]["wall_s"] / base["fork/join"]["wall_s"]}
            summary.append(row)
    return {"benchmark": "forkjoin", "machine": machine(), "results": results, "summary": summary,
            "model": args.model or "SmolLM2-135M-Instruct", "attention": _attention_of(llm)}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m vllm_hogwild.tools.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("decode", help="Hogwild group vs stock n=N decode tokens/s, and KV memory")
    d.add_argument("--workers", type=int, nargs="+", default=[2, 4, 8])
    d.add_argument("--prompt-lens", type=int, nargs="+", default=[200, 1500])
    d.add_argument("--max-tokens", type=int, default=128)
    d.add_argument("--rounds", type=int, default=2)
    d.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    d.add_argument("--compiled", action="store_true", help="vLLM's compiled model (default here: eager)")
    r = sub.add_parser("recompute", help="Hogwild vs re-prefilling co-workers' text every K tokens")
    r.add_argument("--workers", type=int, nargs="+", default=[2, 4])
    r.add_argument("--prompt-lens", type=int, nargs="+", default=[1000])
    r.add_argument("--max-tokens", type=int, default=64)
    r.add_argument("--every", type=int, nargs="+", default=[1, 16, 64])
    o = sub.add_parser("overhead", help="scheduler time per step, Hogwild groups vs stock n=N (a stock engine)")
    o.add_argument("--groups", type=int, nargs="+", default=[64, 256])
    o.add_argument("--workers", type=int, default=4)
    o.add_argument("--plain", type=int, default=64)
    o.add_argument("--prompt-len", type=int, default=32)
    o.add_argument("--max-tokens", type=int, default=32)
    o.add_argument("--rounds", type=int, default=2)
    side = sub.add_parser("overhead-side", help=argparse.SUPPRESS)  # one engine of `overhead`, in its own process
    side.add_argument("--kind", choices=("stock", "hogwild"), required=True)
    side.add_argument("--groups", type=int, nargs="+", required=True)
    side.add_argument("--workers", type=int, required=True)
    side.add_argument("--plain", type=int, required=True)
    side.add_argument("--prompt-len", type=int, required=True)
    side.add_argument("--max-tokens", type=int, required=True)
    side.add_argument("--model", default=None)
    a = sub.add_parser("answer", help="the trained collaborator: accuracy vs sequential steps for N workers, "
                                      "with the isolated and interleaved controls")
    from vllm_hogwild.tools import bench_answer

    bench_answer.add_arguments(a)
    s = sub.add_parser("speculative", help="stock and Hogwild, each without and with speculation (n-gram, draft model)")
    s.add_argument("--workers", type=int, nargs="+", default=[2, 4])
    s.add_argument("--temperatures", type=float, nargs="+", default=[0.1, 0.7])
    s.add_argument("--methods", nargs="+", choices=list(SPEC_METHODS), default=list(SPEC_METHODS))
    v = sub.add_parser("verify", help="ms per engine step by part, stock and Hogwild with n-gram speculation")
    v.add_argument("--workers", type=int, default=2)
    v.add_argument("--temperature", type=float, default=0.1)
    for p in (s, v):  # the list-copying workload of both
        p.add_argument("--items", type=int, default=40)
        p.add_argument("--max-tokens", type=int, default=160)
        p.add_argument("--rounds", type=int, default=2)
        p.add_argument("--num-spec", type=int, default=4)
    sp = sub.add_parser("split", help="ms per decode step by part (weights, attention, plan, Python), stock and Hogwild")
    sp.add_argument("--workers", type=int, default=8)
    sp.add_argument("--prompt-len", type=int, default=1500)
    sp.add_argument("--max-tokens", type=int, default=128)
    sp.add_argument("--rounds", type=int, default=2)
    sp.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    sp.add_argument("--compiled", action="store_true", help="vLLM's compiled model (default here: eager)")
    c = sub.add_parser("capacity", help="engine steps under tight KV caches: Hogwild on-demand, reserve, stock n=N")
    c.add_argument("--groups", type=int, default=16)
    c.add_argument("--workers", type=int, default=4)
    c.add_argument("--max-tokens", type=int, default=448)
    c.add_argument("--prompt-len", type=int, default=64)
    c.add_argument("--blocks", type=int, nargs="+", default=[2000, 96, 64, 48])
    c.add_argument("--stop-every", type=int, default=60, help="stop tokens: every token id divisible by this")
    cside = sub.add_parser("capacity-side", help=argparse.SUPPRESS)  # one engine of `capacity`, in its own process
    cside.add_argument("--kind", choices=CAPACITY_KINDS, required=True)
    for parser_ in (c, cside):
        parser_.add_argument("--protocol", choices=("raw", "multiverse"), default="raw",
                             help="Hogwild groups (raw), or fork/join requests of a trunk and --workers - 1 branch lanes")
    for name in ("--blocks", "--groups", "--workers", "--max-tokens", "--prompt-len", "--stop-every"):
        cside.add_argument(name, type=int, required=True)
    cside.add_argument("--model", default="tiny")
    fj = sub.add_parser("forkjoin", help="fork/join requests vs the same tokens decoded one after another and "
                                         "vs a join that re-prefills the branches")
    fj.add_argument("--parts", type=int, nargs="+", default=[2, 4, 8])
    fj.add_argument("--requests", type=int, default=2, help="requests per run (each forks into --parts branches)")
    fj.add_argument("--max-tokens", type=int, default=48)
    fj.add_argument("--context", type=int, default=40, help="numbered facts before the goal (about 14 tokens each)")
    fj.add_argument("--rounds", type=int, default=2)
    fj.add_argument("--temperature", type=float, default=0.8)
    fj.add_argument("--branch-end", default="[.!?]", help="a branch ends at this pattern (the model's tags, "
                                                           "'</Path>', need a model trained on them)")
    for p in (d, r, o, a, s, v, sp, c, fj):
        p.add_argument("--model", default=None,
                       help="HF folder, or 'tiny' (a tiny random Llama); default: the embedded SmolLM2-135M-Instruct "
                            "(answer: the trained collaborator)")
        p.add_argument("--json", default=None, help="write the report here")
        p.add_argument("--plot", default=None, help="write a PNG plot here")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.command == "overhead-side":
        return overhead_side(args)
    if args.command == "capacity-side":
        return capacity_side(args)
    report = run(args)
    if "machine" in report:
        m = report["machine"]
        print(f"{m['cpu']}, {m['cores']} cores, {' '.join(m['isa'])}; {report.get('dtype', '')} "
              f"attention {report.get('attention', '')}")
    print(markdown(report))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    if args.plot:
        plot(report, args.plot)


def run(args, llm=None) -> dict:
    """Run one benchmark (``args`` as parsed by :func:`main`) on ``llm`` or a new engine."""
    if llm is None and args.command not in ("overhead", "speculative", "verify", "split", "capacity"):  # own engines
        length = 4096
        extra = {}
        if args.command in ("decode", "recompute"):
            length = max(2048, max(args.prompt_lens) + max(args.workers) * args.max_tokens + 16)
        if args.command == "decode":
            extra = {"dtype": args.dtype, "enforce_eager": not args.compiled}
        if args.command == "forkjoin":
            extra = {"additional_config": {"hogwild": {"max_workers": max(args.parts) + 1}}}
        if args.command == "answer" and args.protocol != "collab":  # the trained collaborator
            from vllm_hogwild.tools import bench_answer

            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
            llm = bench_answer.engine(args.model, args.protocol)
        else:
            llm = _engine(args.model, length, **extra)
    return {"decode": decode, "recompute": recompute, "overhead": overhead, "answer": answer,
            "speculative": speculative, "verify": verify, "split": split, "capacity": capacity,
            "forkjoin": forkjoin}[args.command](llm, args)


if __name__ == "__main__":
    main()
