"""Hogwild groups in one engine core: the group table (``table``) and everything it runs a group's life with.

Owns: a group and its workers (``group``), the interface a kind of group implements (``kind``) and the
kinds (``hogwild_kind``: lock-step workers over one cache; ``forkjoin_kind``: a fork/join request's
trunk and branches; ``all_kinds``: the list a new kind joins), admission (``policy``: the rules, when a
group fits and fairness towards plain requests, the lock-step and preemption order; ``admit``: the
table's admission part, which applies them), speculative drafts (``drafts``) and preemption with replay
(``preempt``: the table's replay part). The table holds its parts as attributes, each owning its own indexes.

Called by the scheduler (:mod:`vllm_hogwild.scheduler`), which keeps one
:class:`~vllm_hogwild.core.groups.table.GroupTable` per engine core. The top layer of ``core``: it may
import every other part of ``core``, and nothing in ``core`` imports it. Pure, no vLLM import.
"""
