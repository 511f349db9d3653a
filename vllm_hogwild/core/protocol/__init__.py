"""Driving a group's protocol: what the engine forces into lanes, where paragraphs end, the group's answer.

Owns: the protocol driver (``driver``: paragraph prefixes, answers, the finisher, when a group stops, and the
fork/join driver over :mod:`vllm_hogwild.core.forkjoin`), paragraphs and the shared history
(``paragraphs``), and the ``collab`` protocol's text in a request and a group's answer and transcript
(``collab``). The words themselves (names, prefixes, preambles, the answer patterns) are
:mod:`vllm_hogwild.core.protocol_text`, one layer down, because the request options check against them.

Called by the groups (:mod:`vllm_hogwild.core.groups`: a group holds its driver and paragraphs), the
front end's request and response hooks (:mod:`vllm_hogwild.patches`, :mod:`vllm_hogwild.serving`) and the
user's tools. Pure, no vLLM import.
"""
