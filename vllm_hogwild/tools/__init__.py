"""Commands for users: the demo (the main job, ``./run.sh``: :mod:`.demo`), the planner (``python -m
vllm_hogwild.tools.planner``: how many workers a workload should get) and the set-up's record for vLLM's CPU
build (:mod:`.cpu_dist`). The tasks, models and training they run live in :mod:`vllm_hogwild.tasks`,
:mod:`vllm_hogwild.models` and :mod:`vllm_hogwild.training`."""
