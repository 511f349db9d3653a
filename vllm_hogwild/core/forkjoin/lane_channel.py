"""What the engine core tells the front end of a fork/join lane: typed and versioned here, in one place.

The front end assembles a fork/join request's lanes into one completion
(``vllm_hogwild/serving/assembly.py``). For that it must learn, with the first
output of each lane ≥ 1, which part the lane decodes and which fork took it,
and with its last, how many of its tokens are the branch's. That is a
:class:`LaneRecord`. No field of vLLM's per-request output means this, so the
plugin adds one:

- **the field.** :func:`output_types` builds, from vLLM's own
  ``EngineCoreOutput`` and ``EngineCoreOutputs`` (passed in: this module
  imports no vLLM), a subclass of each with one more field, ``hogwild``: the
  lane's record, or None. It travels in the same message as the lane's
  tokens, so the front end has it with the output it belongs to: no second
  channel to wait on, no ordering to restore.
- **the engine core** (the scheduler's ``update_from_output``) replaces a
  lane's output by the subclass in the step its record is new: its first
  output, and its last (``keep`` is known then). Every other output, and
  every output of every other request, stays vLLM's own object.
- **the front end**: vLLM's array-like structs decode by position and drop
  trailing fields they do not know, so the client decodes each batch with
  the subclass types (the hook on ``MPClient.__init__``, only in an engine
  with Hogwild switched on). In-process clients pass the objects as they
  are. The output processor keeps a lane's latest record on its request state
  and hands it to every completion of that lane (``vllm_hogwild/patches/outputs.py``).

:data:`RECORD_VERSION` is the first field of every record; the front end
refuses a record of another version (:func:`check`), so an engine and a
front end of different plugin releases fail loudly, not by misreading.
vLLM's ``stop_reason`` keeps its meaning for every lane.
"""

from __future__ import annotations

from functools import lru_cache

import msgspec

RECORD_VERSION = 2
FIELD = "hogwild"  # the field the subclass adds to vLLM's EngineCoreOutput


class LaneRecord(msgspec.Struct, array_like=True, omit_defaults=True, frozen=True, gc=False):
    """How a lane of a fork/join request takes part, as the front end needs it (the trunk's, lane 0: only the
    goals that did not fork, with its last output)."""

    version: int
    lane: int
    branch: str | None = None  # its part in the goal of the fork that took it ("2", "3.1"; None: no fork took it)
    parent: int | None = None  # the lane that forked it
    lanes: tuple[int, ...] = ()  # that fork's branch lanes, in the goal's order
    fork_tokens: int = 0  # the fork point in the parent's output tokens
    fork_chars: int = 0  # ... and characters
    keep: int | None = None  # once it finished: how many of its output tokens are the branch's (None: not yet)
    # goals that did not fork so far: (the branch's part, None for the trunk; its tokens written then; why)
    unforked: tuple[tuple[str | None, int, str], ...] = ()


def new_record(lane: int, **fields) -> LaneRecord:
    return LaneRecord(RECORD_VERSION, lane, **fields)


def check(record: LaneRecord) -> LaneRecord:
    """The record, if the front end can read it; a ``RuntimeError`` naming both versions if not."""
    if record.version != RECORD_VERSION:
        raise RuntimeError(f"vllm-hogwild: the engine core sent a fork/join lane record of version {record.version}, "
                           f"this front end reads version {RECORD_VERSION}: run one release of the plugin in every "
                           "process")
    return record


@lru_cache(maxsize=None)
def output_types(output_cls: type, outputs_cls: type) -> tuple[type, type]:
    """vLLM's ``EngineCoreOutput`` and ``EngineCoreOutputs`` with the record field: ``(output, outputs)``.
    One pair per process (cached), the same on both ends."""
    output_type = type(output_cls.__name__, (output_cls,), {
        "__module__": __name__, "__annotations__": {FIELD: LaneRecord | None}, FIELD: None})
    outputs_type = type(outputs_cls.__name__, (outputs_cls,), {
        "__module__": __name__, "__annotations__": {"outputs": list[output_type]}, "outputs": []})
    return output_type, outputs_type


def with_record(output, record: LaneRecord, output_type: type):
    """``output`` (a vLLM ``EngineCoreOutput``) as the subclass, carrying ``record``."""
    fields = {name: getattr(output, name) for name in output.__struct_fields__}
    return output_type(**fields, **{FIELD: record})


def record_of(output) -> LaneRecord | None:
    """The record an output carries (None: a plain vLLM output, or none this step)."""
    record = getattr(output, FIELD, None)
    return None if record is None else check(record)
