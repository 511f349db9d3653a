"""A tiny random-weight Llama (2 layers, 4 query / 2 KV heads of 64) with SmolLM2's tokenizer.

For the tests and for benchmarks where the model's size does not matter
(scheduler overhead): vLLM loads it from a folder, it starts in seconds and a
decode step costs little, so what is measured is the engine around it.

``vocab_size`` cuts the vocabulary to SmolLM2's first tokens (its special
tokens, its 256 bytes and its most frequent merges): every text still
tokenizes, and whatever scans the vocabulary per sampled row costs that much
less. The tests that run Model Runner V2 under Triton's interpreter use it
(``tests/conftest.py``), where V2's samplers scan the vocabulary in
interpreted kernels (0.43 s a row at 49,152 tokens, 10 ms at 1,024).

    python -m vllm_hogwild.models.tiny      # prints the folder, building it if needed
"""

from __future__ import annotations

import shutil
from pathlib import Path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


SMOLLM2_VOCAB = 49152


def build_tiny_llama(folder: Path | None = None, seed: int = 0, num_layers: int = 2,
                     vocab_size: int = SMOLLM2_VOCAB) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from vllm_hogwild.models.default import cache_dir, prepare

    cut = "" if vocab_size == SMOLLM2_VOCAB else f"-v{vocab_size}"
    folder = Path(folder) if folder is not None else cache_dir() / f"tiny-llama-{num_layers}-{seed}{cut}"
    if (folder / "config.json").exists():
        return folder
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=128, intermediate_size=256, num_hidden_layers=num_layers,
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
    if vocab_size != SMOLLM2_VOCAB:
        cut_tokenizer(folder / "tokenizer.json", vocab_size)
    return folder


def cut_tokenizer(path: Path, vocab_size: int) -> None:
    """Keep a byte-level BPE tokenizer's first ``vocab_size`` tokens, and the merges that make only those."""
    import json

    tokenizer = json.loads(path.read_text())
    model = tokenizer["model"]
    vocab = {token: i for token, i in model["vocab"].items() if i < vocab_size}
    if len(vocab) != vocab_size:
        raise ValueError(f"vocab_size {vocab_size}: the tokenizer's first ids are not contiguous")
    merges = [m for m in model["merges"]
              if all(part in vocab for part in (m.split(" ") if isinstance(m, str) else m))
              and "".join(m.split(" ") if isinstance(m, str) else m) in vocab]
    model["vocab"], model["merges"] = vocab, merges
    tokenizer["added_tokens"] = [t for t in tokenizer["added_tokens"] if t["id"] < vocab_size]
    path.write_text(json.dumps(tokenizer, ensure_ascii=False))


if __name__ == "__main__":
    print(build_tiny_llama())
