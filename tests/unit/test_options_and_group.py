"""Pure pieces of the integration: option parsing and checks, member ids, group segments."""

from __future__ import annotations

import pytest

from vllm_hogwild.core.group import Group, Lane, parse_member, segments_of, step_segments, member_views
from vllm_hogwild.core.options import (
    EngineOptions,
    HogwildOptionError,
    RequestOptions,
    blocks_for_group,
    check_request,
    parse_request,
    requested,
)


def test_switch_reads_additional_config() -> None:
    assert EngineOptions.from_additional_config(None) is None
    assert EngineOptions.from_additional_config({"other": 1}) is None
    assert EngineOptions.from_additional_config({"hogwild": False}) is None
    assert EngineOptions.from_additional_config({"hogwild": True}) == EngineOptions()
    assert EngineOptions.from_additional_config({"hogwild": {"max_workers": 3}}).max_workers == 3
    for bad, field in [({"max_workers": 0}, "max_workers"), ({"max_workers": "4"}, "max_workers"),
                       ({"workers": 2}, "workers"), ([1], "additional_config.hogwild")]:
        with pytest.raises(HogwildOptionError, match=field):
            EngineOptions.from_additional_config({"hogwild": bad})


def test_request_options_nested_and_flat() -> None:
    assert not requested(None) and not requested({}) and not requested({"other": 1})
    assert requested({"hogwild": {}}) and requested({"hogwild_layout": "isolated"})
    assert parse_request({"hogwild": {}}) == RequestOptions()
    assert parse_request({"hogwild": {"layout": "isolated"}}).layout == "isolated"
    assert parse_request({"hogwild_layout": "isolated", "hogwild_protocol": "raw"}) == RequestOptions("isolated", "raw")
    with pytest.raises(HogwildOptionError, match="^hogwild_layout: unknown layout 'x'"):
        parse_request({"hogwild_layout": "x"})
    with pytest.raises(HogwildOptionError, match="^hogwild.layout: unknown layout 'x'"):
        parse_request({"hogwild": {"layout": "x"}})
    with pytest.raises(HogwildOptionError, match="^hogwild_speed: unknown Hogwild option"):
        parse_request({"hogwild_speed": 1})
    with pytest.raises(HogwildOptionError, match="^hogwild: expected a dict"):
        parse_request({"hogwild": "contiguous"})


@pytest.mark.parametrize("prompt", [0, 1, 31, 32, 33, 100])
@pytest.mark.parametrize("max_tokens", [1, 32, 70])
@pytest.mark.parametrize("n", [1, 2, 5])
def test_group_block_budget_counts_shared_prompt_once(prompt, max_tokens, n) -> None:
    bs = 32
    lanes = [prompt + max_tokens] * n
    # Enumerate blocks: the prompt's full blocks shared, the rest of each lane private.
    shared = {("prompt", b) for b in range(prompt // bs)}
    private = {(w, b) for w, n_tok in enumerate(lanes) for b in range(prompt // bs, -(-n_tok // bs))}
    assert blocks_for_group(prompt, max_tokens, n, bs) == len(shared) + len(private)


def test_check_request_fields() -> None:
    opts = EngineOptions(max_workers=4)
    kw = dict(prompt_len=100, max_model_len=1000, block_size=32, num_kv_blocks=100)
    assert check_request(opts, 4, max_tokens=200, **kw) == 200
    assert check_request(opts, 3, max_tokens=None, **kw) == 300  # an equal share of the room
    assert check_request(opts, 3, max_tokens=900, **kw) == 300  # the whole room: what vLLM's server fills in
    cases = [(opts, 5, 10, "^n: 5 workers"),
             (opts, 0, 10, "^n: 0 workers"), (opts, 4, 226, "^max_tokens: prompt 100 \\+ n 4")]
    for o, n, mt, pattern in cases:
        with pytest.raises(HogwildOptionError, match=pattern):
            check_request(o, n, max_tokens=mt, **kw)
    with pytest.raises(HogwildOptionError, match="^max_tokens: the group needs"):
        check_request(opts, 4, max_tokens=200, **{**kw, "num_kv_blocks": 20})


def test_member_ids_follow_vllm_fan_out() -> None:
    assert parse_member("abc-123", 1) == ("abc-123", 0)
    assert parse_member("0_abc-123", 2) == ("abc-123", 0)
    assert parse_member("3_x_y", 4) == ("x_y", 3)
    for bad in ("abc", "4_abc", "x_abc"):
        with pytest.raises(ValueError):
            parse_member(bad, 4)


def lanes_of(prompt: int, gen: list[int], bs: int = 4) -> list[Lane]:
    return [Lane(tuple(range(100 * w, 100 * w + -(-(prompt + g) // bs))), prompt + g) for w, g in enumerate(gen)]


def test_plain_views_go_native() -> None:
    one = Group("g", 1, RequestOptions(), 8, prompt_len=5)
    assert step_segments(one, lanes_of(5, [3]), [0]) == {}
    iso = Group("g", 3, RequestOptions(layout="isolated"), 8, prompt_len=5)
    assert step_segments(iso, lanes_of(5, [3, 3, 3]), [0, 1, 2]) == {}


def test_contiguous_segments_read_every_lane_with_view_deltas() -> None:
    group = Group("g", 3, RequestOptions(), 8, prompt_len=5)
    lanes = lanes_of(5, [2, 2, 2])
    segs = step_segments(group, lanes, [0, 1, 2])
    assert sorted(segs) == [0, 1, 2]
    # Worker 1 reads [prompt of lane 1][lane 0 gen][lane 2 gen][lane 1 gen]; its query sits at view pos 10.
    s = segs[1]
    assert [(seg.block_ids, seg.start, seg.end) for seg in s] == [
        (lanes[1].block_ids, 0, 5), (lanes[0].block_ids, 5, 7), (lanes[2].block_ids, 5, 7), (lanes[1].block_ids, 5, 7)]
    # delta = (view_pos(q) - stored_pos(q)) - (v - s): query stored at 6, viewed at 10.
    assert [seg.delta for seg in s] == [4 - 0, 4 - (5 - 5), 4 - (7 - 5), 0 + 4 - 4]
    assert segments_of(member_views(group, lanes)[1], lanes) == s


def test_coworker_reads_and_prefill_saved_are_counted_per_worker() -> None:
    group = Group("g", 3, RequestOptions(), 8, prompt_len=5)
    step_segments(group, lanes_of(5, [3, 1, 4]), [0, 1, 2])
    assert group.coworker_reads == [1 + 4, 3 + 4, 3 + 1]  # the prompt is nobody's
    step_segments(group, lanes_of(5, [4, 2, 4]), [1])  # only worker 1 decodes this step
    assert group.coworker_reads == [5, 7 + 8, 4]
    iso = Group("g", 2, RequestOptions(layout="isolated"), 8, prompt_len=5)
    step_segments(iso, lanes_of(5, [3, 3]), [0, 1])
    assert iso.coworker_reads == [0, 0]
    group.prefill_by_worker = [5, 1, 1]  # worker 0 computed the prompt, the others its last token
    assert group.num_prefill_saved == 2 * 5 - 2
    group.prefill_by_worker = [5, 5, 5]  # nothing shared
    assert group.num_prefill_saved == 0


def test_step_layouts_and_step_end_option() -> None:
    assert parse_request({"hogwild_layout": "combined"}).step_end is None
    assert parse_request({"hogwild": {"layout": "interleaved", "step_end": "\n\n"}}).step_end == "\n\n"
    for extra, field in [({"hogwild_layout": "combined", "hogwild_step_end": "("}, "hogwild_step_end"),
                         ({"hogwild": {"layout": "combined", "step_end": ""}}, "hogwild.step_end"),
                         ({"hogwild": {"layout": "contiguous", "step_end": "x"}}, "hogwild.step_end")]:
        with pytest.raises(HogwildOptionError) as info:
            parse_request(extra)
        assert info.value.parameter == field


def test_combined_group_views_follow_its_steps() -> None:
    group = Group("g", 2, RequestOptions(layout="combined", step_end="!"), 8, prompt_len=5)
    assert group.steps is not None and Group("h", 2, RequestOptions(), 8, prompt_len=5).steps is None
    group.steps.on_sampled(0, 5, "go!")  # worker 0's first step is its first token
    group.steps.on_sampled(1, 5, "b")
    lanes = lanes_of(5, [2, 2])  # both fed their second token: worker 0's step joins
    views = member_views(group, lanes)
    assert group.steps.history[0].lane == 0 and (group.steps.history[0].start, group.steps.history[0].end) == (5, 6)
    # Worker 1 reads: prompt, the history (worker 0's step), worker 0's live step, its own text.
    assert [(s.lane, s.start, s.end) for s in views[1].spans] == [(1, 0, 5), (0, 5, 7), (1, 5, 7)]


def test_named_protocol_needs_a_step_layout() -> None:
    assert parse_request({"hogwild_layout": "combined", "hogwild_protocol": "named"}).protocol == "named"
    with pytest.raises(HogwildOptionError) as info:
        parse_request({"hogwild_protocol": "named"})  # contiguous has no steps
    assert info.value.parameter == "hogwild_protocol"


def test_answer_pattern_option() -> None:
    assert parse_request({"hogwild_answer_pattern": r"\\boxed\{(.*)\}"}).answer_pattern == r"\\boxed\{(.*)\}"
    for value in ("(", "no group", ""):
        with pytest.raises(HogwildOptionError) as info:
            parse_request({"hogwild": {"answer_pattern": value}})
        assert info.value.parameter == "hogwild.answer_pattern"


def test_redundancy_every_option() -> None:
    named = {"hogwild_layout": "combined", "hogwild_protocol": "named"}
    assert parse_request({**named, "hogwild_redundancy_every": 64}).redundancy_every == 64
    for extra in ({**named, "hogwild_redundancy_every": -1}, {**named, "hogwild_redundancy_every": "x"},
                  {"hogwild_redundancy_every": 8}):
        with pytest.raises(HogwildOptionError) as info:
            parse_request(extra)
        assert info.value.parameter == "hogwild_redundancy_every"
