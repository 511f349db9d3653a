"""The collaborators' tasks: what a prompt asks, how its answer is written, checked and scored, and what a split of
its work costs. Pure Python: no torch, no vLLM, nothing of vllm_hogwild (``.importlinter``'s "tasks are pure"
contract).

- :mod:`.roman`: Roman numerals for a list of numbers (items of about one cost);
- :mod:`.links`: follow links from each start to its end (costs unknown until done);
- :mod:`.merges`: links whose paths run into each other (a path may finish by reference to one already written),
  and :mod:`.merges_policy`, its policies and baselines run in lock-step.

Each generator is seeded; each checker scores exactly and names the field of any malformed argument in its
``ValueError``. The models (:mod:`vllm_hogwild.models`), their training (:mod:`vllm_hogwild.training`), the
benchmarks and the demo read them.
"""
