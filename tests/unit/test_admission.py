"""Fairness between Hogwild groups and plain requests (pure)."""

from __future__ import annotations

import pytest

from vllm_hogwild.core.admission import Decision, Fairness

F = Fairness(max_plain_wait=2.0)


@pytest.mark.parametrize("now,group,fits,plain,expected", [
    (10.0, 9.0, True, None, Decision.ADMIT),  # nobody waits
    (10.0, 9.0, True, 9.5, Decision.ADMIT),  # the plain request is newer than the group
    (10.0, 9.0, True, 8.5, Decision.ADMIT),  # older, but has waited 1.5 s < 2 s: the group may go first
    (10.0, 9.0, True, 8.0, Decision.WAIT),  # older and has waited 2 s: it goes first
    (10.0, 9.0, False, None, Decision.WAIT),  # no room yet, the group has waited 1 s
    (10.0, 8.0, False, None, Decision.HOLD_NEWER),  # no room after 2 s: newer plain requests wait too
    (10.0, 8.0, False, 9.0, Decision.HOLD_NEWER),
    (10.0, 8.0, False, 7.0, Decision.WAIT),  # an older plain request that waited long goes first anyway
])
def test_arrival_order_with_a_bounded_overtake(now, group, fits, plain, expected) -> None:
    assert F.decide(now, group, fits, plain) is expected


def test_zero_bound_is_strict_arrival_order() -> None:
    strict = Fairness(0.0)
    assert strict.decide(10.0, 9.0, True, 8.999) is Decision.WAIT
    assert strict.decide(10.0, 9.0, True, 9.001) is Decision.ADMIT
    assert strict.decide(10.0, 10.0, False, None) is Decision.HOLD_NEWER
