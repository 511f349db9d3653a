import os

import pytest

# Tests inspect the engine core's scheduler: run it in this process (the model
# worker still runs in its own process). Small KV cache: several engines may
# live in one test process.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


# ./test.sh runs two pytest workers (pytest-xdist, --dist loadgroup). Each module is one group, so its
# module-scoped engine starts once, on one worker; the modules that start a local Ray instance share one
# group, so two Ray instances never run at once.
RAY_MODULES = {"test_distributed.py", "test_ray_serve.py"}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        module = item.nodeid.split("::", 1)[0]
        item.add_marker(pytest.mark.xdist_group("ray" if module.rsplit("/", 1)[-1] in RAY_MODULES else module))
