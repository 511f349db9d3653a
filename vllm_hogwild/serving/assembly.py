"""A fork/join request's lanes assembled into the one completion its client asked for. Front end.

The front end sends a fork/join request (``n=1``) as ``1 + B`` lanes (vLLM's
``n`` fan-out): lane 0 is the trunk, lanes 1..B a pool the forks take their
branches from (the engine core keeps a lane out of its queues until a fork
takes it). Every output of a lane ≥ 1 carries its record
(``completion.hogwild_lane``, a :class:`~vllm_hogwild.core.forkjoin.lane_channel.LaneRecord`
sent on the plugin's own output field): which part it decodes, which lane
forked it and where (the fork point in that lane's output tokens and
characters), its siblings; its last also how many of its tokens are the
branch's. vLLM's ``ParentRequest.get_outputs`` is wrapped (:func:`get_outputs`)
so that the client gets one completion:

- **whole** (``FINAL_ONLY``): the flat document the model was trained on:
  each sequence's text with, at each of its fork points, every branch of
  that fork in order (each a document of its own: a branch may fork too),
  forced headers included; its token ids and logprobs in the same order;
  ``completion.hogwild`` carries the tree (:meth:`Assembly.tree`);
- **streamed** (``DELTA``): the same document in the same order, each token
  once. The text goes out as soon as nothing can come before it: up to a
  fork point, then the fork's first branch live while the others are held,
  then the second's held text once the first has ended, and so on, then the
  text after the join. The deltas' concatenation is the whole completion's
  text. The last output carries the tree too; the OpenAI server sends it as
  one last event before ``data: [DONE]`` (:func:`completion_stream`,
  :func:`chat_stream`).

A lane's forced end of sequence (a branch that wrote its end, a lane no fork
took) is the engine's, not the model's: it is in no output.
"""

from __future__ import annotations

from bisect import insort
from dataclasses import dataclass, field
from typing import Any

from vllm_hogwild.core.forkjoin.lane_channel import LaneRecord
from vllm_hogwild.core.options import SPEC_KEY, RequestSpec

ATTR = "_hogwild_forkjoin"  # on vLLM's ParentRequest: the assembly of its lanes


@dataclass
class _Delta:
    """Text, token ids, logprobs and accept steps (each None once any piece came without them), appended piece
    by piece."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list | None = field(default_factory=list)
    accept_steps: list[int] | None = field(default_factory=list)

    def add(self, text: str, token_ids, logprobs, accept_steps=None) -> None:
        self.text += text
        self.token_ids += list(token_ids)
        if self.logprobs is not None and logprobs is not None:
            self.logprobs += list(logprobs)
        else:
            self.logprobs = None
        if self.accept_steps is not None and accept_steps is not None:
            self.accept_steps += list(accept_steps)
        else:
            self.accept_steps = None


@dataclass
class _LaneOutput(_Delta):
    """One lane's output so far."""

    finished: bool = False
    record: LaneRecord | None = None
    sent_tokens: int = 0  # tokens of this lane in the document sent so far
    sent_chars: int = 0  # characters of its text sent so far
    next_fork: int = 0  # its forks sent whole so far


@dataclass
class _ForkOutput:
    tokens: int  # the fork point in the parent's output tokens
    chars: int  # ... and characters
    lanes: tuple[int, ...]  # its branches, in the goal's order
    next_lane: int = 0  # its branches sent whole so far

    def __lt__(self, other: "_ForkOutput") -> bool:
        return self.tokens < other.tokens


def spec_of_parent(parent) -> RequestSpec | None:
    extra = getattr(parent.sampling_params, "extra_args", None) or {}
    wire = extra.get(SPEC_KEY)
    if wire is None:
        return None
    spec = RequestSpec.from_wire(wire)
    return spec if spec.options.forks else None


class Assembly:
    """One fork/join request's lanes, as they arrive."""

    def __init__(self, spec: RequestSpec, streaming: bool) -> None:
        self.spec = spec
        self.streaming = streaming
        self.lanes = [_LaneOutput() for _ in range(spec.num_workers)]
        self.forks: dict[int, list[_ForkOutput]] = {}  # by the lane that forked, in fork-point order
        self.trunk_final: Any = None  # the trunk's last output, held until every lane has ended
        if spec.fork_now:  # the prompt ends in a goal: the trunk forks before its first token, into lanes 1..k
            self.forks[0] = [_ForkOutput(0, 0, tuple(range(1, len(spec.fork_now) + 1)))]

    def _take(self, output) -> None:
        """One output of a lane in: its text, tokens and logprobs; a lane ≥ 1's record, and with it its fork."""
        lane = self.lanes[output.index]
        lane.add(output.text, output.token_ids, output.logprobs, (getattr(output, "hogwild", None) or {}).get(
            "accept_steps"))
        lane.finished = lane.finished or output.finished()
        if output.index == 0:
            if output.finished():
                self.trunk_final = output
                lane.record = getattr(output, "hogwild_lane", None)  # goals that did not fork, if any
            return
        if lane.record is not None and not output.finished():
            return  # its record changes only with its last output (how many of its tokens are the branch's)
        record = getattr(output, "hogwild_lane", None)
        if record is None:
            return
        first = lane.record is None
        lane.record = record
        if first and record.branch is not None:  # the first of its fork's lanes to speak brings the fork
            forks = self.forks.setdefault(record.parent, [])
            if all(f.tokens != record.fork_tokens for f in forks):
                insort(forks, _ForkOutput(record.fork_tokens, record.fork_chars, tuple(record.lanes)))

    # -- a whole completion --------------------------------------------------------------------------

    def whole(self, outputs):
        for o in sorted(outputs, key=lambda o: o.index):
            self._take(o)
        document = _Delta()
        self._flush(0, document)
        trunk = self.trunk_final
        merged = _completion(trunk, document.text, document.token_ids, document.logprobs, trunk.finish_reason,
                             trunk.stop_reason)
        merged.hogwild = self.tree()
        if document.accept_steps is not None:  # each token's engine step, in the document's order
            merged.hogwild["accept_steps"] = document.accept_steps
        return merged

    # -- a stream ------------------------------------------------------------------------------------

    def stream(self, output, finished: bool):
        """One lane's delta in; the delta the client gets now (None: nothing yet)."""
        self._take(output)
        out = _Delta()
        self._flush(0, out)
        if not finished:
            if out.text or out.token_ids:
                return _completion(output, out.text, out.token_ids, out.logprobs, None, None)
            return None
        final = self.trunk_final
        delta = _completion(final, out.text, out.token_ids, out.logprobs, final.finish_reason, final.stop_reason)
        delta.hogwild = self.tree()
        return delta

    # -- the document --------------------------------------------------------------------------------

    def _own(self, index: int) -> int:
        """The tokens of lane ``index`` that are its own text (a lane ≥ 1's forced end of sequence is not)."""
        lane = self.lanes[index]
        if index and lane.finished and lane.record is not None and lane.record.keep is not None:
            return lane.record.keep
        return len(lane.token_ids)

    def _own_steps(self, index: int, own: int) -> int:
        """The engine steps lane ``index``'s own ``own`` tokens took: tokens that share an accept step were fed
        together (forced text fed ahead, accepted drafts); without accept steps, one each."""
        steps = self.lanes[index].accept_steps
        return len(set(steps[:own])) if steps is not None and len(steps) >= own else own

    def _flush(self, index: int, out: _Delta) -> bool:
        """Append to ``out`` what of lane ``index``'s document can go out now (nothing can come before it any
        more); True once all of it has. A fork's branches go whole, in order, at its fork point (the engine
        sends every branch's first token, and with it the fork, before its parent's first token after it; a
        fork the prompt ends in is known from the start)."""
        lane = self.lanes[index]
        forks = self.forks.get(index, ())
        while lane.next_fork < len(forks):
            fork = forks[lane.next_fork]
            self._send(lane, fork.tokens, fork.chars, out)
            if lane.sent_tokens < fork.tokens or lane.sent_chars < fork.chars:
                return False  # its text up to the fork has not all arrived
            while fork.next_lane < len(fork.lanes):
                if not self._flush(fork.lanes[fork.next_lane], out):
                    return False
                fork.next_lane += 1
            lane.next_fork += 1
        self._send(lane, self._own(index), len(lane.text), out)
        return lane.finished

    @staticmethod
    def _send(lane: _LaneOutput, tokens: int, chars: int, out: _Delta) -> None:
        tokens, chars = min(tokens, len(lane.token_ids)), min(chars, len(lane.text))
        if tokens > lane.sent_tokens or chars > lane.sent_chars:
            a = lane.sent_tokens
            out.add(lane.text[lane.sent_chars:chars], lane.token_ids[a:tokens],
                    None if lane.logprobs is None else lane.logprobs[a:tokens],
                    None if lane.accept_steps is None else lane.accept_steps[a:tokens])
            lane.sent_tokens, lane.sent_chars = max(a, tokens), max(lane.sent_chars, chars)

    # -- the tree ------------------------------------------------------------------------------------

    def tree(self) -> dict:
        """``completion.hogwild``: every fork of the trunk, each branch with its part, text (its whole document),
        tokens, sequential steps and its own forks."""
        out = {"protocol": self.spec.options.protocol, "branches_mode": self.spec.options.branches,
               "forked": bool(self.forks)}
        unforked = self.unforked()
        if unforked:
            out["unforked"] = unforked
        trunk_tokens = len(self.lanes[0].token_ids)
        if not self.forks:
            out["sequential_steps"] = self._own_steps(0, trunk_tokens)
            return out
        node = self._node(0)
        out.update(fork_tokens=node["forks"][0]["fork_tokens"], branches=node["forks"][0]["branches"],
                   forks=node["forks"], trunk_tokens=trunk_tokens, num_tokens=node["num_tokens"],
                   sequential_steps=node["steps"])
        return out

    def unforked(self) -> list[dict]:
        """Every goal that did not fork so far, in the order written: the prompt's, then the ones the lanes wrote
        (each record carries all of them up to when it was made: the longest is the latest)."""
        out = [] if self.spec.unforked is None else [{"branch": None, "at": 0, "reason": self.spec.unforked}]
        seen = max((lane.record.unforked for lane in self.lanes if lane.record is not None), key=len, default=())
        return out + [{"branch": branch, "at": at, "reason": reason} for branch, at, reason in seen]

    def _node(self, index: int) -> dict:
        """Lane ``index``'s document: its text, tokens, sequential steps (its own tokens' engine steps and, at
        each of its forks, the branch that took the most) and its forks."""
        lane = self.lanes[index]
        own = self._own(index)
        text, num_tokens, steps, forks, at = [], own, self._own_steps(index, own), [], 0
        for fork in self.forks.get(index, ()):
            text.append(lane.text[at:fork.chars])
            at = fork.chars
            rows = []
            for b in fork.lanes:
                child = self._node(b)
                rows.append({"branch": self.lanes[b].record.branch, "text": child["text"],
                             "num_tokens": child["num_tokens"], "steps": child["steps"],
                             **({"forks": child["forks"]} if child["forks"] else {})})
                text.append(child["text"])
                num_tokens += child["num_tokens"]
            steps += max(r["steps"] for r in rows)
            forks.append({"fork_tokens": fork.tokens, "branches": rows})
        text.append(lane.text[at:])
        return {"text": "".join(text), "num_tokens": num_tokens, "steps": steps, "forks": forks}


def _completion(like, text: str, token_ids, logprobs, finish_reason, stop_reason):
    from vllm.outputs import CompletionOutput

    cumulative = None
    if logprobs:
        cumulative = sum(p[t].logprob for p, t in zip(logprobs, token_ids) if t in p)
    return CompletionOutput(index=0, text=text, token_ids=list(token_ids), cumulative_logprob=cumulative,
                            logprobs=logprobs if logprobs else None, finish_reason=finish_reason,
                            stop_reason=stop_reason, lora_request=getattr(like, "lora_request", None))


# -- the OpenAI server's streams: the tree as the last event --------------------------------------------

