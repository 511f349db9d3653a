"""Pure pieces of the integration: option parsing and checks, the request spec, member ids."""

from __future__ import annotations

import pytest

from vllm_hogwild.core.groups.group import parse_request_id
from vllm_hogwild.core.options import (
    EngineOptions,
    HogwildOptionError,
    PromptTail,
    RequestOptions,
    RequestSpec,
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


def test_request_ids_follow_vllm_fan_out() -> None:
    assert parse_request_id("abc-123", 1) == ("abc-123", 0)
    assert parse_request_id("0_abc-123", 2) == ("abc-123", 0)
    assert parse_request_id("3_x_y", 4) == ("x_y", 3)
    for bad in ("abc", "4_abc", "x_abc"):
        with pytest.raises(ValueError):
            parse_request_id(bad, 4)


def test_step_layouts_and_step_end_option() -> None:
    assert parse_request({"hogwild_layout": "combined"}).step_end is None
    assert parse_request({"hogwild": {"layout": "interleaved", "step_end": "\n\n"}}).step_end == "\n\n"
    for extra, field in [({"hogwild_layout": "combined", "hogwild_step_end": "("}, "hogwild_step_end"),
                         ({"hogwild": {"layout": "combined", "step_end": ""}}, "hogwild.step_end"),
                         ({"hogwild": {"layout": "contiguous", "step_end": "x"}}, "hogwild.step_end")]:
        with pytest.raises(HogwildOptionError) as info:
            parse_request(extra)
        assert info.value.parameter == field


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


def test_request_spec_round_trips_through_the_engine_cores_wire() -> None:
    """The spec crosses to the engine core inside SamplingParams.extra_args, as msgpack-able plain data."""
    import msgpack

    tail = PromptTail(120, (120, 125), (125, 133), (133, 136), (136, 142))
    for spec in (RequestSpec(RequestOptions(), 2),
                 RequestSpec(parse_request({"hogwild_protocol": "collab", "hogwild_task": "code"}), 4, tail)):
        wire = msgpack.unpackb(msgpack.packb(spec.to_wire()))
        assert RequestSpec.from_wire(wire) == spec


def test_accept_steps_is_a_boolean_option() -> None:
    from vllm_hogwild.core.errors import HogwildOptionError
    from vllm_hogwild.core.options import parse_request

    assert parse_request({"hogwild_accept_steps": True}).accept_steps is True
    assert parse_request({"hogwild": {}}).accept_steps is False
    assert parse_request({"hogwild_accept_steps": 1}).accept_steps is True  # a JSON true through vllm_xargs
    for bad in (2, "true", None, [True], 1.0):
        with pytest.raises(HogwildOptionError) as info:
            parse_request({"hogwild": {"accept_steps": bad}})
        assert info.value.parameter == "hogwild.accept_steps"
