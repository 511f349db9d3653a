"""Every vLLM target the plugin hooks still has the shape it relies on; the upstream patches apply.

The table of touch points (``vllm_hogwild/patches/``) is checked here twice against the
installed vLLM: by its runtime checker (imports, live objects) and by its static checker (the same
files read as sources, as it reads another release's), and both must find everything OK; and
statically against the newest release the CUDA extra accepts (:data:`NEXT_RELEASE`, which has no CPU
build to run here). The
attributes the plugin sets on vLLM objects are set on real instances, and the ``SchedulerOutput``
attributes go through vLLM's own executor transport (the shared-memory ``MessageQueue``) and Ray's
pickler.
"""

from __future__ import annotations

import copy
import gc
import inspect
import pickle
import py_compile
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm

ROOT = Path(__file__).parents[2]
PATCHES = sorted((ROOT / "patches").glob("[0-9]*.patch"))  # the upstream diffs: top level, not in the package
# The newer vLLM releases the CUDA extra accepts (setup.py); the CPU build stays on 0.32. Each with the rows left out
# there besides the V1 runner's (which end at 0.33: vLLM 0.34 deleted that runner).
NEWER_RELEASES = {
    "0.33.0": {"RayWorkerWrapper.execute_model_ray", "cpu_attn_reshape_and_cache", "Scheduler"},
    "0.34.0": {"RayWorkerWrapper.execute_model_ray", "cpu_attn_reshape_and_cache", "Scheduler",
               "VLLM_USE_V2_MODEL_RUNNER", "VllmConfig.use_v2_model_runner"},
}


@pytest.fixture(scope="module")
def runtime_results():
    from tools import upstream

    return upstream.check_runtime()


def _params(fn) -> list[str]:
    return list(inspect.signature(fn).parameters)


def test_hooked_targets_have_the_expected_shape() -> None:
    import vllm.entrypoints.cli.main as cli_main
    from vllm.engine.arg_utils import EngineArgs
    from vllm.renderers.inputs import preprocess
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionMetadataBuilder
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.engine.async_llm import AsyncLLM
    from vllm.v1.engine.input_processor import InputProcessor
    from vllm.v1.metrics.loggers import StatLoggerManager
    from vllm.v1.metrics.stats import SchedulerStats
    from vllm.v1.worker.cpu_worker import CPUWorker
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from vllm_hogwild import switch

    unwrap = lambda f: getattr(f, "_hogwild_original", f)  # noqa: E731
    assert _params(unwrap(EngineArgs.create_engine_config))[0] == "self"
    assert _params(unwrap(InputProcessor.process_inputs))[:4] == ["self", "request_id", "prompt", "params"]
    assert _params(GPUModelRunner._prepare_inputs)[:3] == ["self", "scheduler_output", "num_scheduled_tokens"]
    assert _params(CPUAttentionMetadataBuilder.build)[:4] == ["self", "common_prefix_len", "common_attn_metadata", "fast_build"]
    alloc = _params(KVCacheManager.allocate_slots)
    for name in ("request", "num_new_tokens", "num_new_computed_tokens", "num_lookahead_tokens",
                 "num_external_computed_tokens"):
        assert name in alloc, name
    for name in ("_free_blocks", "_free_request_blocks", "get_request_counts", "add_request", "schedule"):
        assert callable(getattr(Scheduler, name)), name
    assert "preempted_req_ids" in SchedulerOutput.__dataclass_fields__
    assert callable(CPUWorker.init_device)
    for field in ("scheduler_cls", "worker_cls", "additional_config", "async_scheduling"):
        assert field in EngineArgs.__dataclass_fields__, field
    default_scheduler = switch.DEFAULT_SCHEDULER_CLS
    assert default_scheduler[1] == f"{Scheduler.__module__}.{Scheduler.__name__}"
    # The backend override forgets vLLM's per-process backend choice; forced tokens use the
    # logits-processor interface.
    from vllm.v1.attention.selector import _cached_get_attn_backend
    from vllm.v1.sample.logits_processor import LogitsProcessor

    assert callable(_cached_get_attn_backend.cache_clear)
    for name in ("apply", "update_state", "is_argmax_invariant"):
        assert name in LogitsProcessor.__dict__, name
    assert "logits_processors" in EngineArgs.__dataclass_fields__
    # the flags: a staticmethod and a classmethod, wrapped as such
    add_cli_args = EngineArgs.__dict__["add_cli_args"]
    assert isinstance(add_cli_args, staticmethod)
    assert _params(unwrap(add_cli_args.__func__))[0] == "parser"
    from_cli_args = EngineArgs.__dict__["from_cli_args"]
    assert isinstance(from_cli_args, classmethod)
    assert _params(unwrap(from_cli_args.__func__))[:2] == ["cls", "args"]
    # the metrics
    manager_init = _params(unwrap(StatLoggerManager.__init__))
    assert manager_init[:2] == ["self", "vllm_config"]
    assert "custom_stat_loggers" in manager_init
    assert "kv_connector_stats" in SchedulerStats.__dataclass_fields__
    # the check before a stream starts
    assert _params(unwrap(AsyncLLM.generate))[:4] == ["self", "prompt", "sampling_params", "request_id"]
    assert callable(preprocess.extract_prompt_len)
    # the reason for cpu_dist: the CLI asks for the "vllm" distribution's version
    assert 'importlib.metadata.version("vllm")' in inspect.getsource(cli_main.main)
    # the collab preamble in chat and the answer field (patches._wrap replaces the attribute in
    # the class's own __dict__, so each must be defined there, not inherited)
    from vllm.entrypoints.common.offline import OfflineInferenceMixin
    from vllm.entrypoints.llm import LLM
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.chat_completion.serving import OpenAIServingChat
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest
    from vllm.entrypoints.openai.completion.serving import OpenAIServingCompletion
    from vllm.renderers.inputs.preprocess import conversation_to_seq

    for owner, name in ((OfflineInferenceMixin, "_add_chat_requests"), (OpenAIServingChat, "render_chat_request"),
                        (OpenAIServingChat, "create_chat_completion"), (OpenAIServingCompletion, "create_completion")):
        assert name in owner.__dict__, f"{owner.__name__}.{name}"
    add_chat = unwrap(OfflineInferenceMixin._add_chat_requests)
    assert _params(add_chat)[:3] == ["self", "messages", "params"]
    assert not inspect.iscoroutinefunction(add_chat)
    assert issubclass(LLM, OfflineInferenceMixin) and callable(OfflineInferenceMixin._params_to_seq)
    assert callable(conversation_to_seq)
    render_chat = unwrap(OpenAIServingChat.render_chat_request)
    assert inspect.iscoroutinefunction(render_chat)
    assert _params(render_chat) == ["self", "request"]
    for create in (OpenAIServingChat.create_chat_completion, OpenAIServingCompletion.create_completion):
        create = unwrap(create)
        assert inspect.iscoroutinefunction(create), create.__qualname__
        assert _params(create) == ["self", "request", "raw_request"], create.__qualname__
        assert inspect.signature(create).parameters["raw_request"].default is None, create.__qualname__
    for field in ("messages", "n", "vllm_xargs"):
        assert field in ChatCompletionRequest.model_fields, field
    for field in ("n", "vllm_xargs"):
        assert field in CompletionRequest.model_fields, field


def test_upstream_patches_apply_to_the_pinned_vllm(tmp_path) -> None:
    import vllm

    site = Path(vllm.__file__).parents[1]
    touched = set()
    for p in PATCHES:
        touched |= {line.split()[1][2:] for line in p.read_text().splitlines() if line.startswith("+++ ")}
    for rel in touched:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(site / rel, tmp_path / rel)
    assert [p.name[:2] for p in PATCHES] == [f"{i:02d}" for i in range(1, len(PATCHES) + 1)]  # none skipped
    for p in PATCHES:
        run = subprocess.run(["git", "apply", "-p1", str(p)], cwd=tmp_path, capture_output=True, text=True)
        assert run.returncode == 0, f"{p.name}: {run.stdout}{run.stderr}"
    for rel in touched:
        py_compile.compile(str(tmp_path / rel), doraise=True)


# -- the table of touch points ------------------------------------------------------------------


def test_every_touch_point_holds_at_runtime(runtime_results) -> None:
    broken = [r.line() for r in runtime_results if not r.ok]
    assert not broken, "\n".join(broken)


@pytest.mark.parametrize("release", NEWER_RELEASES)
def test_every_touch_point_holds_statically_on_the_newer_releases(release: str) -> None:
    """Every row that applies to vLLM ``release`` holds in its sources, read from its PyPI wheel (downloaded once per
    machine into the checker's cache, ``$VLLM_HOGWILD_UPSTREAM_CACHE`` or ``~/.cache/vllm_hogwild/upstream``;
    later runs read the cache). Rows for some releases only (``since`` / ``before``) are left out on the others:
    on 0.34 every row of the V1 runner's adapter."""
    import re

    from packaging.specifiers import SpecifierSet

    from tools import upstream
    from vllm_hogwild.patches import TOUCH_POINTS

    cuda = re.search(r'^VLLM_CUDA = "vllm(.*)"$', (ROOT / "setup.py").read_text(), re.M).group(1)
    assert release in SpecifierSet(cuda), f"setup.py's CUDA extra ({cuda}) does not accept {release}"
    try:
        root = upstream.fetch_sources(release, log=lambda *_: None)
    except Exception as error:  # noqa: BLE001 - no index reachable from here
        pytest.skip(f"vLLM {release}'s sources are not cached and PyPI cannot be reached here: {error}")
    assert upstream.release_version(root) == release
    results = upstream.check_static(root)
    broken = [r.line() for r in results if not r.ok]
    assert not broken, "\n".join(broken)
    left_out = [p for p in TOUCH_POINTS if not p.applies_to(release)]
    v1_rows = [p for p in TOUCH_POINTS if p.runner == "v1"]
    assert all(p.before == "0.34" for p in v1_rows) and len(v1_rows) > 40
    if release >= "0.34":
        assert set(map(id, v1_rows)) <= set(map(id, left_out))
    assert {p.name for p in left_out if p.runner != "v1"} == NEWER_RELEASES[release]
    assert len(results) == len(TOUCH_POINTS) - len(left_out)


def test_static_checker_agrees_with_the_runtime_one_on_the_installed_sources(runtime_results) -> None:
    import vllm

    from tools import upstream

    static = upstream.check_static(Path(vllm.__file__).parent.parent)
    rows = [p for p in upstream.TOUCH_POINTS if p.applies_to(vllm.__version__)]
    assert [r.point for r in static] == [r.point for r in runtime_results] == rows
    assert len(rows) == len(upstream.TOUCH_POINTS) - 4, \
        "the two rows of vLLM 0.33's Scheduler.has_request and two of 0.34 (_cpu_ops, V2's resumed requests)"
    broken = [r.line() for r in static if not r.ok]
    assert not broken, "\n".join(broken)
    # both name the same file for what they locate (the runtime one may not know a line)
    for s, r in zip(static, runtime_results):
        if s.where and r.where:
            assert s.where.split(":")[0] == r.where.split(":")[0] or s.point.kind in (
                upstream.SOURCE, upstream.SETTABLE, upstream.ABSTRACT, upstream.FIELD), (s.line(), r.line())


# -- attributes the plugin sets on vLLM objects ---------------------------------------------------


def _wire():
    from vllm_hogwild.core.wire import GroupReplay, GroupShape, GroupStep, ReplayStep, StepWire, lengths_array

    shape = GroupShape("grp", ("grp-0", "grp-1"), "combined", prompt_len=40, prompt_end=40,
                       separators=((0, 3), None, (5, 8), None), block_ids=((3, 4, 9), (3, 4, 12)))
    step = GroupStep("grp", joined=((0, 40, 44),))
    replay = GroupReplay("old-grp", (ReplayStep((41, 41), 0, (40, 40)),), ((0, ((38, 40, -1), (40, 41, 0))),))
    return StepWire(shapes=(shape,), steps=(step,), length_groups=("grp",), lane_lens=lengths_array((45, 44)),
                    ended=("old",), forced={"grp-0": 42, "grp-1": -1}, replays=(replay,))


def test_scheduler_output_attribute_survives_the_executors_transports() -> None:
    """The step's wire reaches the workers: vLLM's shared-memory queue (the mp executor, and the default Ray
    executor, RayExecutorV2), Ray's pickler (cloudpickle: the legacy compiled-graph Ray executor) and pickle."""
    import threading

    import cloudpickle
    from vllm.distributed.device_communicators.shm_broadcast import MessageQueue
    from vllm.v1.core.sched.output import SchedulerOutput

    from vllm_hogwild.core.wire import STEP_ATTR
    from tools.upstream import SCHEDULER_OUTPUT_ATTRS, SET_ATTRIBUTES

    assert SCHEDULER_OUTPUT_ATTRS == (STEP_ATTR,)
    assert SET_ATTRIBUTES["vllm.v1.core.sched.output.SchedulerOutput"] == SCHEDULER_OUTPUT_ATTRS
    output = SchedulerOutput.make_empty()
    setattr(output, STEP_ATTR, _wire())

    writer = MessageQueue(1, 1)
    reader = MessageQueue.create_from_handle(writer.export_handle(), 0)
    ready = threading.Thread(target=reader.wait_until_ready)
    ready.start()
    writer.wait_until_ready()
    ready.join()
    try:
        writer.enqueue(output)
        received = [reader.dequeue(timeout=30)]  # a hang guard: one message in shared memory, milliseconds
    finally:
        writer.shutdown()
        reader.shutdown()
        del writer, reader
        gc.collect()
    received.append(cloudpickle.loads(cloudpickle.dumps(output)))
    received.append(pickle.loads(pickle.dumps(output, protocol=pickle.HIGHEST_PROTOCOL)))
    for got in received:
        assert type(got) is SchedulerOutput
        assert getattr(got, STEP_ATTR) == _wire()


def test_every_method_hooks_wraps_is_an_own_method_row(monkeypatch) -> None:
    """``patches.install`` wraps exactly methods the table checks (defined in the class's own ``__dict__``)."""
    import vllm_hogwild.patches as hooks
    from tools.upstream import METHOD, TOUCH_POINTS

    wrapped = []
    monkeypatch.setattr(hooks, "_wrap", lambda owner, name, hook: wrapped.append((owner, name)))
    monkeypatch.setattr(hooks, "_installed", False)
    hooks.install()
    assert len(wrapped) >= 10
    rows = {(p.module, p.name) for p in TOUCH_POINTS if p.kind == METHOD and p.own}
    for owner, name in wrapped:
        assert (owner.__module__, f"{owner.__qualname__}.{name}") in rows, f"{owner.__qualname__}.{name}"
        assert name in owner.__dict__


def test_every_attribute_the_plugin_sets_is_taken_by_a_real_instance() -> None:
    """The SETTABLE rows, on instances of the real classes (made without their constructors)."""
    import importlib

    from tools.upstream import SET_ATTRIBUTES

    assert {
        "vllm.v1.core.sched.output.SchedulerOutput",
        "vllm.v1.worker.gpu_model_runner.GPUModelRunner",
        "vllm.v1.worker.gpu.model_runner.GPUModelRunner",
        "vllm.v1.worker.gpu.model_states.default.DefaultModelState",
        "vllm.v1.worker.gpu.sample.prompt_logprob.PromptLogprobsWorker",
        "vllm.v1.core.kv_cache_manager.KVCacheManager",
        "vllm.entrypoints.openai.chat_completion.protocol.ChatCompletionResponse",
        "vllm.entrypoints.openai.completion.protocol.CompletionResponse",
    } <= set(SET_ATTRIBUTES)
    for target, names in SET_ATTRIBUTES.items():
        module, _, name = target.rpartition(".")
        cls = getattr(importlib.import_module(module), name)
        if hasattr(cls, "model_construct"):  # pydantic: the field must come out in the JSON too
            obj = cls.model_construct()
        else:
            obj = object.__new__(cls)
        for attr in names:
            setattr(obj, attr, {"set": attr})
            assert getattr(obj, attr) == {"set": attr}, target
        if hasattr(obj, "model_dump"):
            dumped = obj.model_dump()
            assert all(dumped[attr] == {"set": attr} for attr in names), target


def test_fields_the_plugin_writes_on_real_instances() -> None:
    """The request check rewrites the engine request and its params; chat gets the preamble (and the parsed
    options, an object of the plugin's, in vllm_xargs); the switch sets EngineArgs fields."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.sampling_params import SamplingParams
    from vllm.v1.engine import EngineCoreRequest

    params = SamplingParams(n=2, max_tokens=8, extra_args={"hogwild": {}})
    request = EngineCoreRequest(request_id="r", prompt_token_ids=[1, 2], mm_features=None, sampling_params=params,
                                pooling_params=None, arrival_time=0.0, lora_request=None, cache_salt=None,
                                data_parallel_rank=None)
    assert request.params is params
    p = copy.copy(request.params)
    p.max_tokens, p.extra_args = 5, {"hogwild_request": {"num_workers": 2}}
    request.prompt_token_ids, request.sampling_params = [1, 2, 3], p
    assert (request.prompt_token_ids, request.params.max_tokens, params.max_tokens) == ([1, 2, 3], 5, 8)

    chat = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}], n=2,
                                 vllm_xargs={"hogwild_protocol": "collab"})
    chat.messages = [{"role": "system", "content": "preamble"}, *chat.messages]
    mark = object()
    chat.vllm_xargs = {**chat.vllm_xargs, "mark": mark}
    assert len(chat.messages) == 2 and chat.vllm_xargs["mark"] is mark

    args = EngineArgs(model="m")
    args.scheduler_cls, args.worker_cls, args.async_scheduling = "a.B", "c.D", False
    args.additional_config = {"hogwild": {}}
    args.logits_processors = ["vllm_hogwild.runner.v1:V1ForcedTokens"]
    assert (args.scheduler_cls, args.worker_cls, args.async_scheduling) == ("a.B", "c.D", False)


def test_the_v1_adapter_reads_real_batch_objects() -> None:
    """The V1 runner's attributes its adapter reads, on a real InputBatch and CpuGpuBuffer (no engine)."""
    from types import SimpleNamespace

    import torch
    from vllm.v1.utils import CpuGpuBuffer
    from vllm.v1.worker.gpu_input_batch import InputBatch

    from vllm_hogwild.runner import v1

    batch = InputBatch(max_num_reqs=4, max_model_len=64, max_num_batched_tokens=64, device=torch.device("cpu"),
                       vocab_size=32, block_sizes=[16], max_num_blocks_per_req=[4])
    mask = CpuGpuBuffer(4, dtype=torch.bool, device=torch.device("cpu"), pin_memory=False)
    assert (list(batch.req_ids), batch.req_id_to_index, batch.generators, batch.num_reqs) == ([], {}, {}, 0)
    assert mask.np.shape == (4,)
    set_aside = {"gone": torch.Generator()}
    v1.restore_generators(batch, set_aside)  # a request no longer in the batch: dropped
    assert set_aside == {} and batch.generators == {}
    v1.set_aside_discarded_generators(SimpleNamespace(input_batch=batch, discard_request_mask=mask), set_aside)
    assert set_aside == {}
