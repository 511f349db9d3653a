"""A toy of Hogwild's bet: workers on one shared token list get more done only if they coordinate.

    python examples/toy_hogwild.py [--steps 400] [--coordination 0.9 0.1] [--seed 0]

No model. A job is a row of units of work, each ``unit`` tokens long. Every
step each worker appends ONE token to the shared list:

- ``coordinate``: it picks its next unit and announces it. With probability
  ``coordination`` it has read the list and picks the first unit nobody has
  announced or finished; otherwise it picks the first unit not finished,
  whoever else is on it (a duplicate).
- ``work``: one token of its unit; the unit is finished after ``unit`` of them.
- ``observe``: it has nothing to do (every unit announced or finished) and
  reads the list.

One worker does ``steps / (unit + 1)`` units. Two workers that read each other
(coordination 0.9) do close to twice that in the same steps; two that rarely
read each other (0.1) mostly work on the same unit, and the gain collapses.
"""

from __future__ import annotations

import argparse
import random
from collections import Counter
from dataclasses import dataclass, field


@dataclass
class Result:
    units_done: int  # distinct units finished
    tokens: Counter = field(default_factory=Counter)  # tokens by kind over all workers
    shared: list = field(default_factory=list)  # the shared list: (step, worker, kind, unit)


def simulate(num_workers: int, steps: int, coordination: float, unit: int = 4, num_units: int = 10_000,
             seed: int = 0) -> Result:
    rng = random.Random(seed)
    done: set[int] = set()
    claims: dict[int, int | None] = {w: None for w in range(num_workers)}  # worker -> unit it works on
    progress = [0] * num_workers
    result = Result(0)
    for step in range(steps):
        for w in range(num_workers):
            current = claims[w]
            if current is not None and current in done:  # a co-worker finished it first: wasted work
                current = claims[w] = None
            if current is None:
                taken = {u for o, u in claims.items() if o != w and u is not None}
                reads = rng.random() < coordination
                free = (u for u in range(num_units) if u not in done and not (reads and u in taken))
                pick = next(free, None)
                kind = "observe" if pick is None else "coordinate"
                claims[w], progress[w] = pick, 0
                result.shared.append((step, w, kind, pick))
                result.tokens[kind] += 1
                continue
            progress[w] += 1
            result.shared.append((step, w, "work", current))
            result.tokens["work"] += 1
            if progress[w] == unit:
                done.add(current)
                claims[w] = None
    result.units_done = len(done)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--unit", type=int, default=4)
    parser.add_argument("--coordination", type=float, nargs="+", default=[0.9, 0.1])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    one = simulate(1, args.steps, 1.0, args.unit, seed=args.seed)
    print(f"1 worker: {one.units_done} units in {args.steps} steps")
    for c in args.coordination:
        two = simulate(2, args.steps, c, args.unit, seed=args.seed)
        print(f"2 workers, coordination {c}: {two.units_done} units in {args.steps} steps "
              f"({two.units_done / one.units_done:.2f}x); tokens {dict(two.tokens)}")


if __name__ == "__main__":
    main()
