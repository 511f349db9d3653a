"""examples/toy_hogwild.py: two workers beat one only when they coordinate (fixed seeds)."""

from __future__ import annotations

import importlib.util
import sys
from collections import Counter
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("toy_hogwild", Path(__file__).parents[2] / "examples" / "toy_hogwild.py")
toy = importlib.util.module_from_spec(_spec)
sys.modules["toy_hogwild"] = toy  # dataclasses look their module up
_spec.loader.exec_module(toy)


def test_one_worker_does_one_unit_per_unit_plus_one_steps() -> None:
    one = toy.simulate(1, 400, coordination=1.0, unit=4)
    assert one.units_done == 80 and one.tokens == Counter(coordinate=80, work=320)


@pytest.mark.parametrize("seed", range(5))
def test_coordination_makes_the_gain_and_its_absence_collapses_it(seed) -> None:
    one = toy.simulate(1, 400, 1.0, seed=seed).units_done
    strong = toy.simulate(2, 400, 0.9, seed=seed)
    weak = toy.simulate(2, 400, 0.1, seed=seed)
    assert strong.units_done / one >= 1.8
    assert weak.units_done / one <= 1.3
    # The same number of steps: one token per worker per step on the shared list.
    for result in (strong, weak):
        assert Counter(step for step, *_ in result.shared) == {s: 2 for s in range(400)}
        assert sum(result.tokens.values()) == 800


def test_perfect_coordination_never_duplicates() -> None:
    two = toy.simulate(2, 400, 1.0)
    assert two.units_done == 160  # exactly twice one worker
