"""The merges task's policies run token by token in lock-step (:mod:`.merges`): every baseline's steps, and the
policy a collaborator imitates, sampled. Engine steps are each worker's tokens, its end of sequence included.
Pure: no torch, no vLLM."""

from __future__ import annotations

import random
from dataclasses import dataclass

from vllm_hogwild.tasks.links import FOUND, GOAL, PATH_END, SLOTS, _check_int
from vllm_hogwild.tasks.merges import REFERENCE, MergesTask

ASSIGNS = ("claim", "sample", "round-robin")
READS = ("shared", "finished", "own")
EOS = ""  # a worker's end of sequence in :attr:`Run.tokens`


@dataclass(frozen=True)
class MergesRun:
    tokens: tuple[tuple[str, ...], ...]  # each worker's tokens, its end of sequence (EOS) last
    steps: int  # engine steps until the group ended: its longest lane (or the step after the cancelling one)

    @property
    def texts(self) -> list[str]:
        return ["".join(lane) for lane in self.tokens]


def run(task: MergesTask, num_workers: int, assign: str = "claim", reads: str = "shared", reuse: bool = True,
        cancel: bool = True, rng: random.Random | None = None, max_steps: int = 4096) -> MergesRun:
    """One group's lock-step run of a policy on ``task``: at every step every live worker writes one token, and
    a token written at step ``j`` is read from step ``j + 1`` (``reads="shared"``: everyone's; ``"finished"``:
    everyone's finished entries only, the step after their end, the delayed-visibility control; ``"own"``: the
    worker's own lane only, an independent request or the isolated control).

    - ``assign``: ``"claim"``, a free worker takes the first start nobody has claimed in its view (workers free
      in the same step take distinct ones, in worker order: the ideal, no collision); ``"sample"``, a uniform
      choice among those, drawn from ``rng`` (workers free in one step may collide and both do the start, as
      sampled workers do); ``"round-robin"``, worker ``i`` does starts ``i, i + N, ...`` in order, made in
      advance;
    - ``reuse``: a worker whose path's next node some entry in its view has written as a node (it goes on past it
      there) writes that node and :data:`REFERENCE` as one token, ending its entry (the merges collaborator's
      tokens: :mod:`vllm_hogwild.models.merges_collaborator`);
    - ``cancel`` (find mode): the group ends in the step after its last start reaching the goal is written (a
      client that cancels the rest; without it a worker stops only when its own entries hold every one of them).

    A worker with nothing left to take writes its end of sequence."""
    _check_int("num_workers", num_workers, 1, 64)
    if assign not in ASSIGNS:
        raise ValueError(f"assign: one of {ASSIGNS}")
    if reads not in READS:
        raise ValueError(f"reads: one of {READS}")
    if assign == "sample" and rng is None:
        raise ValueError("rng: a random.Random for assign='sample'")
    n, paths, find = num_workers, task.paths, task.mode == "find"
    answer = set(task.answer)
    lanes: list[list[str]] = [[] for _ in range(n)]
    current: list[list | None] = [None] * n  # [index, nodes written] of a worker's open entry
    done = [False] * n
    views = n if reads == "own" else 1
    pending: list[tuple[set, set]] = [(set(), set()) for _ in range(n)]  # "finished": an open entry's claim, passes
    claimed = [set() for _ in range(views)]
    passed = [set() for _ in range(views)]  # nodes an entry went on past
    written = [set() for _ in range(n)]  # starts each worker's own entries hold right (find mode's stop)
    everyone: set = set()
    share = [list(range(w, len(paths), n)) for w in range(n)]
    for step in range(max_steps):
        if all(done):
            return MergesRun(tuple(map(tuple, lanes)), step)
        taking: set = set()
        out = []
        for w in range(n):
            if done[w]:
                out.append(None)
                continue
            v = w if reads == "own" else 0
            entry_now = current[w]
            if entry_now is None:
                # "claim" knows what the others free in this step take (the ideal); "sample" does not
                index = _next_start(assign, share[w], (claimed[v] | taking) if assign == "claim" else claimed[v],
                                    len(paths), rng)
                if index is None or (find and not cancel and answer <= written[w]):
                    out.append((EOS, ("eos", None)))
                    continue
                taking.add(index)
                out.append((f"\n{SLOTS[index]}:", ("claim", index)))
                continue
            index, k = entry_now
            path = paths[index]
            last = path[k - 1] if k else None
            if k == 0:
                out.append((f" {path[0]}", ("node", path[0])))
            elif isinstance(last, str):
                out.append((FOUND if find and last == GOAL else PATH_END, ("end", None)))
            elif reuse and isinstance(path[k], int) and path[k] in passed[v]:
                out.append((f" {path[k]}{REFERENCE}", ("end", None)))  # the node and the reference: one token
            else:
                out.append((f" {path[k]}", ("node", path[k])))
        for w, item in enumerate(out):  # written this step: read from the next
            if item is None:
                continue
            token, (kind, value) = item
            lanes[w].append(token)
            v = w if reads == "own" else 0
            seen_claims, seen_passes = pending[w] if reads == "finished" else (claimed[v], passed[v])
            if token == EOS:
                done[w] = True
            elif kind == "claim":
                seen_claims.add(value)
                current[w] = [value, 0]
            else:
                index, k = current[w]
                if kind == "node" and isinstance(value, int):  # a node written as a node: its entry goes on past it
                    seen_passes.add(value)
                if kind == "end":
                    if reads == "finished":  # the whole entry, read from the next step
                        claimed[0].update(seen_claims)
                        passed[0].update(seen_passes)
                        pending[w] = (set(), set())
                    current[w] = None
                    written[w].add(index)
                    everyone.add(index)
                else:
                    current[w][1] = k + 1
        if find and cancel and answer <= everyone:
            return MergesRun(tuple(map(tuple, lanes)), step + 2)  # the step after: the group's end
    raise ValueError(f"max_steps: the run did not end in {max_steps} steps")


def _next_start(assign: str, share: list[int], taken: set, count: int, rng) -> int | None:
    if assign == "round-robin":  # its own share, made in advance: nobody else takes from it
        return share.pop(0) if share else None
    free = [i for i in range(count) if i not in taken]
    if not free:
        return None
    return free[0] if assign == "claim" else rng.choice(free)


BASELINES = {
    # name: (assign, reads, reuse, cancel); every one from the true costs, no model
    "round-robin split": ("round-robin", "own", True, False),
    "split + cancel": ("round-robin", "own", True, True),
    "ideal policy": ("claim", "shared", False, True),
    "ideal reuse policy": ("claim", "shared", True, True),
}


def baseline_steps(task: MergesTask, num_workers: int, name: str) -> int:
    """The steps of one of :data:`BASELINES` on ``task``: the round-robin split and the split with cancel reuse
    only their own share's paths (an independent request reads its own text); the ideal policy claims as it goes
    and reuses nothing; the ideal reuse policy claims as it goes and reuses everything its view shows."""
    if name not in BASELINES:
        raise ValueError(f"name: one of {tuple(BASELINES)}")
    assign, reads, reuse, cancel = BASELINES[name]
    return run(task, num_workers, assign, reads, reuse, cancel).steps
