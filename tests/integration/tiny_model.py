"""Tiny random-weight models that vLLM loads from a folder, with SmolLM2's tokenizer (the Llama lives in the
package, for the benchmarks too)."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from vllm_hogwild.models.tiny import TOKENIZER_FILES, build_tiny_llama  # noqa: F401


def build_tiny_gpt2(folder: Path) -> Path:
    """A tiny random GPT-2 (learned absolute positions, no RoPE) with SmolLM2's tokenizer."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from vllm_hogwild.models.default import prepare

    if (folder / "config.json").exists():
        return folder
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=49152, n_embd=64, n_layer=1, n_head=2, n_positions=4096)
    GPT2LMHeadModel(config).save_pretrained(folder)
    source = prepare(verbose=False)
    for name in TOKENIZER_FILES:
        if (source / name).exists():
            shutil.copy(source / name, folder / name)
    return folder


MULTIVERSE_TAGS = ("<Parallel>", "</Parallel>", "<Goal>", "</Goal>", "<Outline>", "</Outline>", "<Path>", "</Path>",
                   "<Conclusion>", "</Conclusion>")


def build_tagged_llama(folder: Path) -> Path:
    """The tiny random Llama with Multiverse's tags added to its tokenizer as special tokens, as Multiverse's own
    tokenizer has them: one token each, left out of the text unless a request keeps special tokens."""
    from transformers import AutoTokenizer, LlamaForCausalLM

    if (folder / "config.json").exists():
        return folder
    from tests.conftest import TEST_VOCAB

    build_tiny_llama(folder, vocab_size=TEST_VOCAB)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.add_special_tokens({"additional_special_tokens": list(MULTIVERSE_TAGS)})
    model = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32)
    torch.manual_seed(1)
    model.resize_token_embeddings(len(tokenizer), mean_resizing=False)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
