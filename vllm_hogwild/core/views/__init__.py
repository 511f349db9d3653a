"""Views: what each worker reads, as ordered spans of lanes, and the RoPE deltas that position them.

Owns: spans, views and segments for every layout (``spans``), a fork/join lane's view from its forks
(``forks``), a group's views on the worker-process side, built from its shape and each step's wire
(``registry``, :class:`~vllm_hogwild.core.views.registry.ViewRegistry`), and the re-rotation of queries by
position deltas (``rope``, the one torch user here).

Called by the worker processes (:mod:`vllm_hogwild.runner`: the worker core keeps one ``ViewRegistry``),
the attention paths (:mod:`vllm_hogwild.attention`: segments, ``RopeSpec``), the switch (it checks the
model's RoPE kind), the collaborator's tools, and above it in ``core`` by paragraphs
(:mod:`vllm_hogwild.core.protocol.paragraphs`) and the fork/join rules. No vLLM import.
"""
