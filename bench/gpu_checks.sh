#!/usr/bin/env bash
# On a GPU machine (the device tool), with .gpu/ from bench/gpu_prepare.sh carried: the GPU tests (pytest -m gpu)
# and bench/gpu_throughput.py (issue 40's table); what comes back is under $OUT. Sized for ONE call of at most
# 10 minutes: setup ~40 s, tests <= 120 s, throughput <= 400 s (it stops itself at 330 s and writes what it has).
# Ray is not on the GPU image, so its GPU test skips. Run: bash bench/gpu_checks.sh  (timeout_s 600)
source bench/gpu_env.sh
mkdir -p ../shared && cp -r .gpu/shared/datasets ../shared/
start=$(date +%s)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee $OUT/device.txt
python3 -c "import torch,transformers,sentence_transformers as s;print('torch',torch.__version__,'transformers',transformers.__version__,'st',s.__version__)" | tee -a $OUT/device.txt
python3 bench/gpu_random_smollm2.py 2>&1 | tail -1
timeout 120 python3 -m pytest -m gpu -q -p no:cacheprovider -rs tests/training/test_cuda.py tests/encoding/test_backends.py \
  tests/encoding/test_packed.py tests/encoding/test_pipeline.py tests/encoding/test_cuda_graphs.py \
  tests/models/test_family_matrix.py tests/scale/test_scale.py 2>&1 | tee $OUT/gpu-tests.log | tail -8
echo "setup and tests: $(( $(date +%s) - start )) s" | tee -a $OUT/device.txt
# the default engine and the cuda-graphs backend against sentence-transformers (serial, windows and packing were
# measured on the H200 of stop 48: ARMS=pipelined,serial,window,graphs,packed brings them back)
timeout 400 python3 bench/gpu_throughput.py --budget-s "${BUDGET_S:-330}" --arms "${ARMS:-pipelined,graphs}" 2>&1 | grep -v "Loading weights" \
  | tee $OUT/gpu-throughput.log | tail -40
cp bench/results/gpu-throughput/result.json bench/results/gpu-throughput/table.md $OUT/
echo "total: $(( $(date +%s) - start )) s" | tee -a $OUT/device.txt
