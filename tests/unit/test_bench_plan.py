"""``bench plan`` (no engine): a smoke run of its quick rows, and its overhead sizing helper."""

from __future__ import annotations

from benchmarks import bench
from benchmarks.bench.throughput import overhead_blocks


def test_plan_times_both_paths_on_the_same_rows_and_reports_its_targets() -> None:
    report = bench.run(bench.build_parser().parse_args(["plan", "--quick", "--rounds", "1", "--steps", "5"]))
    rows = report["results"]
    assert [(r["groups"], r["workers"], r["view_tokens"]) for r in rows] == [(1, 8, 1024), (1, 8, 32768), (4, 4, 1024)]
    for r in rows:
        assert 0 < r["gpu_steady_ms"] and 0 < r["gpu_rebuild_ms"] and 0 < r["cpu_ms"] and 0 < r["columns_ms"]
    assert {t["rows"] for t in report["targets"]} == {"1 x 8 at 32768", "1 x 8: 32k over 1k"}
    table = bench.markdown(report)
    assert "| 1 x 8 | 32,768 | 8 |" in table and "| target | wanted | measured | met |" in table


def test_bench_overhead_sizes_its_cache_from_the_blocks_its_sequences_share() -> None:
    # 32 groups of 8 at 1,024-token prompts: the prompt's 8 full blocks once a group, one block a worker beyond
    # them, two spare a sequence (3x every sequence's blocks had asked for 6,912 blocks, 40.8 GB of the default
    # model's KV).
    assert overhead_blocks(32, 8, 0, 1024, 128, 4096) == 32 * (8 + 8) + 2 * 256 + 16
    assert overhead_blocks(1, 1, 0, 10, 10, 4096) == 4096 // 128 + 2  # at least one whole context


def test_bench_overhead_refuses_a_cache_the_machine_cannot_hold_naming_what_to_pass() -> None:
    import pytest

    from benchmarks.bench import common

    with pytest.raises(SystemExit, match=r"needs 10000000 KV blocks .* GiB available; pass fewer --groups"):
        common.check_kv_room("tiny", 10_000_000, 128, "bench overhead", "fewer --groups")
    common.check_kv_room("tiny", 4, 128, "bench overhead", "fewer --groups")  # a cache that fits: no error
