"""Every vLLM target the plugin hooks still has the shape it relies on; the upstream patches apply."""

from __future__ import annotations

import inspect
import py_compile
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm

PATCHES = sorted((Path(__file__).parents[2] / "patches").glob("0*.patch"))


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

    from vllm_hogwild import hooks

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
    assert hooks.DEFAULT_SCHEDULER_CLS[1] == f"{Scheduler.__module__}.{Scheduler.__name__}"
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
    # the collab preamble in chat and the answer field (hooks._wrap replaces the attribute in
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
    assert [p.name[:2] for p in PATCHES] == [f"{i:02d}" for i in range(1, 10)]
    for p in PATCHES:
        run = subprocess.run(["git", "apply", "-p1", str(p)], cwd=tmp_path, capture_output=True, text=True)
        assert run.returncode == 0, f"{p.name}: {run.stdout}{run.stderr}"
    for rel in touched:
        py_compile.compile(str(tmp_path / rel), doraise=True)
