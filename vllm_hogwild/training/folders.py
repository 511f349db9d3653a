"""A trained folder in and out of :mod:`.train_links`' factored table: :func:`carry_over` starts a phase from a
folder (its layers and its tokens' rows by their text, the factored vectors recovered from the rows), :func:`export`
writes a phase as a plain Llama folder vLLM loads as it is."""

from __future__ import annotations

import json
from pathlib import Path

from vllm_hogwild.tasks import links as L
from vllm_hogwild.models import links_collaborator as LC


def carry_over(before, folder: Path, model, table, C=LC) -> None:
    """Start from a trained folder: its layers; its token rows, token by token by their text (its
    ``tokenizer.json``: a token it had keeps its row wherever it now is); each link's source and end vectors
    recovered from its sums (a link row ``S[a] + D[b]``: ``S[a]`` the mean over ``b``, ``D[b]`` the mean over ``a``
    less the mean of all); each entity's vector its token on a path had; and each role's the mean, over the tokens
    of that role it had, of their rows less their entity's (a role it had no token for starts at zero). The claim
    and start roles come from a folder whose claims and starts were tokens of a node (``"\\n12:"``, ``" 12,"``),
    which this tokenizer no longer has, or from a lettered folder (a letter's vector its claim's row, a listed
    start's role the mean of its row less its letter's and its node's); letters start fresh otherwise."""
    import torch
    from tokenizers import Tokenizer

    state = {k: v for k, v in before.state_dict().items() if not k.startswith(("model.embed_tokens", "lm_head"))}
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"model.embed_tokens.weight", "lm_head.weight"}, (missing, unexpected)
    old = before.get_input_embeddings().weight.detach()
    had = Tokenizer.from_file(str(Path(folder) / "tokenizer.json")).get_vocab()
    now = C.build_tokenizer().get_vocab()
    shared = [(now[text], i) for text, i in had.items() if text in now and i < old.shape[0]]
    with torch.no_grad():
        new_ids, old_ids = map(torch.tensor, zip(*shared))
        table.table[new_ids] = old[old_ids]
        links = table.table[table.ids].reshape(table.source.shape[0], table.end.shape[0], -1)
        table.source.copy_(links.mean(1))
        table.end.copy_(links.mean(0) - links.mean((0, 1)))
        node = table.roles == 0
        table.entity[table.which[node]] = table.table[table.role_ids[node]]
        table.role.zero_()
        roles = table.roles_named
        carried = torch.zeros(len(table.role_ids), dtype=torch.bool)
        carried[[k for k, i in enumerate(table.role_ids.tolist()) if i in set(new_ids.tolist())]] = True
        for role in roles:  # a role of one token per entity it had: its rows less their entities' (else zero)
            if role in ("node", "claim", "start"):
                continue
            rows = (table.roles == roles.index(role)) & carried
            if rows.any():
                table.role[roles.index(role)] = (table.table[table.role_ids[rows]]
                                                 - table.entity[table.which[rows]]).mean(0)
        spelled = C._spelled
        for role, text in (("claim", "\n{}:"), ("start", " {},")):
            pairs = [(had[spelled(text.format(n))], n - 1) for n in range(1, L.MAX_NODE + 1)
                     if spelled(text.format(n)) in had]
            if pairs:
                rows, which = map(torch.tensor, zip(*pairs))
                table.role[roles.index(role)] = (old[rows] - table.entity[which]).mean(0)
        letters = [had.get(spelled(f"\n{letter}:")) for letter in L.SLOTS]
        if all(i is not None for i in letters):  # a lettered folder: a claim's row is its letter's (claim role 0)
            table.letter.copy_(old[torch.tensor(letters)])
            table.role[roles.index("claim")] = 0
            rows = torch.tensor([had[spelled(f" {letter}={n}")] for letter in L.SLOTS for n in range(1, L.MAX_NODE + 1)])
            table.role[roles.index("start")] = (old[rows] - table.letter[table.listed_letters]
                                                  - table.entity[table.listed_nodes]).mean(0)
        if "check" in roles:  # checks: the check role from a folder that had check claims, else a fresh vector
            had_checks = [had.get(spelled(f"\n{letter}{L.CHECK}")) for letter in L.SLOTS]
            if all(i is not None for i in had_checks):
                table.role[roles.index("check")] = (old[torch.tensor(had_checks)] - table.letter).mean(0)
            else:  # from a links folder: a check claim would start as its letter's claim (the same logit)
                table.role[roles.index("check")] = torch.randn(table.role.shape[1]) * 0.05


def export(model, table, config, out: Path, C=LC) -> None:
    """A plain Llama folder: the layers as trained, the embedding the factored table's rows (float16 on disk)."""
    import torch
    from transformers import LlamaForCausalLM

    plain = LlamaForCausalLM(config)
    state = {k: v for k, v in model.state_dict().items() if not k.startswith(("model.embed_tokens", "lm_head"))}
    missing, unexpected = plain.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"model.embed_tokens.weight", "lm_head.weight"}, (missing, unexpected)
    with torch.no_grad():
        plain.model.embed_tokens.weight.copy_(table())
    plain.tie_weights()
    out.mkdir(parents=True, exist_ok=True)
    plain.eval().half().save_pretrained(out, safe_serialization=True)
    cfg = json.loads((out / "config.json").read_text())
    cfg["dtype"] = "float32"  # what the engine computes in
    cfg.pop("torch_dtype", None)
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    C.save_tokenizer(out)
