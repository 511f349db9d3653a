"""Views (vllm_hogwild.core.views.spans) against DESIGN.md section 1, written independently.

Expected views are built here token by token as lists of ``(lane, stored_pos)``,
never through the module's spans, so a mistake in span bookkeeping cannot
cancel out. Property tests (hypothesis) cover the three layouts; small cases of
the contiguous layout are checked exhaustively against hand-written lists.
"""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vllm_hogwild.core.views.spans import (
    LAYOUTS,
    Separators,
    Span,
    View,
    build_views,
    combined_views,
    contiguous_views,
    isolated_views,
    normalize,
)

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

Token = tuple[int, int]


# ---------------------------------------------------------------- helpers


def toks(lane: int, start: int, end: int) -> list[Token]:
    return [(lane, p) for p in range(start, end)]


def expected_contiguous(prompt_len: int, lane_lens: list[int], w: int) -> list[Token]:
    """DESIGN's raw mode: [prompt][tokens of every other worker, in worker order][own tokens]."""
    out = toks(w, 0, prompt_len)
    for o, n in enumerate(lane_lens):
        if o != w:
            out += toks(o, prompt_len, n)
    return out + toks(w, prompt_len, lane_lens[w])


def expected_combined(
    prompt_len: int, lane_lens: list[int], history: list[Span], paragraph_starts: list[int],
    seps: Separators, w: int,
) -> list[Token]:
    """[prompt][history sep][history][others sep][other, pivot]*[own sep][own unfinished step]."""

    def sep(span: Span | None) -> list[Token]:
        return [] if span is None else toks(span.lane, span.start, span.end)

    out = toks(w, 0, prompt_len)
    if history:
        out += sep(seps.history)
        for span in history:
            out += toks(span.lane, span.start, span.end)
    others = [o for o, n in enumerate(lane_lens) if o != w and n > paragraph_starts[o]]
    if others:
        out += sep(seps.others)
        for o in others:
            out += toks(o, paragraph_starts[o], lane_lens[o]) + sep(seps.pivot)
    out += sep(seps.own)
    return out + toks(w, paragraph_starts[w], lane_lens[w])


def own_text_is_possible(prompt_len: int, lane_lens: list[int], w: int) -> bool:
    """Whether worker ``w``'s contiguous view can end with its own lane's last token.

    With no generated token of its own, the query is the last prompt token; that is
    only the last token of the view while no co-worker text follows the prompt.
    """
    if lane_lens[w] > prompt_len:
        return True
    return prompt_len > 0 and all(n == prompt_len for n in lane_lens)


def check_view_invariants(view: View, w: int, lane_lens: list[int]) -> None:
    """Structure every view must have, whatever the layout."""
    spans = view.spans
    tokens = view.tokens()
    # Normalized: no empty span, no span continuing its predecessor.
    assert all(s.num_tokens > 0 for s in spans), spans
    for a, b in zip(spans, spans[1:]):
        assert not (a.lane == b.lane and a.end == b.start), f"unmerged {a} {b}"
    # The own text is last and ends at the lane's end (the query is the last token).
    assert view.own == spans[-1]
    assert view.own.lane == w and view.own.end == lane_lens[w]
    # Token counts.
    assert view.num_tokens == sum(s.num_tokens for s in spans) == len(tokens)
    # Every token exists in its lane.
    assert all(0 <= p < lane_lens[lane] for lane, p in tokens)
    # View positions by concatenation.
    starts = view.view_starts()
    assert starts[0] == 0
    assert starts == list(itertools.accumulate([s.num_tokens for s in spans], initial=0))[:-1]
    # Deltas: for every span i, token (lane, s) at view position v and query q in
    # the own span: v - s == (v_q - s_q) - delta_i.
    deltas = view.deltas()
    assert len(deltas) == len(spans) and deltas[-1] == 0
    own = view.own
    queries = {own.start, own.end - 1, (own.start + own.end) // 2}
    for q in queries:
        v_q = starts[-1] + q - own.start
        assert tokens[v_q] == (own.lane, q)
        if tokens.count((own.lane, q)) == 1:
            assert view.view_pos(own.lane, q) == v_q
        for span, v0, delta in zip(spans, starts, deltas):
            for s in {span.start, span.end - 1, (span.start + span.end) // 2}:
                v = v0 + s - span.start
                assert tokens[v] == (span.lane, s)
                assert v - s == (v_q - q) - delta
    # view_pos agrees with the first occurrence of every token.
    first: dict[Token, int] = {}
    for v, t in enumerate(tokens):
        first.setdefault(t, v)
    for t, v in first.items():
        assert view.view_pos(*t) == v
    with pytest.raises(KeyError):
        view.view_pos(len(lane_lens), 0)


# ---------------------------------------------------------------- strategies

@st.composite
def lanes_st(draw, min_gen: int = 0):
    prompt_len = draw(st.integers(0, 12))
    gens = draw(st.lists(st.integers(min_gen, 9), min_size=1, max_size=8))
    return prompt_len, [prompt_len + g for g in gens]


@st.composite
def lockstep_lanes_st(draw):
    """States a lock-step group can be in: no worker has text yet, or every one has some."""
    prompt_len = draw(st.integers(0, 12))
    n = draw(st.integers(1, 8))
    if prompt_len > 0 and draw(st.booleans()):
        return prompt_len, [prompt_len] * n
    return prompt_len, [prompt_len + draw(st.integers(1, 9)) for _ in range(n)]


@st.composite
def combined_st(draw, with_separators: bool):
    """Lanes, finished steps (disjoint, before each step start) in a random finishing
    order, step starts with a non-empty own unfinished step, optional separators
    as disjoint spans of lane 0's prompt."""
    prompt_len = draw(st.integers(0, 12))
    gens = draw(st.lists(st.integers(1, 9), min_size=1, max_size=8))
    lane_lens = [prompt_len + g for g in gens]
    paragraph_starts, history = [], []
    for w, n in enumerate(lane_lens):
        start = draw(st.integers(prompt_len, n - 1))
        paragraph_starts.append(start)
        cuts = sorted(draw(st.sets(st.integers(prompt_len, start), max_size=4)) | {prompt_len, start})
        for a, b in zip(cuts, cuts[1:]):
            if draw(st.booleans()):  # finished and promoted (a subset: gaps allowed)
                history.append(Span(w, a, b))
    history = draw(st.permutations(history))
    seps = Separators()
    if with_separators and prompt_len > 0:
        cuts = sorted(draw(st.sets(st.integers(0, prompt_len), min_size=2, max_size=9)))
        pieces = [Span(0, a, b) for a, b in zip(cuts, cuts[1:])]
        picked = draw(st.lists(st.sampled_from([None, *pieces]), min_size=4, max_size=4))
        # Distinct separators (disjoint spans) so that counting them is exact.
        used = [p for p in picked if p is not None]
        if len(used) == len(set(used)):
            seps = Separators(*picked)
    return prompt_len, lane_lens, list(history), paragraph_starts, seps


# ---------------------------------------------------------------- contiguous


@SETTINGS
@given(lanes_st())
def test_contiguous_properties(case) -> None:
    prompt_len, lane_lens = case
    if not all(own_text_is_possible(prompt_len, lane_lens, w) for w in range(len(lane_lens))):
        with pytest.raises(ValueError, match="own text"):
            contiguous_views(prompt_len, lane_lens)
        return
    views = contiguous_views(prompt_len, lane_lens)
    assert views == build_views("contiguous", prompt_len, lane_lens)
    assert len(views) == len(lane_lens)
    for w, view in enumerate(views):
        check_view_invariants(view, w, lane_lens)
        tokens = view.tokens()
        assert tokens == expected_contiguous(prompt_len, lane_lens, w)
        assert max(Counter(tokens).values()) == 1  # no token twice
        # KV read: prompt once + every worker's generated text, nothing else.
        assert view.num_tokens == prompt_len + sum(n - prompt_len for n in lane_lens)


@SETTINGS
@given(lockstep_lanes_st())
def test_contiguous_lockstep_states_are_accepted(case) -> None:
    prompt_len, lane_lens = case
    for w, view in enumerate(contiguous_views(prompt_len, lane_lens)):
        check_view_invariants(view, w, lane_lens)
        assert view.tokens() == expected_contiguous(prompt_len, lane_lens, w)


@pytest.mark.parametrize("n", [1, 2, 3, 8])
@pytest.mark.parametrize("prompt_len", [1, 5, 64])
def test_contiguous_without_generated_text_is_own_prompt(prompt_len: int, n: int) -> None:
    views = contiguous_views(prompt_len, [prompt_len] * n)
    for w, view in enumerate(views):
        assert view.spans == (Span(w, 0, prompt_len),)
        assert view.deltas() == [0]


def test_contiguous_single_worker_is_its_lane() -> None:
    """One worker attends exactly like a plain request: one span, delta 0."""
    for prompt_len, n in [(1, 1), (3, 10), (0, 4), (7, 7)]:
        (view,) = contiguous_views(prompt_len, [n])
        assert view.spans == (Span(0, 0, n),) and view.deltas() == [0]


def test_contiguous_two_workers_explicit() -> None:
    v0, v1 = contiguous_views(3, [5, 6])
    assert v0.spans == (Span(0, 0, 3), Span(1, 3, 6), Span(0, 3, 5))
    assert v1.spans == (Span(1, 0, 3), Span(0, 3, 5), Span(1, 3, 6))
    # Own text of worker 0 is stored at 3.. and positioned at 6..: delta 0 on itself,
    # the prompt moves by +3 and worker 1's text (stored 3.., positioned 3..) by +3.
    assert v0.view_starts() == [0, 3, 6]
    assert v0.deltas() == [3, 3, 0]
    assert v1.view_starts() == [0, 3, 5]
    assert v1.deltas() == [2, 2, 0]


# Exhaustive small cases against hand-written lists. For N = 1..3 and
# prompt_len = 0..4, every tuple of generated lengths 0..3; ``L`` maps the
# contiguous views of each (prompt_len, gens) to the explicit expected tokens.


def _explicit(prompt_len: int, gens: tuple[int, ...]) -> list[list[Token]]:
    """Written out in the most literal way: lane w is [p0 .. p_{P-1}, g0 .. g_{k-1}]."""
    P = prompt_len
    out = []
    for w in range(len(gens)):
        view = [(w, i) for i in range(P)]  # the prompt, read from the own lane
        for o in range(len(gens)):  # co-workers, in worker order
            if o == w:
                continue
            view += [(o, P + k) for k in range(gens[o])]
        view += [(w, P + k) for k in range(gens[w])]  # own tokens last
        out.append(view)
    return out


EXHAUSTIVE = [
    (p, gens)
    for p in range(5)
    for n in (1, 2, 3)
    for gens in itertools.product(range(4), repeat=n)
]


def test_contiguous_exhaustive_small() -> None:
    accepted = refused = 0
    for prompt_len, gens in EXHAUSTIVE:
        lane_lens = [prompt_len + g for g in gens]
        expected = _explicit(prompt_len, gens)
        # A view must end with the reader's own lane's last token (its query).
        ok = all(e and e[-1] == (w, lane_lens[w] - 1) for w, e in enumerate(expected))
        if not ok:
            with pytest.raises(ValueError):
                contiguous_views(prompt_len, lane_lens)
            refused += 1
            continue
        views = contiguous_views(prompt_len, lane_lens)
        for w, (view, exp) in enumerate(zip(views, expected)):
            assert view.tokens() == exp, (prompt_len, gens, w)
            assert view.num_tokens == len(exp)
            check_view_invariants(view, w, lane_lens)
        accepted += 1
    assert accepted + refused == len(EXHAUSTIVE) == 420
    assert accepted == 207 and refused == 213  # the grid really ran both branches


def test_contiguous_exhaustive_handwritten_examples() -> None:
    """A few of the grid's cases, spelled out by hand."""
    v = contiguous_views(2, [4, 3, 3])
    assert v[0].tokens() == [(0, 0), (0, 1), (1, 2), (2, 2), (0, 2), (0, 3)]
    assert v[1].tokens() == [(1, 0), (1, 1), (0, 2), (0, 3), (2, 2), (1, 2)]
    assert v[2].tokens() == [(2, 0), (2, 1), (0, 2), (0, 3), (1, 2), (2, 2)]
    v = contiguous_views(0, [1, 2])
    assert v[0].tokens() == [(1, 0), (1, 1), (0, 0)]
    assert v[1].tokens() == [(0, 0), (1, 0), (1, 1)]
    v = contiguous_views(1, [1, 1, 1])
    assert [x.tokens() for x in v] == [[(0, 0)], [(1, 0)], [(2, 0)]]


# ---------------------------------------------------------------- isolated


@SETTINGS
@given(lanes_st())
def test_isolated_properties(case) -> None:
    prompt_len, lane_lens = case
    views = isolated_views(prompt_len, lane_lens)
    assert views == build_views("isolated", prompt_len, lane_lens)
    assert len(views) == len(lane_lens)
    for w, (view, n) in enumerate(zip(views, lane_lens)):
        assert view.spans == (Span(w, 0, n),)
        assert view.deltas() == [0]
        assert view.own.lane == w and view.own.end == n
        assert view.num_tokens == n == len(view.tokens())
        assert view.tokens() == toks(w, 0, n)


# ---------------------------------------------------------------- combined


@SETTINGS
@given(combined_st(with_separators=False))
def test_combined_properties_without_separators(case) -> None:
    prompt_len, lane_lens, history, paragraph_starts, seps = case
    kw = dict(history=history, paragraph_starts=paragraph_starts)
    views = combined_views(prompt_len, lane_lens, **kw)
    assert views == build_views("combined", prompt_len, lane_lens, **kw)
    for w, view in enumerate(views):
        check_view_invariants(view, w, lane_lens)
        tokens = view.tokens()
        assert tokens == expected_combined(prompt_len, lane_lens, history, paragraph_starts, seps, w)
        counts = Counter(tokens)
        assert max(counts.values()) == 1, [t for t, c in counts.items() if c > 1]
        # Own unfinished step is exactly the last span (it is never merged away).
        assert view.own.start <= paragraph_starts[w]


@SETTINGS
@given(combined_st(with_separators=True))
def test_combined_properties_with_separators(case) -> None:
    prompt_len, lane_lens, history, paragraph_starts, seps = case
    kw = dict(history=history, paragraph_starts=paragraph_starts, separators=seps)
    views = build_views("combined", prompt_len, lane_lens, **kw)
    sep_spans = {
        name: getattr(seps, name) for name in ("history", "others", "pivot", "own")
        if getattr(seps, name) is not None
    }
    sep_tokens = {name: set(toks(s.lane, s.start, s.end)) for name, s in sep_spans.items()}
    for w, view in enumerate(views):
        check_view_invariants(view, w, lane_lens)
        tokens = view.tokens()
        assert tokens == expected_combined(prompt_len, lane_lens, history, paragraph_starts, seps, w)
        counts = Counter(tokens)
        n_others = sum(1 for o, n in enumerate(lane_lens) if o != w and n > paragraph_starts[o])
        # How many times each separator is used in this view.
        uses = {
            "history": 1 if history else 0,
            "others": 1 if n_others else 0,
            "pivot": n_others,  # once after every co-worker's unfinished step
            "own": 1,
        }
        for t, c in counts.items():
            # Text (the reader's prompt, finished and unfinished steps) appears once;
            # separators (inside lane 0's prompt) once per use, on top of that when
            # the reader is worker 0 and so reads lane 0's prompt as its own.
            is_text = t[1] >= prompt_len or t[0] == w
            expected = int(is_text) + sum(uses[name] for name, ts in sep_tokens.items() if t in ts)
            assert c == expected, (w, t, c, expected)
        if "pivot" in sep_tokens:
            pivot = next(iter(sep_tokens["pivot"]))
            assert counts[pivot] == n_others + (1 if w == 0 else 0)


def test_combined_explicit_with_separators() -> None:
    """Two workers, one finished step each, all four separators on lane 0's prompt."""
    P = 12
    seps = Separators(Span(0, 2, 5), Span(0, 5, 6), Span(0, 6, 9), Span(0, 9, 11))
    history = [Span(1, 12, 15), Span(0, 12, 14)]  # worker 1 finished first
    v0, v1 = combined_views(P, [17, 18], history, [14, 15], seps)
    assert v0.tokens() == (
        toks(0, 0, 12) + toks(0, 2, 5) + toks(1, 12, 15) + toks(0, 12, 14)
        + toks(0, 5, 6) + toks(1, 15, 18) + toks(0, 6, 9) + toks(0, 9, 11) + toks(0, 14, 17)
    )
    assert v1.tokens() == (
        toks(1, 0, 12) + toks(0, 2, 5) + toks(1, 12, 15) + toks(0, 12, 14)
        + toks(0, 5, 6) + toks(0, 14, 17) + toks(0, 6, 9) + toks(0, 9, 11) + toks(1, 15, 18)
    )
    assert v0.own == Span(0, 14, 17) and v1.own == Span(1, 15, 18)
    # v1: own text stored at 15.. is positioned after 12+3+3+2+1+3+3+2 = 29 tokens.
    assert v1.view_starts()[-1] == 29
    assert v1.deltas()[-1] == 0
    assert v1.deltas()[0] == (29 - 15) - (0 - 0)


def test_combined_pivot_once_per_coworker() -> None:
    seps = Separators(pivot=Span(0, 1, 2))
    views = combined_views(4, [6, 7, 8, 5], [], [4, 4, 4, 4], seps)
    for w, view in enumerate(views):
        n_others = sum(1 for o, n in enumerate([6, 7, 8, 5]) if o != w and n > 4)
        assert view.tokens().count((0, 1)) == n_others + (w == 0)


def test_combined_without_history_or_others_is_contiguous() -> None:
    """No finished step and every step starting at the prompt: same tokens as contiguous."""
    prompt_len, lane_lens = 5, [8, 6, 9]
    comb = combined_views(prompt_len, lane_lens, [], [prompt_len] * 3)
    cont = contiguous_views(prompt_len, lane_lens)
    assert [v.tokens() for v in comb] == [v.tokens() for v in cont]


def test_combined_promotion_changes_views_only() -> None:
    """Moving a finished step into the history keeps every lane's tokens in the view."""
    before = combined_views(3, [7, 6], [], [3, 3])
    after = combined_views(3, [7, 6], [Span(0, 3, 5)], [5, 3])
    for b, a in zip(before, after):
        assert Counter(b.tokens()) == Counter(a.tokens())
    assert after[1].tokens()[:5] == toks(1, 0, 3) + toks(0, 3, 5)
    assert after[0].spans == (Span(0, 0, 5), Span(1, 3, 6), Span(0, 5, 7))


def test_combined_needs_one_step_start_per_lane() -> None:
    with pytest.raises(ValueError):
        combined_views(2, [4, 4], [], [2])


# ---------------------------------------------------------------- normalize, errors

span_st = st.builds(
    lambda lane, start, n: Span(lane, start, start + n),
    st.integers(0, 2), st.integers(0, 6), st.integers(0, 3),
)


@SETTINGS
@given(st.lists(span_st, max_size=10))
def test_normalize_properties(spans) -> None:
    out = normalize(spans)
    assert [t for s in out for t in toks(s.lane, s.start, s.end)] == [
        t for s in spans for t in toks(s.lane, s.start, s.end)
    ]
    assert all(s.num_tokens > 0 for s in out)
    for a, b in zip(out, out[1:]):
        assert not (a.lane == b.lane and a.end == b.start)
    assert normalize(out) == out
    assert isinstance(out, tuple)


def test_normalize_examples() -> None:
    assert normalize([Span(0, 0, 3), Span(0, 3, 5)]) == (Span(0, 0, 5),)
    assert normalize([Span(0, 0, 2), Span(0, 2, 4), Span(0, 4, 9)]) == (Span(0, 0, 9),)
    assert normalize([Span(0, 0, 3), Span(0, 4, 5)]) == (Span(0, 0, 3), Span(0, 4, 5))
    assert normalize([Span(0, 0, 3), Span(1, 3, 5)]) == (Span(0, 0, 3), Span(1, 3, 5))
    # Not merged backwards: a span before its predecessor is a different order.
    assert normalize([Span(0, 3, 5), Span(0, 0, 3)]) == (Span(0, 3, 5), Span(0, 0, 3))
    assert normalize([Span(0, 2, 2), Span(1, 0, 1), Span(2, 4, 4)]) == (Span(1, 0, 1),)
    # An empty span between two continuing spans disappears, and they merge.
    assert normalize([Span(0, 0, 2), Span(1, 5, 5), Span(0, 2, 4)]) == (Span(0, 0, 4),)
    assert normalize([]) == ()
    assert normalize([Span(3, 1, 1)]) == ()


def test_span_and_view_validation() -> None:
    for args in [(-1, 0, 1), (0, -1, 1), (0, 3, 2)]:
        with pytest.raises(ValueError):
            Span(*args)
    with pytest.raises(ValueError):
        View(())
    assert Span(0, 2, 2).num_tokens == 0


def test_unknown_layout_is_refused() -> None:
    with pytest.raises(ValueError, match="layout"):
        build_views("diagonal", 3, [4, 5])
    with pytest.raises(ValueError, match="layout"):
        build_views("", 3, [4, 5])
    assert set(LAYOUTS) == {"contiguous", "isolated", "combined", "interleaved"}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_lane_shorter_than_prompt_is_refused(layout: str) -> None:
    kw = {"history": [], "paragraph_starts": [4, 2]} if layout in ("combined", "interleaved") else {}
    with pytest.raises(ValueError, match="prompt"):
        build_views(layout, 4, [5, 2], **kw)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_bad_group_is_refused(layout: str) -> None:
    kw = {"history": [], "paragraph_starts": []} if layout in ("combined", "interleaved") else {}
    with pytest.raises(ValueError):
        build_views(layout, 3, [], **kw)
    kw = {"history": [], "paragraph_starts": [0]} if layout in ("combined", "interleaved") else {}
    with pytest.raises(ValueError):
        build_views(layout, -1, [3], **kw)


@SETTINGS
@given(combined_st(with_separators=False), st.integers(0, 12), st.booleans())
def test_headers_at_the_prompt_tail_appear_only_where_the_view_places_them(case, cut, interleaved) -> None:
    """The engine's layout for collab: headers stored after ``prompt_end``; the prompt part of a view
    stops there, and each header appears once per use (the reader's own-lane tail never directly)."""
    prompt_len, lane_lens, history, paragraph_starts, _ = case
    end = min(cut, prompt_len)
    tail = list(range(end, prompt_len))
    names = ("history", "others", "pivot", "own")
    seps = Separators(**{name: Span(0, t, t + 1) for name, t in zip(names, tail)})
    layout = "interleaved" if interleaved else "combined"
    views = build_views(layout, prompt_len, lane_lens, history=history, paragraph_starts=paragraph_starts,
                        separators=seps, prompt_end=end)
    for w, view in enumerate(views):
        check_view_invariants(view, w, lane_lens)
        full = expected_combined(prompt_len, lane_lens, history, paragraph_starts, seps, w)
        # The prompt part is [0, end): the stored tail shows up only as headers.
        expected = [t for i, t in enumerate(full) if not (i < prompt_len and end <= t[1] < prompt_len)]
        if interleaved:  # no co-worker's unfinished step, so neither its header nor its pivots
            others = {(o, p) for o, n in enumerate(lane_lens) if o != w for p in range(paragraph_starts[o], n)}
            hidden = {(0, s.start) for s in (seps.others, seps.pivot) if s is not None}
            expected = [t for t in expected if t not in others and t not in hidden]
        assert view.tokens() == expected


def test_a_worker_without_unfinished_text_reads_its_own_lane() -> None:
    """Nothing fed yet (or stopped with everything in the history): a plain view of its own lane."""
    seps = Separators(own=Span(0, 9, 10))
    views = combined_views(10, [10, 12], [], [10, 10], seps, prompt_end=9)
    assert views[0] == View((Span(0, 0, 10),))
    assert views[1].tokens() == toks(1, 0, 9) + toks(0, 9, 10) + toks(1, 10, 12)
    with pytest.raises(ValueError, match="within the prompt"):
        combined_views(10, [12], [], [10], prompt_end=11)


@pytest.mark.parametrize("seed", range(20))
def test_contiguous_segments_built_directly_equal_the_views_segments(seed: int) -> None:
    """The direct builder a contiguous group decodes through gives what segments_of gives for the view, lanes with
    and without text, an empty prompt, a reader alone."""
    import random

    from vllm_hogwild.core.views.spans import build_views, contiguous_segments, segments_of

    rng = random.Random(seed)
    n = rng.randint(1, 6)
    p = rng.choice([0, 1, 7, 32, 45])
    lens = [p + rng.choice([0, 0, 1, 3, 17]) for _ in range(n)]
    tables = [tuple(range(100 * (lane + 1), 100 * (lane + 1) + 4)) for lane in range(n)]
    for w in range(n):
        if lens[w] == p:
            lens[w] += 1  # a reader decodes: its lane holds the token it feeds
        direct = contiguous_segments(w, p, lens, tables)
        (view,) = build_views("contiguous", p, lens, readers=[w])
        assert direct == segments_of(view, tables), (p, lens, w)
