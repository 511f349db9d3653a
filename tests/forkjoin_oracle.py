"""Fork/join decoding outside vLLM: a dense float64 re-implementation for the tests.

Written from the protocol's definition in docs/user_guide.md ("Parallel-reasoning models"); it imports
nothing from the plugin. One request: the prompt, a trunk and k branches.

- The trunk decodes over ``[prompt][own]`` until the fork: its first ``fork_tokens`` output tokens;
  ``p0 = len(prompt) + fork_tokens``.
- Branch b's token i is fed at view position ``p0 + i`` (isolated: its view is
  ``[trunk 0..p0][own tokens 0..i]``); with ``hogwild`` branches the view is
  ``[trunk 0..p0][every other branch's tokens fed so far, in branch order][own]``, one
  after another. The branches decode in lock-step: at branch step s each branch feeds its
  token s, and a sibling's tokens 0..s are written before anyone attends.
- After the join the trunk's token ``fork_tokens + j`` reads ``[trunk 0..p0 @0][branch 1 @p0]
  ... [branch k @p0][own @p0 + longest]``; with ``hogwild`` branches the branches one after
  another and its own tokens after them all.

Every key is rotated at its view position in the reader's view and the query at its own.
With ``hogwild`` branches, a branch's forced header (its tokens 0..h-1) is fed in one step after its first
token is forced: each header token reads every sibling's token 0 only (what a sibling feeds in that step
beyond its first token is read from the next step on, as drafts are), then the lock-step above goes on.
A lane's last token is sampled, never fed. Token 0 of a branch is the engine's forced header:
its log-probability is the prompt's last position's when the fork starts at once.

:meth:`DenseForkJoin.tree_logprobs` takes any tree of isolated forks: a branch may fork again
(nested), and a sequence may fork again after a join. A sequence's *content* is its tokens with,
at each of its fork points, every branch's content positioned there (all branches at that one
position; the text after the join after the longest). A token reads what its sequence's parent
read up to the fork, the parent's content up to the fork, then its own sequence's content so far.
Every branch's token 0 is sampled from the prompt alone (its lane's prefill of the prompt).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from tests.hogwild_oracle import DenseHogwild, _rope


class DenseForkJoin(DenseHogwild):
    def _attend_at(self, q, ks, vs, k_pos: list[int], q_pos: int) -> torch.Tensor:
        k = _rope(ks, torch.tensor(k_pos), self.inv_freq)
        qr = _rope(q[None], torch.tensor([q_pos]), self.inv_freq)[0]
        g = self.num_heads // self.num_kv_heads
        k, v = k.repeat_interleave(g, dim=1), vs.repeat_interleave(g, dim=1)
        scores = torch.einsum("hd,lhd->hl", qr, k) / self.head_dim**0.5
        return torch.einsum("hl,lhd->hd", scores.softmax(-1), v).reshape(-1)

    @torch.no_grad()
    def logprobs(self, prompt: list[int], trunk: list[int], branches: list[list[int]], fork_tokens: int,
                 hogwild: bool = False, sequential: bool = False, siblings_visible: bool = False,
                 headers: list[int] | None = None, steps: list[list[int]] | None = None,
                 same_step: bool = False):
        """``(trunk log-probabilities, each branch's)``, one per output token. ``headers``: each branch's forced
        header length (``hogwild`` branches: a header's tokens are fed in one step and read each sibling's
        first token only; what a branch samples after its header reads the siblings as the lock-step does).
        ``steps``: ``hogwild`` branches decoded by engine steps (speculative decoding): ``steps[b][i]`` is the
        step at which branch b's token i was accepted, and one more, the step of its end of sequence. At step s
        a branch feeds its tokens whose successor was accepted at s (one row each, causal among them) and reads
        each sibling's tokens accepted before s and fed by s; ``same_step``, a control, also shows a sibling's
        tokens accepted at s (drafts being verified).

        Controls that must miss the engine: ``sequential`` positions every branch one after another
        (the trunk after them all, and branch b after the branches before it), as a sequential
        decode of the same tokens would; ``siblings_visible`` shows the isolated branches each
        other's tokens (hogwild views with isolated positions)."""
        p, k = len(prompt), len(branches)
        p0 = p + fork_tokens
        lanes = 1 + k
        cache = _Cache(self, lanes)
        run = cache.run
        first = cache.prompt(prompt)
        out_trunk = [first[trunk[0]].item()]
        out_branches = [[first[b[0]].item()] if b else [] for b in branches]
        # The trunk up to the fork: plain decoding.
        for i in range(fork_tokens):
            lp = run([(0, trunk[i], [(0, 0, p + i + 1, 0)])])[0]
            out_trunk.append(lp[trunk[i + 1]].item())
        if steps is not None:
            self._branches_by_step(run, p, p0, branches, steps, same_step, out_branches)
        # The branches, in lock-step: at step s each feeds its token s (its last one too: it is read later).
        for s in range(0 if steps is not None else max((len(b) for b in branches), default=0)):
            rows = []
            for b, tokens in enumerate(branches):
                if s >= len(tokens):
                    continue
                view, at = [(0, 0, p0, 0)], p0
                if sequential:
                    at = p0 + sum(len(x) for x in branches[:b])
                elif hogwild or siblings_visible:
                    for c, other in enumerate(branches):
                        n = min(1 if headers and s < headers[b] else s + 1, len(other))
                        if c != b and n:
                            view.append((c + 1, p, p + n, at if hogwild else p0))
                            at += n if hogwild else 0
                view.append((b + 1, p, p + s + 1, at))
                rows.append((b + 1, tokens[s], view, b))
            lps = run([(lane, t, v) for lane, t, v, _ in rows])
            for (_, _, _, b), lp in zip(rows, lps):
                if s + 1 < len(branches[b]):
                    out_branches[b].append(lp[branches[b][s + 1]].item())
        # The trunk after the join.
        longest = max((len(b) for b in branches), default=0)
        spans, at = [(0, 0, p0, 0)], p0
        for b, tokens in enumerate(branches):
            if tokens:
                spans.append((b + 1, p, p + len(tokens), at))
                at += len(tokens) if (hogwild or sequential) else 0
        own_at = at if (hogwild or sequential) else p0 + longest
        for j, i in enumerate(range(fork_tokens, len(trunk) - 1)):
            view = [*spans, (0, p0, p0 + j + 1, own_at)]
            lp = run([(0, trunk[i], view)])[0]
            out_trunk.append(lp[trunk[i + 1]].item())
        return out_trunk, out_branches

    @staticmethod
    def _branches_by_step(run, p: int, p0: int, branches, steps, same_step: bool, out_branches) -> None:
        """``hogwild`` branches fed by engine steps (see :meth:`logprobs`, ``steps``)."""
        for b, tokens in enumerate(branches):
            assert len(steps[b]) == len(tokens) + 1, "an accept step per token, and its end of sequence's"

        def visible(c: int, s: int) -> int:
            a = steps[c]
            seen = (lambda j: a[j] <= s) if same_step else (lambda j: a[j] < s)
            return sum(1 for j in range(len(branches[c])) if seen(j) and a[j + 1] <= s)

        for s in sorted({x for a in steps for x in a[1:]}):
            rows = []
            for b, tokens in enumerate(branches):
                fed = [i for i in range(len(tokens)) if steps[b][i + 1] == s]
                if not fed:
                    continue
                view, at = [(0, 0, p0, 0)], p0
                for c in range(len(branches)):
                    n = visible(c, s)
                    if c != b and n:
                        view.append((c + 1, p, p + n, at))
                        at += n
                rows += [(b + 1, tokens[i], [*view, (b + 1, p, p + i + 1, at)], b, i) for i in fed]
            lps = run([(lane, t, v) for lane, t, v, _, _ in rows])
            for (_, _, _, b, i), lp in zip(rows, lps):
                if i + 1 < len(branches[b]):
                    out_branches[b].append(lp[branches[b][i + 1]].item())

    @torch.no_grad()
    def tree_logprobs(self, prompt: list[int], root: "Node", sequential: bool = False,
                      siblings_visible: bool = False) -> "Node":
        """The log-probability of every token of every sequence of ``root`` (the trunk), as a tree of the same
        shape. Controls that must miss the engine: ``sequential`` positions a fork's branches one after another;
        ``siblings_visible`` shows each branch the branches of its fork before it."""
        cache = _Cache(self, 1)
        first = cache.prompt(prompt)
        p = len(prompt)

        def walk(node: Node, lane: int, context: list, at: int) -> tuple[Node, list, int]:
            """Feed ``node``'s tokens in lane ``lane`` (its own text from stored position ``p``, positioned from view
            position ``at``), reading ``context`` before its own content; returns its log-probabilities, its
            content (spans ``(lane, start, end, view start)``) and the view position after it."""
            content = [(0, 0, p, 0)] if lane == 0 else []
            start, start_at = p, at  # its own text since its last fork point: stored, positioned
            lps, forks = [first[node.tokens[0]].item()], []
            at_fork = dict(node.forks)
            fed = len(node.tokens) - 1 if lane == 0 else len(node.tokens)  # the trunk's last token is not fed
            for j in range(fed + 1):
                if j in at_fork:  # tokens 0..j-1 are fed: the branches run, then the text after the join
                    content.append((lane, start, p + j, start_at))
                    base = end = at
                    children, before = [], []
                    for child in at_fork[j]:
                        seen = context + content + (before if siblings_visible else [])
                        tree, c_content, c_end = walk(child, cache.new_lane(p), seen, end if sequential else base)
                        children.append(tree)
                        before += c_content
                        end = max(end, c_end)
                    content += before
                    forks.append((j, children))
                    at, start, start_at = end, p + j, end
                if j == fed:
                    break
                view = context + content + [(lane, start, p + j + 1, start_at)]
                logits = cache.run([(lane, node.tokens[j], view)])[0]
                if j + 1 < len(node.tokens):
                    lps.append(logits[node.tokens[j + 1]].item())
                at += 1
            content.append((lane, start, p + fed, start_at))
            return Node(lps, forks), [c for c in content if c[2] > c[1]], at

        return walk(root, 0, [], p)[0]


@dataclass
class Node:
    """One sequence of a fork/join request: its tokens (or log-probabilities), and at each fork point (its
    tokens before it) the branches of that fork, in order."""

    tokens: list
    forks: list[tuple[int, list["Node"]]] = field(default_factory=list)


class _Cache:
    """Every lane's unrotated K/V, layer by layer; rows of one step are written before any attention."""

    def __init__(self, oracle: DenseForkJoin, lanes: int) -> None:
        self.oracle = oracle
        empty = torch.zeros(0, oracle.num_kv_heads, oracle.head_dim, dtype=torch.float64)
        layers = oracle.model.model.layers
        self.keys = [[empty] * lanes for _ in layers]
        self.vals = [[empty] * lanes for _ in layers]

    def prompt(self, prompt: list[int]) -> torch.Tensor:
        """Lane 0 prefills the prompt (every lane holds it: see :meth:`new_lane`); the last position's logprobs."""
        first = None
        for i, t in enumerate(prompt):
            first = self.run([(0, t, [(0, 0, i + 1, 0)])])[0]
        for lane in range(1, len(self.keys[0])):
            self.copy_prompt(lane, len(prompt))
        return first

    def copy_prompt(self, lane: int, p: int) -> None:
        for li in range(len(self.keys)):
            self.keys[li][lane], self.vals[li][lane] = self.keys[li][0][:p].clone(), self.vals[li][0][:p].clone()

    def new_lane(self, p: int) -> int:
        for li in range(len(self.keys)):
            self.keys[li].append(None)
            self.vals[li].append(None)
        lane = len(self.keys[0]) - 1
        self.copy_prompt(lane, p)
        return lane

    def run(self, rows):
        """One engine step: ``rows`` of (lane, token, view) with view [(lane, start, end, view_start)], own
        last; every row's K/V is written (at the end of its lane) before any attention."""
        o = self.oracle
        m = o.model.model
        h = m.embed_tokens(torch.tensor([t for _, t, _ in rows]))
        for li, layer in enumerate(m.layers):
            q, kk, vv = o._qkv(layer, layer.input_layernorm(h))
            for r, (lane, _, _) in enumerate(rows):  # stored at the end of its lane (an FP8 cache: as it holds it)
                k, v = o._stored(kk[r:r + 1], vv[r:r + 1], torch.tensor([len(self.keys[li][lane])]))
                self.keys[li][lane] = torch.cat([self.keys[li][lane], k])
                self.vals[li][lane] = torch.cat([self.vals[li][lane], v])
            outs = []
            for r, (_, _, view) in enumerate(rows):
                ks = torch.cat([self.keys[li][ln][a:b] for ln, a, b, _ in view])
                vs = torch.cat([self.vals[li][ln][a:b] for ln, a, b, _ in view])
                pos = [v0 + i for _, a, b, v0 in view for i in range(b - a)]
                outs.append(o._attend_at(q[r], ks, vs, pos, pos[-1]))
            h = h + layer.self_attn.o_proj(torch.stack(outs))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        return [o._logprobs(h[r]) for r in range(len(rows))]
