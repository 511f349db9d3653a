"""What training asks one attention head to look at: the presence head (``--presence`` of :mod:`.train_links`, the
merges collaborator) and the check head (``--check-head``, the checking collaborator, at the end of this file).

Whether a path's next node ``n`` is written as a node or as its reference (``" n="``) turns on whether some lane in
the worker's view has already written ``n``: a lookup of ``n`` among the written tokens. The model decides ``n``
itself by its third layer (read off the link from the path's last node), in the direction of ``n``'s own token row
(the embedding is tied), so the reader's own position, and a co-worker's that is about to write ``n`` in the same
step, hold ``n`` as well: a head that matches the decided node against the tokens in the view finds those first.
Trained on the tokens' loss alone, no head of the models tried came to look at the written node (each put under
0.02 of its attention there). This loss asks one head to: at every token a path's next node is due at, all of its
attention on that node's tokens in the lanes where the reference is due, and on the prompt's first token where the
node is due (nobody has written it); the model learns the rest from the tokens' loss.

A check is due (:mod:`vllm_hogwild.models.checks_collaborator`) where a co-worker's finished entry shares a node with
another start's: the choice of which letter to check turns on a node written twice. Trained on the tokens' loss
alone, a first checking model chose a due check 0 times in 384 (``docs/user_guide.md``). The check head's loss asks
one head, at every token where a check is due, to put its attention on the tokens of such shared nodes.
"""

from __future__ import annotations

# (layer, head): the third layer's first, whose removal raised the first merges model's loss least of the third
# layer's heads (0.607 from 0.589; its kv partner's, 0.606)
PRESENCE_HEAD = (2, 0)


def presence_tables(vocab):
    """``(plain, is_ref)`` over the vocabulary: each node's or reference's token -> its node's plain token (-1 for
    every other token), and whether a token is a reference (built once per training run)."""
    import torch

    plain = torch.full((vocab.size,), -1, dtype=torch.long)
    for node, token in vocab.node.items():
        if isinstance(node, int):
            plain[token] = token
    for token, node in vocab.node_of_reference.items():
        plain[token] = vocab.node[node]
    is_ref = torch.zeros(vocab.size, dtype=torch.bool)
    is_ref[list(vocab.node_of_reference)] = True
    return plain, is_ref


def presence_loss(att, groups, index, share, weight, vocab, pad: int, tables=None):
    """Merges: the mean, over the tokens a path's next node is due at (those where its reference is, and those
    where the node is, weighing alike), of ``-log`` of the attention the presence head gives what decides between
    the node and its reference: where the reference is due (some lane in the view wrote the node), the lanes'
    tokens of that node; where the node is due, the prompt's first token (nobody wrote it). ``att [B, N, T, P + N *
    T]``: the head's attention (:func:`.train_links.hidden_of`); ``index``/``share``/``weight`` the batch's labels;
    ``tables``: :func:`presence_tables` of ``vocab`` (built here when not given)."""
    import torch

    from vllm_hogwild.models.lockstep import _batch

    b, n, t, x = att.shape
    prompt, lanes, _, _ = _batch(groups, pad, att.device)  # the keys' tokens, laid out as the attention's
    keys = torch.cat([torch.nn.functional.pad(prompt, (0, x - n * t - prompt.shape[1]), value=pad),
                      torch.nn.functional.pad(lanes, (0, t - lanes.shape[2]), value=pad).reshape(b, n * t)], dim=1)
    plain, is_ref = tables if tables is not None else presence_tables(vocab)
    target = index[:, :, 1:t + 1, 0]  # the token fed token j predicts
    if target.shape[2] < t:
        target = torch.nn.functional.pad(target, (0, t - target.shape[2]))
    sure = (share[:, :, 1:t + 1, 0] == 1) & (weight[:, :, 1:t + 1] > 0)
    if sure.shape[2] < t:
        sure = torch.nn.functional.pad(sure, (0, t - sure.shape[2]))
    node = plain[target]
    due = sure & (node >= 0)
    if not due.any():
        return att.sum() * 0.0
    ref = is_ref[target]
    match = keys[:, None, None, :] == node[..., None]  # [B, N, T, X]
    mass_ref = (att * match).sum(-1)
    nll = -torch.where(ref, mass_ref, att[..., 0]).clamp_min(1e-6).log()
    parts = [nll[due & kind].mean() for kind in (ref, ~ref) if (due & kind).any()]
    return sum(parts) / len(parts)  # the two kinds alike: a reference is due far less often than a node


# -- checks: the head asked to look at what makes a check due -------------------------------------------------------

# (layer, head): the last layer's first; what it reads at a shared node (the letters of the entries it is in) has
# three layers below it to be put there
CHECK_HEAD = (3, 0)


def shared_node_tokens(vocab, outputs) -> set[int]:
    """The tokens of the internal nodes that entries or checks of two starts or more pass through, over one
    group's ``outputs`` (each lane's tokens, an entry the run left open counted as if ended there):
    :meth:`.checks_collaborator.ChecksVisible.shared_nodes` of the whole run."""
    from vllm_hogwild.models.checks_collaborator import ChecksVisible

    seen = ChecksVisible(vocab, len(outputs))
    for worker, lane in enumerate(outputs):
        for token in (*lane, vocab.path_end):
            seen.add(worker, token)
    return {vocab.node[node] for node in seen.shared_nodes() if isinstance(node, int)}


def check_head_loss(att, groups, weight, vocab, pad: int, due_weight: float):
    """Checks: the mean, over the tokens where a check is due (``weight == due_weight``), of ``-log`` of the
    attention the check head gives the lanes' tokens of the nodes two starts' entries pass through
    (:func:`shared_node_tokens` of the group's run; the prompt's tokens are never those). ``att [B, N, T, P + N *
    T]``: the head's attention (:func:`.train_links.hidden_of`), laid out as :func:`presence_loss`'s."""
    import torch

    from vllm_hogwild.models.lockstep import _batch

    b, n, t, x = att.shape
    due = weight[:, :, 1:t + 1] == due_weight  # the token fed at j predicts token j + 1
    if due.shape[2] < t:
        due = torch.nn.functional.pad(due, (0, t - due.shape[2]))
    if not due.any():
        return att.sum() * 0.0
    _, lanes, _, _ = _batch(groups, pad, att.device)
    lanes = torch.nn.functional.pad(lanes, (0, t - lanes.shape[2]), value=pad).reshape(b, n * t)
    shared = torch.zeros(b, x, dtype=torch.bool, device=att.device)
    for i, group in enumerate(groups):
        tokens = sorted(shared_node_tokens(vocab, group.outputs))
        if tokens:
            shared[i, x - n * t:] = torch.isin(lanes[i], torch.tensor(tokens, device=att.device))
    mass = (att * shared[:, None, None, :]).sum(-1)
    return -mass[due].clamp_min(1e-6).log().mean()
