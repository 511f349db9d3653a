"""Every kind of group, and the one a request's groups are: the list a new kind joins. Pure, no vLLM import."""

from __future__ import annotations

from typing import Callable

from vllm_hogwild.core.groups.forkjoin_kind import FORK_JOIN
from vllm_hogwild.core.groups.group import Group
from vllm_hogwild.core.groups.kind import GroupKind
from vllm_hogwild.core.groups.hogwild_kind import HOGWILD
from vllm_hogwild.core.options import RequestSpec

KINDS: tuple[GroupKind, ...] = (FORK_JOIN, HOGWILD)  # the first that takes a request's options makes its group


def new_group(group_id: str, spec: RequestSpec, max_tokens: int, prompt_len: int, arrival: float,
              arrival_time: float, encode: Callable[[str], list[int]], max_positions: int | None = None) -> Group:
    """A new group for ``spec`` (see :meth:`~vllm_hogwild.core.groups.kind.GroupKind.new_group`)."""
    kind = next(k for k in KINDS if k.takes(spec.options))
    return kind.new_group(group_id, spec, max_tokens, prompt_len, arrival, arrival_time, encode, max_positions)
