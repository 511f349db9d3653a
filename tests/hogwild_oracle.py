"""Raw-mode Hogwild outside vLLM: a dense float64 re-implementation for the tests.

Layouts: contiguous, isolated, and the two with a shared history of finished
steps (combined, interleaved), whose step ends the caller gives. For those two,
section headers may sit at the prompt's tail: the prompt part of a view then
ends at ``prompt_end`` and each header, a range of prompt positions, appears
only where the view positions it: before the history, before the others'
unfinished steps, after each of them (the pivot) and before the own step.

Written from DESIGN.md's definition only (it imports nothing from the plugin):
N lanes share the prompt; in lock-step, at step k every live worker feeds its
token k, whose K/V is computed in its writer's own context at stored position
``prompt_len + k`` and written before any attention of that layer (with
speculative decoding, the tokens a worker feeds in one step are given by the
steps at which its tokens were accepted, see ``accept_steps``). Worker w's
query then attends its view ``[prompt][every other worker's fed tokens, in
worker order][its own fed tokens]``, with every key rotated at its VIEW
position (the same as re-rotating the stored key) and the query at the view's
last position. A worker's last token is sampled but never fed.

With an FP8 KV cache (``kv_store``: :class:`Fp8Store`) every K and V is what
such a cache holds: vLLM rotates a key at its stored position and stores both
as float8 bytes of the value over the layer's scale; the oracle reads the same
values back (the key rotated back, exactly in float64), prompt included.
"""

from __future__ import annotations

import torch


def _rope(x: torch.Tensor, pos: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """NeoX-style rotation of ``x [L, H, D]`` at positions ``pos [L]``."""
    angle = pos.to(torch.float64)[:, None] * inv_freq[None, :]  # [L, D/2]
    cos, sin = angle.cos()[:, None, :], angle.sin()[:, None, :]
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class Fp8Store:
    """What vLLM 0.32's CPU cache writer keeps of a float32 value in an FP8 cache: ``float8(x / scale)``
    rounded toward zero (its conversion truncates the mantissa), read back times the scale."""

    def __init__(self, fp8: torch.dtype, k_scale: float = 1.0, v_scale: float = 1.0) -> None:
        self.fp8, self.k_scale, self.v_scale = fp8, k_scale, v_scale

    def __call__(self, x: torch.Tensor, scale: float) -> torch.Tensor:
        y = (x.to(torch.float32) / scale)
        near = y.to(self.fp8)
        bits = near.view(torch.uint8).clone()
        bits[near.to(torch.float32).abs() > y.abs()] -= 1  # one step toward zero
        return bits.view(self.fp8).to(torch.float64) * scale


class DenseHogwild:
    def __init__(self, model, kv_store: Fp8Store | None = None) -> None:
        self.model = model.to(torch.float64).eval()
        self.kv_store = kv_store
        cfg = model.config
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.num_heads, self.num_kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        theta = cfg.rope_parameters["rope_theta"]
        self.inv_freq = 1.0 / theta ** (torch.arange(0, self.head_dim, 2, dtype=torch.float64) / self.head_dim)

    def _attend(self, q, ks, vs, q_pos) -> torch.Tensor:
        """q [Hq, D] raw; ks, vs [L, Hkv, D] raw, in view order -> [Hq * D]."""
        n = ks.shape[0]
        k = _rope(ks, torch.arange(n), self.inv_freq)
        qr = _rope(q[None], torch.tensor([q_pos]), self.inv_freq)[0]
        g = self.num_heads // self.num_kv_heads
        k, v = k.repeat_interleave(g, dim=1), vs.repeat_interleave(g, dim=1)  # [L, Hq, D]
        scores = torch.einsum("hd,lhd->hl", qr, k) / self.head_dim**0.5
        return torch.einsum("hl,lhd->hd", scores.softmax(-1), v).reshape(-1)

    @torch.no_grad()
    def logprobs(
        self,
        prompt: list[int],
        outputs: list[list[int]],
        layout: str = "contiguous",
        step_ends: list[list[int]] | None = None,
        prompt_end: int | None = None,
        headers: dict[str, tuple[int, int]] | None = None,
        accept_steps: list[list[int]] | None = None,
        visibility: str = "accepted",
    ) -> list[list[float]]:
        """Each worker's log-probability of each of its output tokens.

        ``combined`` and ``interleaved`` need ``step_ends[w]``: the indices of
        worker w's output tokens that end a step.

        ``accept_steps[w][i]``: the engine step at which worker w's output token i
        was accepted (speculative decoding accepts several per step; default: token
        i at step i, one per step). At step s a worker feeds its tokens i whose
        successor was accepted at s (one row each, causal among them), and reads
        each co-worker's tokens that were accepted before s and fed by s.
        ``visibility="same_step"`` is a control that also shows co-workers' tokens
        accepted at s (drafts being verified): it must not match the engine.
        """
        m = self.model.model
        n_workers, p = len(outputs), len(prompt)
        layers = m.layers
        steps = accept_steps or [list(range(len(o))) for o in outputs]
        assert [len(a) for a in steps] == [len(o) for o in outputs], "one accept step per output token"
        assert all(a == sorted(a) for a in steps), "accept steps never decrease"
        # Prefill: one causal pass over the prompt, shared by every lane.
        h = m.embed_tokens(torch.tensor(prompt))
        keys = [[None] * n_workers for _ in layers]  # raw keys per layer, lane
        vals = [[None] * n_workers for _ in layers]
        for li, layer in enumerate(layers):
            x = layer.input_layernorm(h)
            q, k, v = self._qkv(layer, x)
            k, v = self._stored(k, v, torch.arange(p))
            for w in range(n_workers):
                keys[li][w], vals[li][w] = k.clone(), v.clone()
            attn = torch.stack([self._attend(q[t], k[: t + 1], v[: t + 1], t) for t in range(p)])
            h = h + layer.self_attn.o_proj(attn)
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        first = self._logprobs(h[-1])
        result = [[first[out[0]].item()] for out in outputs]
        # Shared history (combined, interleaved): finished steps as (lane, start, end).
        history: list[tuple[int, int, int]] = []
        starts = [p] * n_workers  # where each lane's part outside the history starts
        pending = [[p + i + 1 for i in ends] for ends in (step_ends or [[] for _ in outputs])]

        def visible(c: int, s: int) -> int:
            """Lane c's tokens others read at step s: accepted before s (or at s: the control), fed by s."""
            a = steps[c]
            seen = (lambda j: a[j] <= s) if visibility == "same_step" else (lambda j: a[j] < s)
            return p + sum(1 for j in range(len(a) - 1) if seen(j) and a[j + 1] <= s)

        for s in sorted({x for a in steps for x in a[1:]}):
            rows = {w: [i for i in range(len(o) - 1) if steps[w][i + 1] == s] for w, o in enumerate(outputs)}
            rows = {w: r for w, r in rows.items() if r}
            length = [visible(c, s) for c in range(n_workers)]
            for w, o in enumerate(outputs):  # steps join, in worker order, once written and followed
                stopped = steps[w][-1] < s
                # A step ending at e joins once the token at e is fed; a stopped lane's rest joins too.
                ends = [e for e in pending[w] if e < length[w]] + ([length[w]] if stopped else [])
                for e in ends:
                    if e > starts[w]:
                        history.append((w, starts[w], e))
                        starts[w] = e
                pending[w] = [e for e in pending[w] if e >= length[w]] if not stopped else []
            hs = {w: m.embed_tokens(torch.tensor([outputs[w][i] for i in r])) for w, r in rows.items()}
            for li, layer in enumerate(layers):
                qs = {}
                for w, r in rows.items():  # every new K/V lands before any attention
                    fed = p + r[0]
                    assert keys[li][w].shape[0] == fed, "a lane feeds its tokens in order"
                    q, kk, vv = self._qkv(layer, layer.input_layernorm(hs[w]))
                    kk, vv = self._stored(kk, vv, p + torch.tensor(r))
                    keys[li][w] = torch.cat([keys[li][w], kk])
                    vals[li][w] = torch.cat([vals[li][w], vv])
                    qs[w] = q
                for w, r in rows.items():
                    outs = []
                    for row, i in enumerate(r):
                        lens = list(length)
                        lens[w] = p + i + 1  # its own tokens up to this row's
                        spans = self._view(w, lens, layout, history, starts,
                                           p if prompt_end is None else prompt_end, headers or {})
                        ks = torch.cat([keys[li][lane][a:b] for lane, a, b in spans])
                        vs = torch.cat([vals[li][lane][a:b] for lane, a, b in spans])
                        outs.append(self._attend(qs[w][row], ks, vs, ks.shape[0] - 1))
                    hs[w] = hs[w] + layer.self_attn.o_proj(torch.stack(outs))
                    hs[w] = hs[w] + layer.mlp(layer.post_attention_layernorm(hs[w]))
            for w, r in rows.items():
                for row, i in enumerate(r):
                    result[w].append(self._logprobs(hs[w][row])[outputs[w][i + 1]].item())
        return result

    @staticmethod
    def _view(w, length, layout, history, starts, prompt_end, headers) -> list[tuple[int, int, int]]:
        """Worker w's view as (lane, start, end) spans in view order; ``length[c]``: lane c's tokens read."""
        others = [o for o in range(len(length)) if o != w]
        if layout == "isolated":
            return [(w, 0, length[w])]
        if layout == "contiguous":
            return [(w, 0, prompt_end)] + [(o, prompt_end, length[o]) for o in others] + [(w, prompt_end, length[w])]
        live = [(o, starts[o], length[o]) for o in others if length[o] > starts[o]] if layout == "combined" else []

        def header(name: str) -> list[tuple[int, int, int]]:
            return [(w, *headers[name])] if name in headers else []

        spans = [(w, 0, prompt_end)]
        if history:
            spans += header("history") + history
        if live:
            spans += header("others")
            for span in live:
                spans += [span] + header("pivot")
        return spans + header("own") + [(w, starts[w], length[w])]

    def _stored(self, k, v, pos):
        """Raw keys and values as the cache holds them at stored positions ``pos`` (unchanged unquantized)."""
        if self.kv_store is None:
            return k, v
        rotated = self.kv_store(_rope(k, pos, self.inv_freq), self.kv_store.k_scale)
        return _rope(rotated, -pos, self.inv_freq), self.kv_store(v, self.kv_store.v_scale)

    def _qkv(self, layer, x):
        a = layer.self_attn
        t = x.shape[0]
        q = a.q_proj(x).view(t, self.num_heads, self.head_dim)
        k = a.k_proj(x).view(t, self.num_kv_heads, self.head_dim)
        v = a.v_proj(x).view(t, self.num_kv_heads, self.head_dim)
        return q, k, v

    def _logprobs(self, h):
        m = self.model
        return m.lm_head(m.model.norm(h[None]))[0].log_softmax(-1)
