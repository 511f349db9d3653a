"""Commands for users: the demo (the main job), the planner (``python -m vllm_hogwild.tools.planner``), the
default model, the collaborators' tasks (``roman``: Roman numerals) and the trained collaborators (training,
running them on a task)."""
