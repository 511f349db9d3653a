"""A tiny random-weight Llama (2 layers, 4 query / 2 KV heads of 64) with SmolLM2's tokenizer.

For the tests and for benchmarks where the model's size does not matter
(scheduler overhead): vLLM loads it from a folder, it starts in seconds and a
decode step costs little, so what is measured is the engine around it.

    python -m vllm_hogwild.tools.tiny_model      # prints the folder, building it if needed
"""

from __future__ import annotations

import shutil
from pathlib import Path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def build_tiny_llama(folder: Path | None = None, seed: int = 0, num_layers: int = 2) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from vllm_hogwild.tools.default_model import cache_dir, prepare

    folder = Path(folder) if folder is not None else cache_dir() / f"tiny-llama-{num_layers}-{seed}"
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


if __name__ == "__main__":
    print(build_tiny_llama())
