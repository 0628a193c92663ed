# Sourced by bench/gpu_checks.sh and bench/gpu_rerank.sh on the GPU machine: refuses a machine that holds the real
# data (those scripts write the GPU machine's copy into ../shared/datasets), sets $OUT and the environment, and
# installs the carried wheels the GPU image lacks.
if [ -e ../shared/datasets ]; then  # never on a machine that holds the real data: this would overwrite it
  echo "../shared/datasets exists: this script is for the bare GPU machine only; nothing done" >&2; exit 1
fi
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src:$PWD/.gpu/site:$PWD/bench LMEMBED_HOME=/tmp/lmh HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/whl/*.whl && export PYTHONPATH=$PYTHONPATH:/tmp/site || exit
