"""Every benchmark's report as a Markdown table and a PNG."""

from __future__ import annotations


from . import answer as answer_bench
from .forkjoin import FORKJOIN_SIDES
from .speculative import VERIFY_PARTS


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
        head = ("| engine: load | sequences | engine steps | schedule ms/step | update ms/step | total ms/step | "
                "first step ms | last step ms | steady step ms | own ms/step (steady) | wall s |")
        body = [f"| {r['kind']}: {r['groups']} x n={r['workers']} + {r['plain']} plain | {r['sequences']} | "
                f"{r['steps']} | {r['schedule_ms_per_step']:.2f} | {r['update_ms_per_step']:.2f} | "
                f"{r['schedule_ms_per_step'] + r['update_ms_per_step']:.2f} | {r['first_step_ms']:.1f} | "
                f"{r['last_step_ms']:.1f} | {r['steady_step_ms']:.2f} | "
                f"{r['own_ms_per_step']:.2f} ({r['own_steady_ms']:.2f}) | {r['wall_s']:.1f} |" for r in rows]
        body += [f"| Hogwild / stock, {g} groups (medians) | | | | | {ratio:.2f}x | | | "
                 f"{report['steady_ratio'][g]:.2f}x | (stock + own) / stock {report['own_ratio'][g]:.3f}x | |"
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
        head = ("| cache size (float32 blocks) | cache dtype | KV blocks (x128 tokens) | configuration | groups held | "
                "engine steps | steps vs largest cache | floor (steps) | steps vs floor | wall s | groups preempted | "
                "tokens replayed / generated |")
        body = [f"| {r.get('size', r['blocks'])} | {r.get('kv_cache_dtype', 'auto')} | {r['blocks']} | {r['kind']} | "
                f"{_or_dash(r.get('groups_held'))} | {r['steps']} | {r['steps_vs_largest']:.2f}x | "
                f"{_or_dash(r.get('steps_floor'))} | {_ratio(r['steps'], r.get('steps_floor'))} | {r['wall_s']:.2f} | "
                f"{_or_dash(r['group_preemptions'])} | {_replayed(r)} |" for r in rows]
    elif kind == "forkjoin":
        head = ("| outlines | side | tokens per request | sequential decode steps | engine steps | prefilled tokens | "
                "wall s | wall vs fork/join | one request alone: engine steps, headers one token a step |")
        alone = {h["parts"]: f"{h['fed_ahead']}, {h['one_a_step']}" for h in report.get("headers", ())}
        body = [f"| {r['parts']} | {r['side']} | {r['tokens']:.0f} | {r['sequential_steps']:.0f} | "
                f"{r['engine_steps']:.0f} | {r['prefilled_tokens']:.0f} | {r['wall_s']:.2f} | "
                f"{r['wall_vs_forkjoin']:.2f}x | {alone.get(r['parts'], '-') if r['side'] == 'fork/join' else '-'} |"
                for r in report["summary"]]
    elif kind == "plan":
        head = ("| groups x workers | view tokens | rows | GPU path, steady ms | GPU path, rebuild ms | "
                "CPU path ms | CPU path / GPU steady | columns ms (both paths) |")
        body = [f"| {r['groups']} x {r['workers']} | {r['view_tokens']:,} | {r['rows']} | {r['gpu_steady_ms']:.3f} | "
                f"{r['gpu_rebuild_ms']:.3f} | {r['cpu_ms']:.3f} | {r['cpu_over_gpu_steady']:.1f}x | "
                f"{r['columns_ms']:.3f} |" for r in rows]
        body += ["", "| target | wanted | measured | met |", "|---|---:|---:|---|"]
        body += [f"| {t['rows']} | {_wanted(t)} | {_measured(t)} | {'yes' if t['met'] else 'no'} |"
                 for t in report["targets"]]
    else:
        return answer_bench.markdown(report)
    sep = "|" + "|".join("---:" for _ in range(head.count("|") - 1)) + "|"
    return "\n".join([head, sep, *body])


def _wanted(target: dict) -> str:
    return f"<= {target['target_ms']} ms" if "target_ms" in target else f"<= {target['target_ratio']}x"


def _measured(target: dict) -> str:
    return f"{target['ms']:.3f} ms" if "ms" in target else f"{target['ratio']:.2f}x"


def _or_dash(value) -> str:
    return "-" if value is None else str(value)


def _ratio(value, base) -> str:
    return "-" if base is None else f"{value / base:.2f}x"


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
        for k in dict.fromkeys((r["kind"], r.get("kv_cache_dtype", "auto")) for r in rows):
            pts = sorted((r for r in rows if (r["kind"], r.get("kv_cache_dtype", "auto")) == k),
                         key=lambda r: r.get("size", r["blocks"]))
            ax.plot([r.get("size", r["blocks"]) for r in pts], [r["steps_vs_largest"] for r in pts], "o-",
                    label=k[0] if k[1] == "auto" else f"{k[0]}, {k[1]}")
        ax.set_xscale("log", base=2)
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set(xlabel="cache size (float32 KV blocks)", ylabel="engine steps / own steps with the largest cache",
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
        answer_bench.plot(report, ax)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


