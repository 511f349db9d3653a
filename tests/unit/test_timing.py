"""The tests' helper for comparing times (tests/timing.py): the order it runs the sides in."""

from __future__ import annotations

import pytest

from tests.timing import alternating


def test_sides_alternate_a_b_b_a_and_keep_round_order() -> None:
    calls = []

    def side(name):
        def run(r: int) -> str:
            calls.append(name)
            return f"{name}{r}"
        return run

    got = alternating({"a": side("a"), "b": side("b")}, rounds=4)
    assert "".join(calls) == "abbaabba"
    assert got == {"a": ["a0", "a1", "a2", "a3"], "b": ["b0", "b1", "b2", "b3"]}


@pytest.mark.parametrize("sides,rounds", [({"a": int}, 2), ({"a": int, "b": int}, 0)])
def test_one_side_or_no_round_is_refused(sides, rounds) -> None:
    with pytest.raises(ValueError, match="^alternating: "):
        alternating(sides, rounds)
