"""The serve flags fold into the engine switch; the metrics snapshot survives the trip and leaves vLLM's stats as they were."""

from __future__ import annotations

import argparse
from types import SimpleNamespace

import pytest

from vllm_hogwild.serving.cli import add_cli_args, fold_cli_args
from vllm_hogwild.core.options import HogwildOptionError


def _parse(argv: list[str]):
    parser = add_cli_args(argparse.ArgumentParser())
    args = parser.parse_args(argv)
    engine_args = SimpleNamespace(additional_config={"other": 1})
    fold_cli_args(args, engine_args)
    return engine_args.additional_config


def test_plugin_flag_switches_hogwild_on_with_engine_options() -> None:
    assert _parse([]) == {"other": 1}  # stock
    assert _parse(["--plugin", "hogwild"]) == {"other": 1, "hogwild": {}}
    assert _parse(["--plugin", "hogwild", "--hogwild-max-workers", "3"]) == {"other": 1, "hogwild": {"max_workers": 3}}


def test_flags_override_options_given_in_additional_config() -> None:
    parser = add_cli_args(argparse.ArgumentParser())
    args = parser.parse_args(["--plugin", "hogwild", "--hogwild-max-workers", "5"])
    engine_args = SimpleNamespace(additional_config={"hogwild": {"max_workers": 2}})
    fold_cli_args(args, engine_args)
    assert engine_args.additional_config == {"hogwild": {"max_workers": 5}}


@pytest.mark.parametrize("argv,field", [
    (["--hogwild-max-workers", "3"], "--hogwild-max-workers"),
    (["--plugin", "hogwild", "--hogwild-max-workers", "0"], "--hogwild-max-workers"),
    (["--plugin", "hogwild", "--hogwild-max-workers", "65"], "--hogwild-max-workers"),
])
def test_bad_flags_name_the_flag(argv, field) -> None:
    with pytest.raises(HogwildOptionError) as info:
        _parse(argv)
    assert info.value.parameter == field


def test_kv_flag_takes_the_two_modes_and_refuses_others() -> None:
    assert _parse(["--plugin", "hogwild", "--hogwild-kv", "reserve"]) == {"other": 1, "hogwild": {"kv": "reserve"}}
    assert _parse(["--plugin", "hogwild", "--hogwild-kv", "on-demand"]) == {"other": 1, "hogwild": {"kv": "on-demand"}}
    assert _parse(["--plugin", "hogwild"]) == {"other": 1, "hogwild": {}}  # the default (on-demand) is the option's
    parser = add_cli_args(argparse.ArgumentParser())
    with pytest.raises(SystemExit):
        parser.parse_args(["--plugin", "hogwild", "--hogwild-kv", "lazy"])


def test_kv_option_given_in_additional_config_is_checked_by_name() -> None:
    from vllm_hogwild.core.options import EngineOptions

    assert EngineOptions.from_additional_config({"hogwild": {}}).kv == "on-demand"
    assert EngineOptions.from_additional_config({"hogwild": {"kv": "reserve"}}).kv == "reserve"
    with pytest.raises(HogwildOptionError) as info:
        EngineOptions.from_additional_config({"hogwild": {"kv": ["lazy"]}})
    assert info.value.parameter == "additional_config.hogwild.kv"


def test_unknown_plugin_name_is_an_argparse_error() -> None:
    parser = add_cli_args(argparse.ArgumentParser())
    with pytest.raises(SystemExit):
        parser.parse_args(["--plugin", "hogwld"])


def test_adding_the_flags_twice_is_harmless() -> None:
    parser = add_cli_args(add_cli_args(argparse.ArgumentParser()))
    assert parser.parse_args(["--plugin", "hogwild"]).plugin == ["hogwild"]


@pytest.mark.vllm
def test_snapshots_travel_on_the_plugins_own_channel_in_order() -> None:
    """The engine core pushes, the front end drains; with nobody reading, sends are dropped, never blocked."""
    from vllm_hogwild.core.stats_channel import StatsReceiver, StatsSender, new_address

    address = new_address()
    sender = StatsSender(address, engine_index=0)
    assert not sender.send({"groups_running": 0})  # nobody listens yet: dropped at once
    receiver = StatsReceiver(address)
    import time

    # A hang guard: the connection completes in 0.2 s or less on a loaded 2-core machine, 5 s is 25 times that.
    deadline = time.monotonic() + 5
    while not sender.send({"groups_running": 1}) and time.monotonic() < deadline:
        time.sleep(0.01)  # the connection completes
    for k in range(2, 5):
        assert sender.send({"groups_running": k})
    got = []
    while len(got) < 4 and time.monotonic() < deadline:
        got += receiver.drain()
    assert [m["groups_running"] for m in got] == [1, 2, 3, 4] and {m["engine"] for m in got} == {0}
    assert receiver.drain() == []
    sender.close()
    receiver.close()


@pytest.mark.vllm
def test_stat_logger_turns_snapshots_into_series() -> None:
    from prometheus_client import REGISTRY
    from vllm.v1.metrics.stats import SchedulerStats

    from vllm_hogwild.serving.metrics import HogwildStatLogger

    config = SimpleNamespace(model_config=SimpleNamespace(served_model_name="m"),
                             additional_config={"hogwild": {}, "hogwild_runtime": {"attention": "cpu-op", "isa": "avx2"}})
    logger = HogwildStatLogger(config, [0])
    HogwildStatLogger(config, [0])  # a second engine in one process replaces the series, no duplicate error
    logger = HogwildStatLogger(config, [0])
    end = {"num_workers": 3, "output_lens": [4, 5, 6], "coworker_reads": [10, 20, 30], "num_prefill_saved": 256,
           "latency_s": 1.5, "admission_wait_s": 0.25}
    logger.apply({"engine": 0, "groups_running": 2, "groups_waiting": 1, "kv_free_blocks": 99,
                  "member_preemptions": 0, "ended": [end, {**end, "admission_wait_s": None}]})
    value = lambda name: REGISTRY.get_sample_value(name, {"model_name": "m", "engine": "0"})  # noqa: E731
    assert value("hogwild:groups_running") == 2 and value("hogwild:groups_waiting") == 1
    assert value("hogwild:kv_cache_free_blocks") == 99
    assert value("hogwild:groups_ended_total") == 2
    assert value("hogwild:workers_per_group_sum") == 6
    assert value("hogwild:group_generation_tokens_sum") == 30
    assert value("hogwild:coworker_tokens_read_count") == 6 and value("hogwild:coworker_tokens_read_sum") == 120
    assert value("hogwild:prefill_tokens_saved_total") == 512
    assert value("hogwild:group_latency_seconds_count") == 2
    assert value("hogwild:admission_wait_seconds_count") == 1  # a group never admitted has no wait
    # Preemption counters arrive as the engine's running totals and become increments.
    base = {"engine": 0, "groups_running": 2, "groups_waiting": 1, "kv_free_blocks": 99, "ended": []}
    logger.apply({**base, "group_preemptions": 2, "replayed_tokens": 40, "member_preemptions": 0})
    logger.apply({**base, "group_preemptions": 2, "replayed_tokens": 40, "member_preemptions": 0})  # no change
    logger.apply({**base, "group_preemptions": 3, "replayed_tokens": 65, "member_preemptions": 0})
    assert value("hogwild:group_preemptions_total") == 3 and value("hogwild:replayed_tokens_total") == 65
    assert value("hogwild:member_preemptions_total") == 0
    logger.record(SchedulerStats(), None, engine_idx=0)  # a step without a snapshot changes nothing
    assert value("hogwild:groups_running") == 2
    # A snapshot that arrives after its step's outputs were recorded (the engine then idle: no more records)
    # is taken by vLLM's periodic stats call.
    late = [{**base, "groups_running": 0, "kv_free_blocks": 120, "group_preemptions": 3, "replayed_tokens": 65,
             "member_preemptions": 0}]
    logger._channel = SimpleNamespace(drain=lambda: [late.pop()] if late else [])  # the channel's one method
    logger.log()
    assert value("hogwild:groups_running") == 0 and value("hogwild:kv_cache_free_blocks") == 120
    assert REGISTRY.get_sample_value("hogwild:attention_info",
                                     {"model_name": "m", "engine": "0", "path": "cpu-op", "isa": "avx2"}) == 1
