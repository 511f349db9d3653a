"""Is Hogwild worth it for a workload, with how many workers, and what else to use if not.

    python -m vllm_hogwild.tools.planner best  --tokens 10000 --parallel 0.7 --coordination 200 [--max-workers 8]
    python -m vllm_hogwild.tools.planner route --tokens 50000 --parallel 0.8 --coordination 500 \\
                                          [--model-family reasoning] [--answer single] [--draft-model] ...

The wall-clock model counts sequential decode steps. A job that takes
``T_serial`` steps for one worker, of which a fraction ``p`` can be split,
takes with ``N`` workers

    T(N) = T_serial * ((1 - p) + p / N) + c * N

where ``c`` is the coordination cost: the tokens each worker spends reading
what the others do and deciding what to take on, which grows with the number
of co-workers. One worker (plain decoding) needs no coordination: ``T(1) =
T_serial``. So Hogwild pays when some ``N >= 2`` has ``T(N) < T_serial``; the
best ``N`` is near ``sqrt(T_serial * p / c)``.

Worked example: 10,000 tokens, p = 0.7, c = 200, N = 4 gives 10,000 x (0.3 +
0.175) + 800 = 5,550 steps, 1.8x faster than 10,000.

:func:`route` turns a workload profile into a recommendation among plain
decoding, speculative decoding, voting (self-consistency), tree of thought,
multi-agent, Hogwild, and Hogwild with speculative decoding, with its reasons.
These are rules of thumb written down, not measurements; the figures they use
come from :func:`plan`.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict, dataclass, field


def steps(t_serial: float, parallel: float, coordination: float, workers: int) -> float:
    """Sequential decode steps of the job with ``workers`` workers (1: plain decoding)."""
    _check(t_serial, parallel, coordination)
    if workers < 1:
        raise ValueError(f"workers: at least 1, not {workers}")
    if workers == 1:
        return float(t_serial)
    return t_serial * ((1 - parallel) + parallel / workers) + coordination * workers


@dataclass(frozen=True)
class Sizing:
    """The planner's answer for a workload: the group size with the fewest predicted steps (1: no group)."""

    best_workers: int  # 1: do not use Hogwild
    steps: float  # T(best)
    speedup: float  # T_serial / T(best)
    table: dict[int, float] = field(default_factory=dict)  # N -> T(N), N = 1 .. max_workers

    @property
    def pays(self) -> bool:
        return self.best_workers > 1


def plan(t_serial: float, parallel: float, coordination: float, max_workers: int = 8) -> Sizing:
    """The best number of workers (1 to ``max_workers``) for a job; ties go to fewer workers."""
    table = {n: steps(t_serial, parallel, coordination, n) for n in range(1, max_workers + 1)}
    best = min(table, key=lambda n: (table[n], n))
    return Sizing(best, table[best], t_serial / table[best], table)


def optimum(t_serial: float, parallel: float, coordination: float) -> float:
    """The real-valued minimizer of ``T(N)`` for ``N >= 2`` (``inf`` when coordination is free)."""
    _check(t_serial, parallel, coordination)
    return math.inf if coordination == 0 else math.sqrt(t_serial * parallel / coordination)


@dataclass(frozen=True)
class Fit:
    parallel: float  # p
    coordination: float  # c, steps per worker


def fit(one: "list[float]", two: "list[float]") -> Fit:
    """``p`` and ``c`` from paired runs of the same jobs with 1 and 2 workers (least squares).

    ``T(2) = T(1) * (1 - p / 2) + 2 c`` is a line in ``T(1)``: its slope gives ``p``, its intercept ``c``
    (``p`` clipped to [0, 1], ``c`` to >= 0 and refitted with it). Needs at least two jobs of different lengths.
    """
    if len(one) != len(two) or len(one) < 2:
        raise ValueError("runs: the same jobs (at least 2) with 1 and with 2 workers")
    mx, my = sum(one) / len(one), sum(two) / len(two)
    var = sum((x - mx) ** 2 for x in one)
    if var == 0:
        raise ValueError("runs: the jobs must differ in length")
    slope = sum((x - mx) * (y - my) for x, y in zip(one, two)) / var
    parallel = min(1.0, max(0.0, 2 * (1 - slope)))
    return Fit(parallel, max(0.0, (my - mx * (1 - parallel / 2)) / 2))  # the intercept, unless p was clipped


def _check(t_serial: float, parallel: float, coordination: float) -> None:
    if t_serial <= 0:
        raise ValueError(f"tokens: a positive token budget, not {t_serial}")
    if not 0 <= parallel <= 1:
        raise ValueError(f"parallel: a fraction in [0, 1], not {parallel}")
    if coordination < 0:
        raise ValueError(f"coordination: tokens >= 0, not {coordination}")


# -- the router ---------------------------------------------------------------

MODEL_FAMILIES = ("reasoning", "instruct", "small")
ANSWERS = ("single", "open")  # one checkable answer (a number, a choice) or open-ended text
STRATEGIES = ("plain", "speculative", "voting", "tree_of_thought", "multi_agent", "hogwild", "hogwild+speculative")


@dataclass(frozen=True)
class Workload:
    tokens: float  # the serial token budget of one answer
    parallel: float  # the fraction of that work that splits into independent parts
    coordination: float = 200.0  # tokens each worker spends per co-worker reading and deciding
    model_family: str = "reasoning"  # reasoning: follows the collaboration preamble; small: cannot
    answer: str = "single"
    draft_model: bool = False  # a small draft model of the same family is available
    branching: bool = False  # the work is a search: propose, evaluate, back up
    roles: bool = False  # the parts need different tools, prompts or models
    spare_compute: bool = True  # latency matters more than throughput: idle accelerator capacity
    max_workers: int = 8

    def __post_init__(self) -> None:
        _check(self.tokens, self.parallel, self.coordination)
        if self.model_family not in MODEL_FAMILIES:
            raise ValueError(f"model_family: one of {list(MODEL_FAMILIES)}, not {self.model_family!r}")
        if self.answer not in ANSWERS:
            raise ValueError(f"answer: one of {list(ANSWERS)}, not {self.answer!r}")


@dataclass(frozen=True)
class Recommendation:
    strategy: str
    workers: int
    speedup: float  # the wall-clock model's estimate for Hogwild (1.0 when Hogwild is not chosen)
    reasons: tuple[str, ...]
    plan: Sizing

    def to_dict(self) -> dict:
        d = asdict(self)
        d["plan"]["table"] = {str(k): v for k, v in self.plan.table.items()}
        return d


def route(w: Workload) -> Recommendation:
    """A strategy for the workload, with the reasons that decided it."""
    p = plan(w.tokens, w.parallel, w.coordination, w.max_workers)
    reasons = [f"wall-clock model: best N = {p.best_workers}, {p.steps:,.0f} steps for {w.tokens:,.0f} "
               f"({p.speedup:.2f}x)"]
    if not w.spare_compute:
        reasons.append("no spare compute: every parallel strategy competes with other requests for the same "
                       "accelerator, so throughput is best served by one sequence per answer")
        return _plain_or_speculative(w, p, reasons)
    if w.roles:
        reasons.append("the parts need different tools, prompts or models: separate agents, not one shared cache")
        return Recommendation("multi_agent", 1, 1.0, tuple(reasons), p)
    if w.branching:
        reasons.append("the work is a search with evaluation and backtracking: tree of thought explores branches "
                       "that Hogwild's workers would all have to keep in one transcript")
        return Recommendation("tree_of_thought", 1, 1.0, tuple(reasons), p)
    hogwild_fits = p.pays and w.model_family == "reasoning"
    if p.pays and w.model_family != "reasoning":
        reasons.append(f"a {w.model_family} model does not follow the collaboration protocol reliably: "
                       "workers duplicate or echo each other, so the model's gain would not materialize")
    if not p.pays:
        reasons.append(f"coordination ({w.coordination:.0f} tokens per worker) outweighs the parallel part "
                       f"(p = {w.parallel}) at this budget")
    if hogwild_fits:
        reasons.append(f"long parallelizable work (p = {w.parallel}) with a reasoning model: {p.best_workers} "
                       "workers share one KV cache and read each other's progress")
        if w.draft_model:
            reasons.append("a draft model is available: speculative decoding also shortens each worker's "
                           "serial part, and the two gains multiply (speculative_config with method 'ngram' or "
                           "'draft_model' beside the Hogwild switch; docs/user_guide.md, speculative decoding)")
            return Recommendation("hogwild+speculative", p.best_workers, p.speedup, tuple(reasons), p)
        return Recommendation("hogwild", p.best_workers, p.speedup, tuple(reasons), p)
    if w.answer == "single" and w.tokens <= 4000:
        reasons.append("a short single answer that can be compared: independent samples and a majority vote "
                       "raise accuracy without coordination, at the latency of one sample")
        return Recommendation("voting", 1, 1.0, tuple(reasons), p)
    return _plain_or_speculative(w, p, reasons)


def _plain_or_speculative(w: Workload, p: Sizing, reasons: list[str]) -> Recommendation:
    if w.draft_model:
        reasons.append("sequential work: speculative decoding cuts its latency without extra sequences")
        return Recommendation("speculative", 1, 1.0, tuple(reasons), p)
    reasons.append("sequential work and no draft model: plain decoding")
    return Recommendation("plain", 1, 1.0, tuple(reasons), p)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m vllm_hogwild.tools.planner", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("best", "route"):
        p = sub.add_parser(name)
        p.add_argument("--tokens", type=float, required=True, help="serial token budget of one answer")
        p.add_argument("--parallel", type=float, required=True, help="fraction of the work that splits")
        p.add_argument("--coordination", type=float, default=200.0, help="tokens per worker for coordination")
        p.add_argument("--max-workers", type=int, default=8)
        p.add_argument("--json", action="store_true", help="print JSON")
    r = sub.choices["route"]
    r.add_argument("--model-family", default="reasoning", choices=MODEL_FAMILIES)
    r.add_argument("--answer", default="single", choices=ANSWERS)
    r.add_argument("--draft-model", action="store_true")
    r.add_argument("--branching", action="store_true")
    r.add_argument("--roles", action="store_true")
    r.add_argument("--no-spare-compute", dest="spare_compute", action="store_false")
    args = parser.parse_args(argv)
    try:
        if args.command == "best":
            result = plan(args.tokens, args.parallel, args.coordination, args.max_workers)
            if args.json:
                print(json.dumps({**asdict(result), "table": {str(k): v for k, v in result.table.items()}}))
                return
            for n, t in result.table.items():
                mark = "  <- best" if n == result.best_workers else ""
                print(f"N={n}: {t:>12,.0f} steps  {args.tokens / t:5.2f}x{mark}")
            return
        rec = route(Workload(args.tokens, args.parallel, args.coordination, args.model_family, args.answer,
                             args.draft_model, args.branching, args.roles, args.spare_compute, args.max_workers))
    except ValueError as err:
        parser.error(str(err))
    if args.json:
        print(json.dumps(rec.to_dict()))
        return
    print(f"recommendation: {rec.strategy}" + (f" with {rec.workers} workers ({rec.speedup:.2f}x)"
                                               if rec.strategy.startswith("hogwild") else ""))
    for reason in rec.reasons:
        print(f"- {reason}")


if __name__ == "__main__":
    main()
