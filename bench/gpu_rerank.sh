#!/usr/bin/env bash
# On a GPU machine (the device tool), with .gpu/ from bench/gpu_prepare.sh carried (plus .gpu/beir.tar.xz: SciFact,
# NFCorpus and ArguAna from ../shared/datasets/beir, made by `tar -C ../shared/datasets -cJf .gpu/beir.tar.xz
# beir/scifact beir/nfcorpus beir/arguana`): trains recipes/reranker-gpu.yaml, then runs bench/rerank.py on the
# three full sets with the trained cross-encoder on the GPU; results and the model (float16, in 15 MB parts) under $OUT.
source bench/gpu_env.sh
mkdir -p ../shared/datasets && tar -C ../shared/datasets -xJf .gpu/beir.tar.xz
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; date -u; } | tee "$OUT/train.log"
start=$(date +%s)
timeout "${TRAIN_S:-170}" python3 -m lmembed.cli train --recipe recipes/reranker-gpu.yaml 2>&1 | grep -v "Loading weights" | tee -a "$OUT/train.log" | tail -12
echo "train: $(( $(date +%s) - start )) s" | tee -a "$OUT/train.log"
run=runs/recipes/reranker-gpu
cp $run/cross-encoder/metrics.jsonl "$OUT/" 2>/dev/null
test -f $run/cross-encoder/model/model.safetensors || exit 1
start=$(date +%s)
timeout "${EVAL_S:-150}" python3 bench/rerank.py --reranker $run/cross-encoder/model --label ce-gpu --rerank-top-k 50 --device cuda 2>&1 | grep -v "Loading weights" | tee "$OUT/rerank.log" | tail -20
echo "rerank: $(( $(date +%s) - start )) s" | tee -a "$OUT/rerank.log"
python3 - "$run/cross-encoder/model" "$OUT" <<'PY'
import sys, torch
from pathlib import Path
from safetensors.torch import load_file, save_file
model, out = Path(sys.argv[1]), Path(sys.argv[2])
half = {k: (v.half() if v.is_floating_point() else v).contiguous() for k, v in load_file(model / "model.safetensors").items()}
save_file(half, "/tmp/model-fp16.safetensors", {"format": "pt"})
data = Path("/tmp/model-fp16.safetensors").read_bytes()
for i in range(0, len(data), 15 << 20):
    (out / f"model-fp16.part{i // (15 << 20)}").write_bytes(data[i : i + (15 << 20)])
PY
tar czf "$OUT/results.tgz" --exclude model.safetensors bench/results/rerank $run/recipe_result.json $run/cross-encoder/train_config.yaml $run/cross-encoder/model
ls -la "$OUT"
