"""A fork/join request's lanes assembled into the one completion its client asked for. Front end.

The front end sends a fork/join request (``n=1``) as ``1 + B`` lanes (vLLM's
``n`` fan-out): lane 0 is the trunk, lanes 1..B take the branches of its fork
(the engine core keeps them out of its queues until then). Each lane ≥ 1 ends
with a record of how it took part (its ``stop_reason``, see
:func:`vllm_hogwild.core.forkjoin.read_record`): which part it decoded, where
the trunk forked, how many of its tokens are the branch's. vLLM's
``ParentRequest.get_outputs`` is wrapped (:func:`get_outputs`) so that the
client gets one completion:

- **whole** (``FINAL_ONLY``): the flat document the model was trained on,
  the trunk up to the fork, every branch in order (placed headers included),
  the trunk from the join on; its token ids and logprobs in the same order;
  ``completion.hogwild`` carries the tree (:func:`tree`);
- **streamed** (``DELTA``): the same document in the same order, each token
  once. The trunk streams live; after a fork, branch 1 streams live while
  the others are held, then branch 2's held text follows once branch 1 has
  ended, and so on; the trunk's text from the join on follows the last
  branch. The deltas' concatenation is the whole completion's text. The last
  output carries the tree too; the OpenAI server sends it as one last event
  before ``data: [DONE]`` (:func:`completion_stream`, :func:`chat_stream`).

A lane's forced end of sequence (a branch that wrote its end, a lane no
branch took) is the engine's, not the model's: it is in no output.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vllm_hogwild.core.forkjoin import read_record
from vllm_hogwild.core.options import SPEC_KEY, RequestSpec

ATTR = "_hogwild_forkjoin"  # on vLLM's ParentRequest: the assembly of its lanes


@dataclass
class _Delta:
    """Text, token ids and logprobs (None once any piece came without them), appended piece by piece."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list | None = field(default_factory=list)

    def add(self, text: str, token_ids, logprobs) -> None:
        self.text += text
        self.token_ids += list(token_ids)
        if self.logprobs is not None and logprobs is not None:
            self.logprobs += list(logprobs)
        else:
            self.logprobs = None


@dataclass
class _Lane(_Delta):
    """One lane's output so far."""

    finished: bool = False
    record: dict | None = None
    sent_tokens: int = 0  # streaming: tokens of this lane the client has
    sent_chars: int = 0  # streaming: characters of its text the client has


def spec_of_parent(parent) -> RequestSpec | None:
    extra = getattr(parent.sampling_params, "extra_args", None) or {}
    wire = extra.get(SPEC_KEY)
    if wire is None:
        return None
    spec = RequestSpec.from_wire(wire)
    return spec if spec.options.forks else None


def get_outputs(original, parent, child_request_id: str, completion_output):
    """vLLM's ``ParentRequest.get_outputs``; a fork/join request's lanes come out as one completion."""
    assembly = getattr(parent, ATTR, None)
    if assembly is None:  # the parent's first output: is it a fork/join request? (kept: False if not)
        spec = spec_of_parent(parent)
        if spec is None:
            setattr(parent, ATTR, False)
            return original(parent, child_request_id, completion_output)
        from vllm.sampling_params import RequestOutputKind

        assembly = Assembly(spec, streaming=parent.sampling_params.output_kind != RequestOutputKind.FINAL_ONLY)
        setattr(parent, ATTR, assembly)
    elif assembly is False:
        return original(parent, child_request_id, completion_output)
    outputs, finished = original(parent, child_request_id, completion_output)  # vLLM's bookkeeping of children
    if not assembly.streaming:
        return ([assembly.whole(outputs)] if outputs else []), finished
    delta = assembly.stream(completion_output, finished)
    return ([] if delta is None else [delta]), finished


class Assembly:
    """One fork/join request's lanes, as they arrive."""

    def __init__(self, spec: RequestSpec, streaming: bool) -> None:
        self.spec = spec
        self.streaming = streaming
        self.lanes = [_Lane() for _ in range(spec.num_workers)]
        self.forked = spec.fork_now is not None  # the prompt ended in a goal: forked before the first token
        self.current = 1  # streaming: the branch lane whose text goes out live
        self.joined = False
        self.trunk_final: Any = None  # the trunk's last output, held until every lane has ended
        self.trunk_tokens = 0  # streaming: the trunk's tokens before its last output

    # -- a whole completion --------------------------------------------------------------------------

    def whole(self, outputs):
        by_index = {o.index: o for o in outputs}
        trunk = by_index[0]
        for i, lane in enumerate(self.lanes[1:], start=1):
            o = by_index[i]
            lane.record = read_record(o.stop_reason)
            lane.add(o.text, o.token_ids, o.logprobs)
        branches = self._branches()
        fork = self._fork_record()
        cut_t, cut_c = (fork["fork_tokens"], fork["fork_chars"]) if fork and branches else (None, None)
        trunk_ids, trunk_lp = list(trunk.token_ids), None if trunk.logprobs is None else list(trunk.logprobs)
        if cut_t is None:
            text, ids, lps = trunk.text, trunk_ids, trunk_lp
        else:
            d = _Delta()
            d.add(trunk.text[:cut_c], trunk_ids[:cut_t], None if trunk_lp is None else trunk_lp[:cut_t])
            for lane in branches:
                keep = lane.record["keep"]
                d.add(lane.text, lane.token_ids[:keep], None if lane.logprobs is None else lane.logprobs[:keep])
            d.add(trunk.text[cut_c:], trunk_ids[cut_t:], None if trunk_lp is None else trunk_lp[cut_t:])
            text, ids, lps = d.text, d.token_ids, d.logprobs
        merged = _completion(trunk, text, ids, lps, trunk.finish_reason, trunk.stop_reason)
        merged.hogwild = self.tree(len(trunk_ids), branches, fork)
        return merged

    def tree(self, trunk_tokens: int, branches: list[_Lane], fork: dict | None) -> dict:
        """``completion.hogwild``: the fork and each branch (its part, text, tokens and sequential steps)."""
        out = {"protocol": self.spec.options.protocol, "branches_mode": self.spec.options.branches,
               "forked": bool(branches)}
        unforked = next((lane.record.get("unforked") for lane in self.lanes[1:]
                         if lane.record and lane.record.get("unforked")), None)
        if unforked:
            out["unforked"] = unforked
        if not branches:
            out["sequential_steps"] = trunk_tokens
            return out
        rows = [{"branch": lane.record["branch"], "text": lane.text, "num_tokens": lane.record["keep"],
                 "steps": lane.record["keep"]} for lane in branches]
        longest = max(r["num_tokens"] for r in rows)
        out.update(fork_tokens=fork["fork_tokens"], branches=rows, trunk_tokens=trunk_tokens,
                   num_tokens=trunk_tokens + sum(r["num_tokens"] for r in rows),
                   sequential_steps=trunk_tokens + longest)
        return out

    def _branches(self) -> list[_Lane]:
        return [lane for lane in self.lanes[1:] if lane.record and lane.record.get("branch") is not None]

    def _fork_record(self) -> dict | None:
        return next((lane.record for lane in self.lanes[1:] if lane.record and "fork_tokens" in lane.record), None)

    # -- a stream ------------------------------------------------------------------------------------

    def stream(self, output, finished: bool):
        """One lane's delta in; the delta the client gets now (None: nothing yet)."""
        i, lane = output.index, self.lanes[output.index]
        out = _Delta()
        if output.finished():
            lane.finished = True
            if i > 0:
                lane.record = read_record(output.stop_reason)
        if i == 0:
            if not output.finished():
                self.trunk_tokens += len(output.token_ids)
            if self.forked and not self.joined:
                lane.add(output.text, output.token_ids, output.logprobs)
            else:
                out.add(output.text, output.token_ids, output.logprobs)
            if output.finished():
                self.trunk_final = output
        else:
            if not self.forked and (not output.finished() or "fork_tokens" in (lane.record or {})):
                self.forked = True  # a lane ≥ 1 speaks only once the trunk forked
            lane.add(output.text, output.token_ids, output.logprobs)
        if self.forked and not self.joined:
            self._flush_branches(out)
        if not finished:
            if out.text or out.token_ids:
                return _completion(output, out.text, out.token_ids, out.logprobs, None, None)
            return None
        final = self.trunk_final
        delta = _completion(final, out.text, out.token_ids, out.logprobs, final.finish_reason, final.stop_reason)
        self.trunk_tokens += len(final.token_ids)
        delta.hogwild = self.tree(self.trunk_tokens, self._branches(), self._fork_record())
        return delta

    def _flush_branches(self, out: _Delta) -> None:
        """Send the live branch's text, then each following branch once the one before it ended; after the last
        branch, the trunk's text from the join on."""
        while self.current < len(self.lanes):
            lane = self.lanes[self.current]
            if lane.finished and lane.record is not None and lane.record.get("branch") is None:
                break  # a lane no branch took: the branches before it were all
            end = lane.record["keep"] if lane.finished and lane.record is not None else len(lane.token_ids)
            out.add(lane.text[lane.sent_chars:], lane.token_ids[lane.sent_tokens:end],
                    None if lane.logprobs is None else lane.logprobs[lane.sent_tokens:end])
            lane.sent_chars, lane.sent_tokens = len(lane.text), max(lane.sent_tokens, end)
            if not lane.finished:
                return
            self.current += 1
        if all(lane.finished for lane in self.lanes[1:]):
            self.joined = True
            trunk = self.lanes[0]
            out.add(trunk.text, trunk.token_ids, trunk.logprobs)
            trunk.text, trunk.token_ids, trunk.logprobs = "", [], []


def _completion(like, text: str, token_ids, logprobs, finish_reason, stop_reason):
    from vllm.outputs import CompletionOutput

    cumulative = None
    if logprobs:
        cumulative = sum(p[t].logprob for p, t in zip(logprobs, token_ids) if t in p)
    return CompletionOutput(index=0, text=text, token_ids=list(token_ids), cumulative_logprob=cumulative,
                            logprobs=logprobs if logprobs else None, finish_reason=finish_reason,
                            stop_reason=stop_reason, lora_request=getattr(like, "lora_request", None))


# -- the OpenAI server's streams: the tree as the last event --------------------------------------------

async def completion_stream(original, serving, request, engine_inputs, result_generator, *args, **kwargs):
    """``/v1/completions``, streamed: a fork/join request's tree in one last event before ``[DONE]``."""
    results, box = _recording(request, result_generator)
    async for event in _with_tree(original(serving, request, engine_inputs, results, *args, **kwargs), box):
        yield event


async def chat_stream(original, serving, request, result_generator, *args, **kwargs):
    """``/v1/chat/completions``, streamed: a fork/join request's tree in one last event before ``[DONE]``."""
    results, box = _recording(request, result_generator)
    async for event in _with_tree(original(serving, request, results, *args, **kwargs), box):
        yield event


TREE_EVENT = "hogwild"  # the last event: {"choices": [], "hogwild": {...the tree...}}


def _recording(request, result_generator):
    """``(results, box)``: the results as they come, and the tree of the last one put in ``box`` (None: not a
    fork/join request; the results are vLLM's own)."""
    from vllm_hogwild.serving.requests import PARSED_KEY, Parsed

    found = (getattr(request, "vllm_xargs", None) or {}).get(PARSED_KEY)
    if not (isinstance(found, Parsed) and found.options.forks):
        return result_generator, None
    box: dict = {}

    async def recorded():
        async for item in result_generator:
            res = item[1] if isinstance(item, tuple) else item  # completions: (prompt index, output)
            tree = getattr(res.outputs[0], "hogwild", None) if res.outputs else None
            if tree is not None:
                box["tree"] = tree
            yield item

    return recorded(), box


async def _with_tree(events, box: dict | None):
    import json

    head: dict = {}
    async for event in events:
        if box is not None and not head and event.startswith("data: {"):
            try:
                chunk = json.loads(event[len("data: "):])
                head = {k: chunk[k] for k in ("id", "object", "created", "model") if k in chunk}
            except ValueError:
                pass
        if box is not None and "tree" in box and event.startswith("data: [DONE]"):
            yield f"data: {json.dumps({**head, 'choices': [], TREE_EVENT: box['tree']})}\n\n"
        yield event
