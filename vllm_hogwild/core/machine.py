"""The machine a measurement ran on: CPU model, cores and the vector-ISA flags that matter here."""

from __future__ import annotations

import os

ISA_FLAGS = ("avx2", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16")


def machine() -> dict:
    """The CPU's model, core count and the vector-ISA flags that matter here (from /proc/cpuinfo)."""
    model, flags = "unknown", set()
    try:
        for line in open("/proc/cpuinfo"):
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    except OSError:
        pass
    return {"cpu": model, "cores": os.cpu_count(), "isa": [f for f in ISA_FLAGS if f in flags]}

