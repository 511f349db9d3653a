"""Comparing times in a test that must pass on a loaded 2-core machine.

A test that compares two sides' times runs them alternately, A B then B A, round after round (A B B A A B ...),
so that a load that rises or falls during the run (another job on the machine, the other pytest worker) weighs
on both sides alike, and compares the sides' medians, with a bound wide enough for what such a load still
leaves (each test says why its bound holds). A time that is a target (how fast, how fair) is a benchmark's,
under ``benchmarks/``, not a test's; an absolute limit in a test only guards against a hang or an unbounded
cost, and is at least 10 times what it guards on this machine.
"""

from __future__ import annotations

from typing import Callable, TypeVar

T = TypeVar("T")


def alternating(sides: dict[str, Callable[[int], T]], rounds: int) -> dict[str, list[T]]:
    """Call each side once a round with the round's number, in the given order in even rounds and in reverse in
    odd ones; each side's results in round order."""
    if rounds < 1 or len(sides) < 2:
        raise ValueError("alternating: at least two sides and one round")
    names = list(sides)
    out: dict[str, list[T]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            out[name].append(sides[name](r))
    return out
