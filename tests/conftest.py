import os

import pytest

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
