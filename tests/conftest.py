import os
import runpy
from pathlib import Path

import pytest

# VLLM_HOGWILD_TEST_RUNNER=v2: every engine of this pytest process runs vLLM's Model Runner V2 (on vLLM 0.32's
# CPU build, with Triton's interpreter; tests/runner_v2_shim/sitecustomize.py, test-only). Set before vLLM is
# imported: the engine core runs in this process, the model worker in a child that inherits the environment.
# VLLM_HOGWILD_TEST_FORCE_V1=1 is the control: the engines run V1 while the tests expect V2, and must fail.
TEST_RUNNER = os.environ.get("VLLM_HOGWILD_TEST_RUNNER", "v1")
if TEST_RUNNER == "v2":
    shim = Path(__file__).parent / "runner_v2_shim"
    os.environ["TRITON_INTERPRET"] = "1"
    os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "0" if os.environ.get("VLLM_HOGWILD_TEST_FORCE_V1") == "1" else "1"
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(shim), os.environ.get("PYTHONPATH")]))
    runpy.run_path(str(shim / "sitecustomize.py"))  # this process started before PYTHONPATH named the shim

# The tiny test model's vocabulary: SmolLM2's whole one, or (V2, whose samplers scan it in interpreted kernels)
# its first 1,024 tokens (vllm_hogwild/models/tiny.py). Random prompt ids stay below PROMPT_ID_TOP.
TEST_VOCAB = int(os.environ.get("VLLM_HOGWILD_TEST_VOCAB", 1024 if TEST_RUNNER == "v2" else 49152))
PROMPT_ID_TOP = min(40000, TEST_VOCAB)
# Token budgets of the tests whose engine forces text: the cut vocabulary spends about twice the tokens on the same
# text (a paragraph prefix, "**Alice [1]:** ", is 6 tokens of SmolLM2's, 9 of the cut one's), and its random text
# matches a step end's pattern about half as often per token.
TEXT_SCALE = 1 if TEST_VOCAB >= 49152 else 2

# Tests inspect the engine core's scheduler: run it in this process (the model
# worker still runs in its own process). Small KV cache: several engines may
# live in one test process.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


# ./test.sh runs two pytest workers (pytest-xdist). Each module is one unit of work, so its module-scoped
# engine starts once, on one worker; the modules that start a local Ray instance are one unit together, so
# two Ray instances never run at once. (A scheduler of our own: xdist 3.8's loadgroup marks do not reach the
# node ids of pytest 9.2.)
RAY_MODULES = {"test_distributed.py", "test_ray_serve.py"}


def unit_of_work(nodeid: str) -> str:
    module = nodeid.split("::", 1)[0]
    return "ray" if module.rsplit("/", 1)[-1] in RAY_MODULES else module


class ModuleScheduling:
    """The xdist hook, registered only where pytest-xdist is loaded (``-p no:xdist`` and plain runs do without)."""

    @staticmethod
    def pytest_xdist_make_scheduler(config, log):
        from xdist.scheduler import LoadFileScheduling

        class Modules(LoadFileScheduling):
            def _split_scope(self, nodeid: str) -> str:
                return unit_of_work(nodeid)

        return Modules(config, log)


def pytest_configure(config) -> None:
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(ModuleScheduling(), "hogwild-module-scheduling")
