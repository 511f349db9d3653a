"""Full CUDA graphs on the Triton path, the builder's and the runners' side, checked on the CPU.

vLLM's FlashAttention builder and its graph dispatchers cannot run here (no GPU), so the Hogwild builder mixin is
put in front of a stand-in native builder (it records the metadata it was asked for), and the runners' dispatch
wrappers around stand-in dispatchers: what is checked is the plugin's own logic around them. The kernels that a
graph replays are checked on the CPU by ``tests/graph_replay_check.py``; vLLM's mode resolution with the real
builder classes by ``tests/integration/test_gpu_settings.py``.
"""

from __future__ import annotations

import dataclasses
import random
from types import SimpleNamespace

import pytest
import torch

from vllm_hogwild.attention import segment_attention as sa
from vllm_hogwild.core.views.registry import StepSegments, ViewRegistry, max_segments
from vllm_hogwild.core.views.spans import SegmentColumns
from vllm_hogwild.runner.context import StepViews, get_step

pytestmark = pytest.mark.vllm

BS, HQ, H, D = 16, 4, 2, 32


@dataclasses.dataclass
class Common:
    """The fields of vLLM's CommonAttentionMetadata the mixin reads (and its ``replace``)."""

    num_reqs: int
    num_actual_tokens: int
    query_start_loc_cpu: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu_upper_bound: torch.Tensor | None = None
    _num_computed_tokens_cache: object = None

    def replace(self, **kw):
        return dataclasses.replace(self, **kw)


class NativeBuilder:
    """A stand-in for a platform's builder: remembers the metadata it built (and from what)."""

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device) -> None:
        self.kv_cache_spec, self.vllm_config, self.device = kv_cache_spec, vllm_config, device

    @classmethod
    def get_cudagraph_support(cls, vllm_config, kv_cache_spec):
        from vllm.v1.attention.backend import AttentionCGSupport

        return AttentionCGSupport.ALWAYS

    def build(self, common_prefix_len, common_attn_metadata, fast_build=False):
        return SimpleNamespace(common=common_attn_metadata)

    def build_for_cudagraph_capture(self, common_attn_metadata):
        return self.build(0, common_attn_metadata)


def builder(path: str = "triton", max_workers: int = 4, capture: int = 8):
    from vllm_hogwild.runner.backend import HogwildBuilderMixin

    class Builder(HogwildBuilderMixin, NativeBuilder):
        pass

    config = SimpleNamespace(
        additional_config={"hogwild": {"max_workers": max_workers}, "hogwild_runtime": {"attention": path}},
        model_config=SimpleNamespace(hf_text_config={"model_type": "llama", "rope_theta": 1e4, "head_dim": D,
                                                     "hidden_size": D * HQ, "num_attention_heads": HQ},
                                     max_model_len=512, get_num_attention_heads=lambda parallel: HQ),
        compilation_config=SimpleNamespace(max_cudagraph_capture_size=capture),
        scheduler_config=SimpleNamespace(max_num_seqs=4), parallel_config=None)
    spec = SimpleNamespace(block_size=BS, num_kv_heads=H, head_size=D)
    return Builder(spec, ["layer"], config, torch.device("cpu"))


def step_views(groups: int, workers: int = 3, prompt: int = 20, gen: int = 5):
    """Decode rows of ``groups`` contiguous groups as the registry makes them, and the batch's metadata."""
    columns, flat, req_ids = SegmentColumns(), {}, []
    for g in range(groups):
        lens = [prompt + gen + w for w in range(workers)]
        tables = [tuple(range(100 * g + 10 * w, 100 * g + 10 * w + -(-n // BS))) for w, n in enumerate(lens)]
        base = columns.add_tables(tables, [(g * workers + w, 1) for w in range(workers)])
        for w in range(workers):
            assert columns.add_contiguous(w, prompt, lens, base)
            flat[f"{w}_{g}"] = len(columns) - 1
            req_ids.append(f"{w}_{g}")
    n = len(req_ids)
    views = StepViews(StepSegments(flat=flat, columns=columns), tuple(req_ids), n)
    common = Common(n, n, torch.arange(n + 1, dtype=torch.int32), torch.full((n,), 99, dtype=torch.int32))
    return views, common


def test_the_capture_freezes_the_buffers_and_records_an_empty_plan_for_every_layer() -> None:
    b = builder()
    step = get_step()
    step.reset()
    step.graph_room = None
    _, common = step_views(1)
    metadata = b.build_for_cudagraph_capture(common)
    plan = step.plan_for(metadata).plan
    assert plan.mode is sa.PlanMode.TRITON and plan.items.num_pairs == 0 and plan.items.always_launch
    assert b.hogwild_planner.frozen and step.graph_room == (8, 8 * 2 * (4 + 2), 4 * 4)
    packed = b.hogwild_planner.buffers.packed
    assert int(packed[0]) == 0  # counts: no row, so a replayed launch does nothing
    # A real step: its plan goes into the same buffers; a full graph's step keeps the native metadata whole.
    views, common = step_views(2)
    step.reset()
    step.full_graph = True
    metadata = b.build(0, common, hogwild_views=views)
    assert metadata.common is common
    got = step.plan_for(metadata).plan.items
    assert got.buffers.packed is packed and got.num_rows == 6 and int(packed[0]) == 6
    # Not a full graph: each Hogwild row's native context is its own query token.
    step.reset()
    step.full_graph = False
    metadata = b.build(0, common, hogwild_views=views)
    assert metadata.common is not common and metadata.common.seq_lens.tolist() == [1] * 6
    # A step without Hogwild rows after it: the counts go back to none.
    step.reset()
    b.build(0, common)
    assert int(packed[0]) == 0
    step.graph_room = None


def test_a_step_too_large_for_the_frozen_buffers_plans_on_its_own_unless_it_replays_a_graph() -> None:
    b = builder(capture=4)
    step = get_step()
    step.reset()
    step.graph_room = None
    b.build_for_cudagraph_capture(step_views(1)[1])
    packed = b.hogwild_planner.buffers.packed
    views, common = step_views(3)  # 9 rows, room for 4
    step.reset()
    metadata = b.build(0, common, hogwild_views=views)  # not a full graph: an eager plan of its own
    got = step.plan_for(metadata).plan.items
    assert got.buffers.packed is not packed and got.num_rows == 9
    step.reset()
    step.full_graph = True
    with pytest.raises(RuntimeError, match="does not fit the plan buffers"):
        b.build(0, common, hogwild_views=views)
    step.full_graph = False
    step.graph_room = None


def test_the_torch_path_gives_up_full_graphs_and_the_platform_answers_without_hogwild() -> None:
    from vllm.v1.attention.backend import AttentionCGSupport

    b = builder("torch")
    assert type(b).get_cudagraph_support(b.vllm_config, None) == AttentionCGSupport.NEVER
    b = builder("triton")
    assert type(b).get_cudagraph_support(b.vllm_config, None) == AttentionCGSupport.UNIFORM_BATCH
    off = SimpleNamespace(additional_config={})
    assert type(b).get_cudagraph_support(off, None) == AttentionCGSupport.ALWAYS


def test_the_v1_dispatch_keeps_a_step_that_may_not_fit_off_full_graphs_and_records_the_choice() -> None:
    from vllm.config import CUDAGraphMode

    from vllm_hogwild.runner import v1
    from vllm_hogwild.runner.worker_core import WorkerCore

    asked = []

    class Dispatcher:
        def dispatch(self, num_tokens, uniform_decode=False, has_lora=False, num_active_loras=0, valid_modes=None,
                     invalid_modes=None):
            asked.append(invalid_modes)
            mode = CUDAGraphMode.PIECEWISE if invalid_modes and CUDAGraphMode.FULL in invalid_modes else \
                CUDAGraphMode.FULL
            return mode, SimpleNamespace(num_tokens=num_tokens)

    core, dispatcher = WorkerCore(), Dispatcher()
    v1.install_graph_choice(dispatcher, core)
    core.context.eager_attention, core.context.full_graph = False, False
    assert dispatcher.dispatch(8, uniform_decode=True)[0] == CUDAGraphMode.FULL and core.context.full_graph
    core.context.eager_attention, core.context.full_graph = True, False
    mode, _ = dispatcher.dispatch(8, uniform_decode=True, invalid_modes={CUDAGraphMode.NONE})
    assert mode == CUDAGraphMode.PIECEWISE and not core.context.full_graph
    assert asked[-1] == {CUDAGraphMode.NONE, CUDAGraphMode.FULL}
    core.context.eager_attention = False


def test_the_v2_dispatch_runs_a_step_that_may_not_fit_eagerly_and_records_the_choice() -> None:
    from vllm.config import CUDAGraphMode
    from vllm.v1.worker.gpu.cudagraph_utils import BatchExecutionDescriptor

    from vllm_hogwild.runner import v2
    from vllm_hogwild.runner.worker_core import WorkerCore

    class Manager:
        def dispatch(self, num_reqs, num_tokens, uniform_token_count, num_active_loras=0, max_query_len=None,
                     num_ubatches=1):
            return BatchExecutionDescriptor(cg_mode=CUDAGraphMode.FULL, num_tokens=16, num_reqs=16)

    core, manager = WorkerCore(), Manager()
    v2.install_graph_choice(manager, core)
    core.context.eager_attention, core.context.full_graph = False, False
    assert manager.dispatch(5, 5, 1).cg_mode == CUDAGraphMode.FULL and core.context.full_graph
    core.context.eager_attention, core.context.full_graph = True, False
    desc = manager.dispatch(5, 5, 1)
    assert desc.cg_mode == CUDAGraphMode.NONE and (desc.num_tokens, desc.num_reqs) == (5, 5)
    assert not core.context.full_graph
    core.context.eager_attention = False


@pytest.mark.parametrize("layout", ["contiguous", "combined", "interleaved"])
@pytest.mark.parametrize("seed", range(4))
def test_the_bound_before_the_views_holds_every_step_s_rows_and_pairs(layout: str, seed: int) -> None:
    """``ViewRegistry.max_pairs`` (what the adapters compare with a captured graph's room before vLLM chooses the
    step's graph, from the wire and the scheduled tokens alone) is at least the rows and pairs of the plan the
    step's views then make, step after step of a group whose history grows."""
    from tests.unit.table_engine import FakeEngine
    from vllm_hogwild.attention.step_plan import StepPlanner

    rng = random.Random(seed)
    engine = FakeEngine(prompt_len=5)
    paragraphs = {"step_end": "[.!?]"} if layout != "contiguous" else {}
    requests = engine.add_group("g", rng.randint(2, 5), 40, layout=layout, **paragraphs)
    scripts = {r.request_id: "".join(rng.choice(["a", "b ", ".", "!", "c"]) for _ in range(9)) for r in requests}
    registry, planner, checked = ViewRegistry(), StepPlanner(4, _rope()), 0
    for _ in range(40):
        if not engine.table:
            break
        wire = engine.step(lambda r, k: ord(scripts[r.request_id][k % len(scripts[r.request_id])]))
        scheduled = {row.request_id: row.num_scheduled for row in engine.rows}
        rows_bound, pairs_bound = registry.max_pairs(scheduled, wire)
        segments = registry.apply(wire, lambda lanes: [r for r in engine.rows if r.request_id in lanes],
                                  engine.block_ids)
        general = [sa.QueryRow(k, 1, segs) for k, segs in enumerate(segments.general.values())]
        flat = (segments.columns, list(range(len(general), len(general) + len(segments.columns))))
        if not general and not len(segments.columns):
            continue
        plan = sa.plan_rows("triton", general, 4, planner.rope, flat=flat, planner=planner)
        assert rows_bound >= plan.items.num_rows and pairs_bound >= plan.items.num_pairs, (rows_bound, pairs_bound)
        checked += 1
    assert checked >= 3


def _rope():
    from vllm_hogwild.core.views.rope import RopeSpec

    return RopeSpec.from_hf_config({"model_type": "llama", "rope_theta": 1e4, "head_dim": D, "hidden_size": D * HQ,
                                    "num_attention_heads": HQ})


def test_max_segments_counts_each_layout_s_parts() -> None:
    assert max_segments(SimpleNamespace(request_ids=("a", "b", "c"), layout="contiguous")) == 4
    assert max_segments(SimpleNamespace(request_ids=("a", "b", "c"), layout="combined"), history=5) == 5 + 9 + 6
    assert ViewRegistry().max_pairs({"x": 1}, None) == (0, 0)  # a plain request counts nothing


@pytest.mark.parametrize("seed", range(20))
def test_the_fork_join_bound_holds_every_lane_s_view(seed: int) -> None:
    """A fork/join request's rows read the forks laid in (each branch, and the text around each fork): the bound
    holds for random chains of joined forks, nested ones and hogwild branches included."""
    from vllm_hogwild.core.options import FORKJOIN_LAYOUT
    from vllm_hogwild.core.views.forks import ForkNode, ForkState, fork_view

    rng = random.Random(seed)
    prompt, lanes = 10, rng.randint(3, 8)
    lens = [prompt + rng.randint(5, 40) for _ in range(lanes)]
    forks, free, parents = [], list(range(1, lanes)), [0]
    while free and rng.random() < 0.8:
        k = rng.randint(1, min(3, len(free)))
        branch, free = tuple(free[:k]), free[k:]
        parent = rng.choice(parents)
        ends = tuple(lens[b] for b in branch) if rng.random() < 0.6 else None
        forks.append(ForkNode(parent, min(lens[parent], prompt + rng.randint(1, 5)), branch, ends))
        parents += list(branch)
    state = ForkState(tuple(forks), hogwild=bool(seed % 2))
    shape = SimpleNamespace(request_ids=tuple(f"{w}" for w in range(lanes)), layout=FORKJOIN_LAYOUT)
    bound = max_segments(shape, forks=sum(len(f.lanes) + 1 for f in forks))
    for lane in range(lanes):
        assert len(fork_view(prompt, lens, lane, state).spans) <= bound, (lane, forks)
