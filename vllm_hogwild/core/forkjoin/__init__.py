"""Fork/join requests of parallel-reasoning models (Multiverse, NPR), as rules and as records.

Owns: the families' rules, when to fork, what to force, when to join (``families``,
:class:`~vllm_hogwild.core.forkjoin.families.ForkJoinLanes`), and what the engine core tells the front
end of each fork/join lane (``lane_channel``, :class:`~vllm_hogwild.core.forkjoin.lane_channel.LaneRecord`).
What each lane reads is :mod:`vllm_hogwild.core.views.forks`; the kind of group is
:mod:`vllm_hogwild.core.groups.forkjoin_kind`.

Called by the protocol driver (:mod:`vllm_hogwild.core.protocol.driver`), the group table, the scheduler,
and the front end that assembles the lanes into one completion (:mod:`vllm_hogwild.serving.assembly`,
:mod:`vllm_hogwild.patches.outputs`). Pure, no torch and no vLLM import.
"""
