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
A lane's last token is sampled, never fed. Token 0 of a branch is the engine's placed header:
its log-probability is the prompt's last position's when the fork starts at once.
"""

from __future__ import annotations

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
                 hogwild: bool = False, sequential: bool = False, siblings_visible: bool = False):
        """``(trunk log-probabilities, each branch's)``, one per output token.

        Controls that must miss the engine: ``sequential`` places every branch one after another
        (the trunk after them all, and branch b after the branches before it), as a sequential
        decode of the same tokens would; ``siblings_visible`` shows the isolated branches each
        other's tokens (hogwild views with isolated positions)."""
        m = self.model.model
        layers = m.layers
        p, k = len(prompt), len(branches)
        p0 = p + fork_tokens
        lanes = 1 + k
        keys = [[torch.zeros(0, self.num_kv_heads, self.head_dim, dtype=torch.float64)] * lanes for _ in layers]
        vals = [[torch.zeros(0, self.num_kv_heads, self.head_dim, dtype=torch.float64)] * lanes for _ in layers]

        def run(rows):
            """One engine step: ``rows`` of (lane, token, view) with view [(lane, start, end, view_start)], own
            last; every row's K/V is written (at the end of its lane) before any attention."""
            h = m.embed_tokens(torch.tensor([t for _, t, _ in rows]))
            for li, layer in enumerate(layers):
                q, kk, vv = self._qkv(layer, layer.input_layernorm(h))
                for r, (lane, _, _) in enumerate(rows):
                    keys[li][lane] = torch.cat([keys[li][lane], kk[r:r + 1]])
                    vals[li][lane] = torch.cat([vals[li][lane], vv[r:r + 1]])
                outs = []
                for r, (_, _, view) in enumerate(rows):
                    ks = torch.cat([keys[li][ln][a:b] for ln, a, b, _ in view])
                    vs = torch.cat([vals[li][ln][a:b] for ln, a, b, _ in view])
                    pos = [v0 + i for _, a, b, v0 in view for i in range(b - a)]
                    outs.append(self._attend_at(q[r], ks, vs, pos, pos[-1]))
                h = h + layer.self_attn.o_proj(torch.stack(outs))
                h = h + layer.mlp(layer.post_attention_layernorm(h))
            return [self._logprobs(h[r]) for r in range(len(rows))]

        # The prompt, once; every lane holds it.
        first = None
        for i, t in enumerate(prompt):
            first = run([(0, t, [(0, 0, i + 1, 0)])])[0]
        for lane in range(1, lanes):
            for li in range(len(layers)):
                keys[li][lane], vals[li][lane] = keys[li][0].clone(), vals[li][0].clone()
        out_trunk = [first[trunk[0]].item()]
        out_branches = [[first[b[0]].item()] if b else [] for b in branches]
        # The trunk up to the fork: plain decoding.
        for i in range(fork_tokens):
            lp = run([(0, trunk[i], [(0, 0, p + i + 1, 0)])])[0]
            out_trunk.append(lp[trunk[i + 1]].item())
        # The branches, in lock-step: at step s each feeds its token s (its last one too: it is read later).
        for s in range(max((len(b) for b in branches), default=0)):
            rows = []
            for b, tokens in enumerate(branches):
                if s >= len(tokens):
                    continue
                view, at = [(0, 0, p0, 0)], p0
                if sequential:
                    at = p0 + sum(len(x) for x in branches[:b])
                elif hogwild or siblings_visible:
                    for c, other in enumerate(branches):
                        if c != b and min(s + 1, len(other)):
                            n = min(s + 1, len(other))
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
