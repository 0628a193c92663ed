#!/usr/bin/env bash
# The training proofs (issues: contrastive trainer, seed recipes), one after another: never run them in
# parallel on a 2-core machine. Each step's output goes to bench/results/<step>/log.txt and its JSON
# next to it. Steps: train-smollm2 train-minilm-triplet gradcache-memory anchor-ablation recipes-table
#   bash bench/run_training_proofs.sh                    # all (about 1.5-2 hours on 2 CPU cores)
#   bash bench/run_training_proofs.sh anchor-ablation    # only the named steps
set -uo pipefail
cd "$(dirname "$0")/.."
R=bench/results
export TOKENIZERS_PARALLELISM=false

log_to() {  # keep progress lines, drop library warnings
  mkdir -p "$R/$1"
  grep --line-buffered -v -E "FutureWarning|warnings.warn|Loading weights" | tee "$R/$1/log.txt"
}

step() {
  case "$1" in
    train-smollm2)
      python bench/train_smollm2.py --threads 2 2>&1 | log_to "$1"
      cp runs/bench-smollm2/bench_results.json "$R/$1/" ;;
    train-minilm-triplet)
      python bench/train_minilm_triplet.py --mine-negatives --full-eval --threads 2 2>&1 | log_to "$1"
      cp runs/bench-minilm-triplet/bench_results.json "$R/$1/" ;;
    gradcache-memory)
      python bench/gradcache_memory.py --threads 2 --json "$R/$1/cpu-minilm.json" 2>&1 | log_to "$1" ;;
    anchor-ablation)
      python bench/anchor_ablation.py --threads 2 2>&1 | log_to "$1" ;;
    recipes-table)
      python bench/recipes_table.py --threads 2 --json "$R/$1/recipes_table.json" 2>&1 | log_to "$1" ;;
    *) echo "unknown step $1" >&2; return 2 ;;
  esac
}

for name in "${@:-train-smollm2 train-minilm-triplet gradcache-memory anchor-ablation recipes-table}"; do
  for one in $name; do
    echo "=== $one ($(date -u +%H:%M:%S))"
    step "$one"
  done
done
