"""What the merges and checks collaborators' tests share: the trainer going on from the shipped links
collaborator's folder (vllm_hogwild/training/folders.py), checked to keep the links model's layers and every links
token's row by its text."""

from __future__ import annotations


def trained_from_links(folder, collaborator: str, tokenizer):
    """One training step at learning rate 0 from the shipped links folder into ``folder`` (``collaborator``'s
    vocabulary, ``tokenizer`` its tokenizer); asserts every layer is the links model's and every links token keeps
    its row (found by its text). Returns ``(record, rows)``: the run's ``training.json`` and the new embedding's
    rows."""
    import torch
    from safetensors.torch import load_file

    from vllm_hogwild.models import links_collaborator as LC
    from vllm_hogwild.training.train_links import train

    links = LC.model_dir()
    record = train(folder, steps=1, lr=0.0, threads=1, log_every=1, init=links, collaborator=collaborator)
    old, new = load_file(links / "model.safetensors"), load_file(folder / "model.safetensors")
    assert all(torch.equal(new[k], old[k]) for k in old if "embed" not in k)
    had, now = LC.build_tokenizer().get_vocab(), tokenizer.get_vocab()
    rows_old, rows_new = old["model.embed_tokens.weight"].float(), new["model.embed_tokens.weight"].float()
    for text in (LC._spelled(" 12"), LC._spelled("\n12>45"), LC._spelled(" c=77"), LC._spelled("\nb:")):
        assert torch.allclose(rows_new[now[text]], rows_old[had[text]], atol=2e-3), text
    return record, rows_new
