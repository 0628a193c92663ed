"""Run by bench/gpu_checks.sh on the GPU machine: SmolLM2-135M's architecture and tokenizer with random weights
(seed 0), saved where lmembed looks for the converted bundled model. The real weights (540 MB) cannot travel there;
throughput does not depend on them."""

import os
import shutil
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

src = Path(".gpu/smollm2")
out = Path(os.environ["LMEMBED_HOME"]) / "models" / "smollm2-135m"
torch.manual_seed(0)
model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(src))
model.save_pretrained(out)
for f in src.iterdir():
    if f.name != "config.json":
        shutil.copy(f, out / f.name)
print("smollm2-135m with random weights at", out, sum(p.numel() for p in model.parameters()), "parameters")
