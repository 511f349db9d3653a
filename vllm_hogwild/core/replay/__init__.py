"""A group's engine steps, kept compactly: the step log, exact replay of a preempted group, steady groups.

Owns: the step log and replay (``step_log``: :class:`~vllm_hogwild.core.replay.step_log.StepLog`,
:class:`~vllm_hogwild.core.replay.step_log.Replay`) and the step log's fast path for groups in steady
lock-step, advanced together as flat columns (``steady``,
:class:`~vllm_hogwild.core.replay.steady.SteadyGroups`).

Called by the group table and its groups (:mod:`vllm_hogwild.core.groups`: a group's log, preemption and
resumption, the steady groups). Pure, no vLLM import.
"""
