"""``speculative``, ``verify`` and ``split``: speculative decoding in groups, and where a step's time goes."""

from __future__ import annotations

import json
import random
import statistics
import time

from . import common as c


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



def _spec_counts(llm) -> tuple[float, float]:
    values = {m.name: m.value for m in llm.get_metrics() if m.name in (
        "vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens")}
    return (values.get("vllm:spec_decode_num_draft_tokens", 0) or 0,
            values.get("vllm:spec_decode_num_accepted_tokens", 0) or 0)


SPEC_KINDS = ("stock", "hogwild", "fork/join")


def goal_of(prompt: str, parts: int, items: int) -> str:
    """``prompt`` (a list to copy) ending in a Multiverse goal of ``parts`` outlines, each a share of the items: a
    fork/join request forks at once, one branch per outline (each ends at its budget)."""
    cuts = [round(k * items / parts) for k in range(parts + 1)]
    outlines = "".join(f"<Outline>\n{k + 1}: copy items {cuts[k] + 1} to {cuts[k + 1]}</Outline>\n"
                       for k in range(parts))
    return f"{prompt.rsplit(chr(10), 1)[0]}\n<Parallel>\n<Goal>\n{outlines}</Goal>"
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
    """Stock ``n=N``, a Hogwild group of N and a fork/join request of N branches (Multiverse, isolated; the list
    split among them by its goal), each without and with speculation, for every N and temperature.

    Engines in order: none, the draft model, n-gram (once the n-gram proposer has loaded numba, vLLM 0.32 cannot
    start another engine in the same process: its CPU kernel-override scan trips on llvmlite objects)."""
    from vllm import SamplingParams

    from vllm_hogwild.scheduler.scheduler import HogwildScheduler  # noqa: F401  (the plugin is installed)
    from vllm_hogwild.models.default import prepare
    from vllm_hogwild.models.tiny import build_tiny_llama

    model = str(build_tiny_llama()) if args.model == "tiny" else args.model or str(prepare())
    length = max(2048, 16 * args.items + max(args.workers) * args.max_tokens + 64)
    methods = [None] + [m for m in ("draft", "ngram") if m in args.methods]
    rows = []
    for method in methods:
        what = f" + {SPEC_METHODS[method]}" if method else ""
        if llm is None:
            llm = c.engine(model, length, speculative_config=_speculative_config(method, args, model),
                          disable_log_stats=False, block_size=32)
        steps = c.count_steps(llm)
        llm.generate([list_prompt(4, salt=-1)], SamplingParams(max_tokens=8), use_tqdm=False)  # warm-up
        points = [(kind, n, t) for n in args.workers for t in args.temperatures for kind in SPEC_KINDS]
        points.append(("stock n=1 greedy", 1, 0.0))  # the reference: vLLM refuses n > 1 with greedy sampling
        for kind, n, temperature in points:
            walls, counts, tokens = [], [], []
            drafted0, accepted0 = _spec_counts(llm)
            for r in range(args.rounds):
                prompt = list_prompt(args.items, salt=r)
                if kind == "fork/join":  # n branches (n + 1 lanes), the same budget per lane
                    prompt = goal_of(prompt, n, args.items)
                    params = SamplingParams(temperature=temperature, seed=r, max_tokens=args.max_tokens,
                                            extra_args={"hogwild_protocol": "multiverse", "hogwild_max_branches": n})
                else:
                    params = SamplingParams(n=n, temperature=temperature, seed=r, max_tokens=args.max_tokens,
                                            ignore_eos=True, extra_args={"hogwild": {"layout": "contiguous"}}
                                            if kind == "hogwild" else None)
                before = steps[0]
                wall, (out,) = c.timed(llm, [prompt], params)
                if kind == "fork/join" and not out.outputs[0].hogwild["forked"]:
                    raise RuntimeError(f"the fork/join request did not fork: {out.outputs[0].hogwild}")
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
    ("segment plan", "vllm_hogwild.attention.segment_attention", "plan_rows"),
    ("sampler", "vllm.v1.worker.gpu_model_runner", "GPUModelRunner._sample"),
    ("drafting", "vllm.v1.worker.gpu_model_runner", "GPUModelRunner.propose_draft_token_ids"),
)
VERIFY_CONFIGS = ("stock", "hogwild", "hogwild, verify rows on the torch path")


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
    the group once with its verify rows on the compiled op (one row per token) and once on the torch path's item plan
    (where every step with a multi-token row went before)."""
    from vllm import SamplingParams

    from vllm_hogwild.attention import segment_attention as sa

    totals: dict[str, float] = {}
    _time_parts(totals)  # before the engine exists: the runner's adapter wraps the runner's methods as they are then
    length = max(2048, 16 * args.items + args.workers * args.max_tokens + 64)
    llm = c.engine(args.model, length, disable_log_stats=False, block_size=32,
                  speculative_config={"method": "ngram", "num_speculative_tokens": args.num_spec,
                                      "prompt_lookup_min": 2, "prompt_lookup_max": 5})
    steps = c.count_steps(llm)
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
            seconds, (out,) = c.timed(llm, [list_prompt(args.items, salt=r)], params)
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
    ("segment plan", "vllm_hogwild.attention.segment_attention", "plan_rows"),
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
    scheduler = c.scheduler_of(llm)
    for part, name in (("schedule", "schedule"), ("update", "update_from_output")):
        _time_attribute(scheduler, name, part, totals)


def split(llm, args) -> dict:
    """Milliseconds per decode step of stock ``n=N`` and a Hogwild group, split by part (SPLIT_ROWS). A run's parts
    minus those of the same request with ``max_tokens=1`` (its prefill and first token), over ``max_tokens - 1``
    steps; runs alternate (stock and Hogwild, and each run and its twin), medians over rounds."""
    totals: dict[str, float] = {}
    _time_parts(totals, SPLIT_PARTS)  # before the engine exists (the runner's adapter wraps the runner as it is then)
    length = max(2048, args.prompt_len + args.workers * args.max_tokens + 16)
    llm = c.engine(args.model, length, dtype=args.dtype, enforce_eager=not args.compiled)
    _time_scheduler(llm, totals)
    steps = c.count_steps(llm)
    samples: dict[str, list[dict]] = {"stock": [], "hogwild": []}
    salt = 50_000
    for r in range(args.rounds):
        for kind in ("stock", "hogwild"):
            hogwild = {"layout": "contiguous"} if kind == "hogwild" else None
            parts = {}
            # The run and its max_tokens=1 twin in turn: the whole run first in even rounds, second in odd ones.
            for max_tokens in (args.max_tokens, 1) if r % 2 == 0 else (1, args.max_tokens):
                salt += 1
                totals.clear()
                before = steps[0]
                wall, _ = c.timed(llm, [c.prompt(args.prompt_len, salt)], c.params(args.workers, max_tokens, salt, hogwild))
                parts[max_tokens] = {**totals, "wall": wall, "steps": steps[0] - before}
            full, first = parts[args.max_tokens], parts[1]
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
    attention = c.attention_of(llm)
    llm.llm_engine.engine_core.shutdown()
    return {"benchmark": "split", "attention": attention, "machine": c.machine(), "results": rows}


