"""A tiny random-weight Llama that vLLM loads from a folder, with SmolLM2's tokenizer."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def build_tiny_llama(folder: Path, seed: int = 0, num_layers: int = 2) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    from vllm_hogwild.tools.default_model import prepare

    if (folder / "config.json").exists():
        return folder
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=49152, hidden_size=128, intermediate_size=256, num_hidden_layers=num_layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=4096,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, tie_word_embeddings=True,
        initializer_range=0.08, bos_token_id=1, eos_token_id=2, pad_token_id=2, dtype="float32",
    )
    model = LlamaForCausalLM(config).to(torch.float32)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    source = prepare(verbose=False)
    for name in TOKENIZER_FILES:
        if (source / name).exists():
            shutil.copy(source / name, folder / name)
    return folder


def build_tiny_gpt2(folder: Path) -> Path:
    """A tiny random GPT-2 (learned absolute positions, no RoPE) with SmolLM2's tokenizer."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from vllm_hogwild.tools.default_model import prepare

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
