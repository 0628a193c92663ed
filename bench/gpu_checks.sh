#!/usr/bin/env bash
# On a GPU machine (the device tool), with .gpu/ from bench/gpu_prepare.sh carried: the GPU tests (pytest -m gpu)
# and bench/gpu_throughput.py; what comes back is under $OUT. Ray is not on the GPU image, so its GPU test skips.
source bench/gpu_env.sh
mkdir -p ../shared && cp -r .gpu/shared/datasets ../shared/
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee $OUT/device.txt
python3 -c "import torch,transformers,sentence_transformers as s;print('torch',torch.__version__,'transformers',transformers.__version__,'st',s.__version__)" | tee -a $OUT/device.txt
python3 bench/gpu_random_smollm2.py 2>&1 | tail -1
timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider -rs tests/training/test_cuda.py tests/encoding/test_backends.py tests/scale/test_scale.py 2>&1 | tee $OUT/gpu-tests.log | tail -6
timeout 240 python3 bench/gpu_throughput.py --n 4000 --repeats 3 2>&1 | grep -v "Loading weights" | tee $OUT/gpu-throughput.log | tail -32
cp bench/results/gpu-throughput/result.json bench/results/gpu-throughput/table.md $OUT/
