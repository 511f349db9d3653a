"""The command line: one sub-command a benchmark."""

from __future__ import annotations

import argparse
import json
import os
import sys

from vllm_hogwild.models import solve

from . import answer as answer_bench
from . import common as c
from .capacity import CAPACITY_KINDS, ELEMENT_BYTES, capacity, capacity_side
from .forkjoin import forkjoin
from .plan import plan
from .report import markdown, plot
from .speculative import SPEC_METHODS, speculative, split, verify
from .throughput import decode, overhead, overhead_side, recompute


# -- time to answer ------------------------------------------------------------


def answer(llm, args) -> dict:
    report = answer_bench.answer(llm, args)
    report.update(machine=c.machine(), dtype="float32", attention=None if llm is None else c.attention_of(llm))
    return report


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench", description=sys.modules[__package__].__doc__,
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
    o.add_argument("--repeats", type=int, default=1,
                   help="runs per engine process and round (more samples for the cost of one engine start)")
    side = sub.add_parser("overhead-side", help=argparse.SUPPRESS)  # one engine of `overhead`, in its own process
    side.add_argument("--kind", choices=("stock", "hogwild"), required=True)
    side.add_argument("--groups", type=int, nargs="+", required=True)
    side.add_argument("--workers", type=int, required=True)
    side.add_argument("--plain", type=int, required=True)
    side.add_argument("--prompt-len", type=int, required=True)
    side.add_argument("--max-tokens", type=int, required=True)
    side.add_argument("--model", default=None)
    side.add_argument("--repeats", type=int, default=1)
    a = sub.add_parser("answer", help="the trained collaborator: accuracy vs sequential steps for N workers, "
                                      "with the isolated and interleaved controls")
    answer_bench.add_arguments(a)
    s = sub.add_parser("speculative", help="stock, Hogwild and fork/join, each without and with speculation (n-gram, draft model)")
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
    c.add_argument("--kv-cache-dtypes", nargs="+", default=["auto"], choices=sorted(ELEMENT_BYTES),
                   help="cache dtypes to compare at the same cache bytes (--blocks counts unquantized blocks)")
    cside.add_argument("--kind", choices=CAPACITY_KINDS, required=True)
    cside.add_argument("--kv-cache-dtype", default="auto", choices=sorted(ELEMENT_BYTES))
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
    pl = sub.add_parser("plan", help="host ms of a decode step's segment-attention plan: the GPU path beside the "
                                     "CPU path (no engine)")
    pl.add_argument("--rounds", type=int, default=5)
    pl.add_argument("--steps", type=int, default=24, help="decode steps a round (the first two are not timed)")
    pl.add_argument("--quick", action="store_true", help="three small rows (a smoke run of seconds)")
    pl.add_argument("--json", default=None, help="write the report here")
    pl.add_argument("--plot", default=None, help=argparse.SUPPRESS)
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
    computed = args.command == "answer" and args.task == "merges" and args.computed  # no engine
    if llm is None and not computed and args.command not in ("overhead", "speculative", "verify", "split",
                                                             "capacity",  # own engines
                                                             "plan"):  # or none
        length = 4096
        extra = {}
        if args.command in ("decode", "recompute"):
            length = max(2048, max(args.prompt_lens) + max(args.workers) * args.max_tokens + 16)
        if args.command == "decode":
            extra = {"dtype": args.dtype, "enforce_eager": not args.compiled}
        if args.command == "forkjoin":
            extra = {"additional_config": {"hogwild": {"max_workers": max(args.parts) + 1}}}
        if args.command == "answer" and args.task in ("links", "merges"):  # the links or merges collaborator
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
            llm = solve.links_engine(args.model, args.task)
        elif args.command == "answer" and args.protocol != "collab":  # the trained collaborator
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
            llm = solve.engine(args.model, args.protocol)
        else:
            llm = c.engine(args.model, length, **extra)
    return {"decode": decode, "recompute": recompute, "overhead": overhead, "answer": answer,
            "speculative": speculative, "verify": verify, "split": split, "capacity": capacity,
            "forkjoin": forkjoin, "plan": plan}[args.command](llm, args)


if __name__ == "__main__":
    main()
