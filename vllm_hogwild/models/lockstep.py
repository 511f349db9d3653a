"""What the engine computes for a Hogwild group in raw mode, as one differentiable forward pass (for training).

In the engine every token's K/V is computed once, by its writer, in the writer's own view at the step it was
fed, and co-workers read it at their view positions (RoPE re-rotation). A plain forward pass over one reader's
view laid out as one flat sequence computes something else: each co-worker token's K/V from layer 1 on would be
recomputed in the reader's context. :func:`group_logits` computes what the engine computes, exactly: all of a
group's workers and steps at once, layer by layer (a token's hidden state at layer ``l`` depends only on layer
``l - 1``'s keys and values of the tokens in its view, which were computed in their own writers' views), with
teacher forcing. :func:`flat_logits` is the control, the flat pass over each reader's view.

The layout is ``contiguous`` (``[prompt][each co-worker's fed tokens, in worker order][own]``) or ``isolated``
(``[prompt][own]``); steps are lock-step: at step ``j`` every live worker feeds its token ``j``, whose K/V every
co-worker reads in the same step (the engine writes a step's K/V before any attention), and a worker's last
token (its end of sequence, or its budget's last) is sampled but never fed. Worker ``w``'s token ``0`` comes
from the view ``[prompt]``; its token ``j + 1`` from its view at step ``j``.

Pure torch over a Hugging Face Llama's modules (``LlamaForCausalLM``, default RoPE): no vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

LAYOUTS = ("contiguous", "isolated")


@dataclass(frozen=True)
class TrainingGroup:
    """One group's run: its prompt and each worker's output tokens (the last one is never fed)."""

    prompt: tuple[int, ...]
    outputs: tuple[tuple[int, ...], ...]

    @property
    def num_workers(self) -> int:
        return len(self.outputs)

    def fed(self, w: int) -> int:
        """Tokens worker ``w`` feeds: every output token but its last."""
        return max(0, len(self.outputs[w]) - 1)


def _angles(pos: torch.Tensor, inv_freq: torch.Tensor, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of ``pos [...]``'s rotation, ``[..., 1, D/2]`` (broadcast over heads)."""
    angle = pos.to(inv_freq.dtype)[..., None] * inv_freq
    return angle.cos().unsqueeze(-2).to(dtype), angle.sin().unsqueeze(-2).to(dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """NeoX-style rotation of ``x [..., H, D]`` by precomputed angles."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def _inv_freq(config, head_dim: int, device) -> torch.Tensor:
    rope = getattr(config, "rope_parameters", None) or {}
    kind = rope.get("rope_type", "default")
    if kind != "default":
        raise ValueError(f"rope_type: {kind!r}; the lock-step forward takes default RoPE")
    theta = rope.get("rope_theta", getattr(config, "rope_theta", 10000.0))
    return 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64, device=device) / head_dim)


def _batch(groups: Sequence[TrainingGroup], pad: int, device):
    """Padded tensors of groups with the same number of workers."""
    n = groups[0].num_workers
    if any(g.num_workers != n for g in groups):
        raise ValueError("groups: the same number of workers in one batch")
    b = len(groups)
    p = max(len(g.prompt) for g in groups)
    t = max(1, max(g.fed(w) for g in groups for w in range(n)))
    prompt = torch.full((b, p), pad, dtype=torch.long)
    lanes = torch.full((b, n, t), pad, dtype=torch.long)
    prompt_len = torch.tensor([len(g.prompt) for g in groups])
    fed = torch.tensor([[g.fed(w) for w in range(n)] for g in groups])
    for i, g in enumerate(groups):
        prompt[i, :len(g.prompt)] = torch.tensor(g.prompt)
        for w in range(n):
            k = g.fed(w)
            if k:
                lanes[i, w, :k] = torch.tensor(g.outputs[w][:k])
    return prompt.to(device), lanes.to(device), prompt_len.to(device), fed.to(device)


def group_logits(model, groups: Sequence[TrainingGroup], layout: str = "contiguous", pad: int = 0,
                 attention: tuple[int, int] | None = None):
    """The engine's logits for every output token of every worker, teacher forced.

    Returns ``(first [B, V], lanes [B, N, T, V], prompt_len [B], fed [B, N])``: ``first[b]`` predicts every
    worker's token 0 (the view ``[prompt]``); ``lanes[b, w, j]`` predicts worker ``w``'s token ``j + 1`` (valid
    for ``j < fed[b, w]``). ``groups``: one batch, each with the same number of workers.

    Per layer: the prompt attends causally to itself; every fed token ``(w, j)`` attends to the prompt and to
    each lane's tokens it reads at step ``j`` (``i < len_L(j)``, its own up to itself), each segment with the
    query rotated by that segment's RoPE delta (its view position minus its stored one), all segments under one
    softmax.

    ``attention=(layer, head)`` also returns, fifth, that head's attention of every fed token ``[B, N, T, P + N * T]``
    over the prompt's positions then each lane's tokens in lane order (``contiguous``; zero where it does not read),
    so that training can ask a head to look at something.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout: one of {LAYOUTS}")
    m = model.model
    cfg = model.config
    param = next(model.parameters())
    device, dtype = param.device, param.dtype
    prompt, lanes, prompt_len, fed = _batch(groups, pad, device)
    b, p = prompt.shape
    n, t = lanes.shape[1], lanes.shape[2]
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    g = heads // kv_heads
    inv_freq = _inv_freq(cfg, head_dim, device)
    neg = torch.finfo(dtype).min

    # Positions and masks (the same at every layer).
    steps = torch.arange(t, device=device)  # j, and i for keys
    lens = torch.minimum(steps[None, None, :] + 1, fed[:, :, None])  # [B, N, T]: lane o's tokens read at step j
    if layout == "isolated":
        lens = torch.zeros_like(lens)
    eye = torch.eye(n, dtype=torch.bool, device=device)
    others = lens[:, None, :, :].expand(b, n, n, t).masked_fill(eye[None, :, :, None], 0)  # [B, w, o, T]
    stored = prompt_len[:, None] + steps[None, :]  # [B, T]: a lane token's stored position
    q_pos_prompt = stored[:, None, :] + others.sum(2)  # [B, w, T]: the query's view position
    # lane L's segment: the query at its stored position plus the co-workers' tokens from lane L on (own: 0)
    q_pos_lane = stored[:, None, None, :] + others.flip(2).cumsum(2).flip(2)  # [B, w, L, T]
    q_pos_lane = torch.where(eye[None, :, :, None], stored[:, None, None, :], q_pos_lane)
    reads = steps[None, None, None, None, :] < lens[:, None, :, :, None]  # [B, w, L, j, i]: i < len_L(j)
    own = steps[None, :] <= steps[:, None]  # [j, i]: i <= j
    reads = torch.where(eye[None, :, :, None, None], own[None, None, None], reads)
    reads = reads & (steps[None, None, :] < fed[:, :, None])[:, :, None, :, None]  # live queries only
    lane_mask = reads.permute(0, 1, 3, 2, 4).reshape(b, n, 1, 1, t, n * t)  # [B, w, 1, 1, j, L*i]
    positions = torch.arange(p, device=device)
    prompt_valid = positions[None, :] < prompt_len[:, None]  # [B, P]
    prompt_mask = (positions[:, None] >= positions[None, :])[None, None] & prompt_valid[:, None, None, :]  # [B,1,P,P]
    cos_p, sin_p = _angles(positions, inv_freq, dtype)  # [P, 1, D/2]
    cos_s, sin_s = _angles(stored, inv_freq, dtype)  # [B, T, 1, D/2]
    cos_qp, sin_qp = _angles(q_pos_prompt, inv_freq, dtype)  # [B, w, T, 1, D/2]
    cos_ql, sin_ql = _angles(q_pos_lane, inv_freq, dtype)  # [B, w, L, T, 1, D/2]

    h_prompt = m.embed_tokens(prompt)  # [B, P, d]
    h_lanes = m.embed_tokens(lanes)  # [B, N, T, d]
    scale = head_dim ** -0.5
    looked = None
    if attention is not None and layout != "contiguous":
        raise ValueError("attention: of the contiguous layout")
    for index, layer in enumerate(m.layers):
        a = layer.self_attn
        xp, xl = layer.input_layernorm(h_prompt), layer.input_layernorm(h_lanes)
        # queries grouped by their KV head: [..., Hkv, G, D]; keys and values [..., Hkv, D]
        qp = a.q_proj(xp).view(b, p, kv_heads, g, head_dim)
        kp = _rotate(a.k_proj(xp).view(b, p, kv_heads, head_dim), cos_p, sin_p)
        vp = a.v_proj(xp).view(b, p, kv_heads, head_dim)
        ql = a.q_proj(xl).view(b, n, t, kv_heads * g, head_dim)
        kl = _rotate(a.k_proj(xl).view(b, n, t, kv_heads, head_dim), cos_s[:, None], sin_s[:, None])
        vl = a.v_proj(xl).view(b, n, t, kv_heads, head_dim)

        qp = _rotate(qp.view(b, p, heads, head_dim), cos_p, sin_p)
        out_p = torch.nn.functional.scaled_dot_product_attention(  # [B, H, P, D]
            qp.transpose(1, 2), kp.transpose(1, 2), vp.transpose(1, 2), attn_mask=prompt_mask, scale=scale,
            enable_gqa=True)
        out_p = out_p.transpose(1, 2).reshape(b, p, heads * head_dim)

        q_prompt = _rotate(ql, cos_qp, sin_qp).view(b, n, t, kv_heads, g, head_dim)
        s_prompt = torch.einsum("bwjkgd,bpkd->bwkgjp", q_prompt, kp) * scale
        s_prompt = s_prompt.masked_fill(~prompt_valid[:, None, None, None, None, :], neg)
        if layout == "isolated":  # its own lane only
            q_own = _rotate(ql, cos_s[:, None], sin_s[:, None]).view(b, n, t, kv_heads, g, head_dim)
            s_lane = torch.einsum("bwjkgd,bwikd->bwkgji", q_own, kl) * scale
            mask = own[None, None, None, None] & (steps[None, None, :] < fed[:, :, None])[:, :, None, None, :, None]
            s_lane = s_lane.masked_fill(~mask, neg)
            att = torch.cat([s_prompt, s_lane], dim=-1).softmax(-1)
            out_l = torch.einsum("bwkgjp,bpkd->bwjkgd", att[..., :p], vp) + \
                torch.einsum("bwkgji,bwikd->bwjkgd", att[..., p:], vl)
        else:  # every lane, each with its own rotation of the query
            q_lanes = _rotate(ql[:, :, None], cos_ql, sin_ql).view(b, n, n, t, kv_heads, g, head_dim)
            s_lane = torch.einsum("bwljkgd,blikd->bwkgjli", q_lanes, kl).reshape(b, n, kv_heads, g, t, n * t) * scale
            s_lane = s_lane.masked_fill(~lane_mask, neg)
            att = torch.cat([s_prompt, s_lane], dim=-1).softmax(-1)
            if attention is not None and attention[0] == index:
                looked = att[:, :, attention[1] // g, attention[1] % g]  # [B, N, T, P + N * T]
            out_l = torch.einsum("bwkgjp,bpkd->bwjkgd", att[..., :p], vp) + \
                torch.einsum("bwkgjx,bxkd->bwjkgd", att[..., p:], vl.reshape(b, n * t, kv_heads, head_dim))
        out_l = out_l.reshape(b, n, t, heads * head_dim)
        h_prompt = h_prompt + a.o_proj(out_p)
        h_lanes = h_lanes + a.o_proj(out_l)
        h_prompt = h_prompt + layer.mlp(layer.post_attention_layernorm(h_prompt))
        h_lanes = h_lanes + layer.mlp(layer.post_attention_layernorm(h_lanes))
    last = h_prompt[torch.arange(b, device=device), prompt_len - 1]  # [B, d]
    first = model.lm_head(m.norm(last))
    if attention is not None:
        if looked is None:
            raise ValueError(f"attention: layer {attention[0]} of {len(m.layers)}")
        return first, model.lm_head(m.norm(h_lanes)), prompt_len, fed, looked
    return first, model.lm_head(m.norm(h_lanes)), prompt_len, fed


def group_logprobs(model, group: TrainingGroup, layout: str = "contiguous") -> list[list[float]]:
    """Each worker's log-probability of each of its output tokens, as the engine computes them."""
    first, lanes, _, fed = group_logits(model, [group], layout)
    first_lp = first[0].log_softmax(-1)
    lanes_lp = lanes[0].log_softmax(-1)
    out = []
    for w, tokens in enumerate(group.outputs):
        row = [first_lp[tokens[0]].item()] if tokens else []
        row += [lanes_lp[w, j, tokens[j + 1]].item() for j in range(int(fed[0, w]))]
        out.append(row)
    return out


def flat_logprobs(model, group: TrainingGroup, layout: str = "contiguous") -> list[list[float]]:
    """The control: each token's log-probability from a plain forward pass over its reader's view laid out as one
    flat sequence (every co-worker token's K/V recomputed in the reader's context) — not what the engine
    computes."""
    prompt, n = list(group.prompt), group.num_workers
    fed = [group.fed(w) for w in range(n)]
    out = []
    with torch.no_grad():
        for w, tokens in enumerate(group.outputs):
            row = []
            for j in range(len(tokens)):
                # token j comes from the view at step j - 1: others' tokens 0..j-1, own 0..j-1
                others = [] if layout == "isolated" else \
                    [x for o in range(n) if o != w for x in group.outputs[o][:min(j, fed[o])]]
                view = prompt + others + list(tokens[:j])
                logits = model(input_ids=torch.tensor([view])).logits[0, -1]
                row.append(logits.log_softmax(-1)[tokens[j]].item())
            out.append(row)
    return out
