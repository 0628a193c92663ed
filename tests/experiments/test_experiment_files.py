"""Every experiment file under experiments/ loads (arms, training and strategy options, recipes, comparisons
checked as `lmembed experiment` checks them before running) and is listed in experiments/README.md's table."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import REPO
from lmembed.experiments.spec import load_spec

FOLDER = REPO / "experiments"
FILES = sorted(FOLDER.glob("*.yaml"))


def test_there_are_experiment_files() -> None:
    assert len(FILES) >= 14, [p.name for p in FILES]


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_experiment_file_loads_and_is_listed(path: Path) -> None:
    spec = load_spec(path)
    assert spec.compare, f"{path.name}: no comparison"
    assert spec.scale, f"{path.name}: the scale it is run at is not stated"
    assert f"[{path.name}]({path.name})" in (FOLDER / "README.md").read_text(), f"{path.name} not in the table"


def test_instruction_training_compares_each_backbone_with_and_without() -> None:
    spec = load_spec(FOLDER / "instruction-training.yaml")
    arms = {arm.name: arm for arm in spec.arms}
    for backbone, claim in (("smollm2", 1), ("minilm", 0)):
        with_, without = arms[f"{backbone}-instr"], arms[f"{backbone}-plain"]
        assert with_.model == without.model
        assert all(source.get("instruction") for source in with_.train["data"])
        assert not any(isinstance(s, dict) and s.get("instruction") for s in without.train["data"])
        # the same data and steps apart from the instructions
        strip = [{k: v for k, v in s.items() if k != "instruction"} for s in with_.train["data"]]
        assert strip == without.train["data"]
        assert {k: v for k, v in with_.train.items() if k != "data"} == {
            k: v for k, v in without.train.items() if k != "data"
        }
        match = [c for c in spec.compare if (c.a, c.b) == (with_.name, without.name)]
        assert [c.expected for c in match] == [claim]
    assert spec.evaluation.instructions == "nv-embed"


def test_synthetic_corpus_queries_trains_each_model_on_the_same_rows() -> None:
    """minilm and smollm2-135m are each compared with themselves untrained, on the same round-trip and Gecko
    rows; smollm2 trains LoRA adapters (as the other decoder files), minilm all its weights."""
    spec = load_spec(FOLDER / "synthetic-corpus-queries.yaml")
    arms = {arm.name: arm for arm in spec.arms}
    pairs = {(c.a, c.b): c.expected for c in spec.compare}
    for prefix, model, lora in (("", "minilm", False), ("smollm2-", "smollm2-135m", True)):
        untrained = arms[f"{prefix}untrained"]
        assert untrained.model == model and untrained.train is None
        for kind in ("consistency", "gecko"):
            arm = arms[f"{prefix}{kind}"]
            assert arm.model == model and arm.train["lora"] is lora
            assert arm.strategy == untrained.strategy  # scored as the untrained model is read
            assert arm.train["data"] == arms[kind].train["data"]  # the same rows for both models
            assert pairs[(arm.name, untrained.name)] == 1
        assert pairs[(f"{prefix}gecko", f"{prefix}consistency")] == 0
    options = {name: {k: v for k, v in arm.train.items() if k != "data"} for name, arm in arms.items() if arm.train}
    for prefix in ("", "smollm2-"):  # one model's two arms differ in their rows only
        assert options[f"{prefix}consistency"] == options[f"{prefix}gecko"]
    for key in ("loss", "temperature", "num_negatives", "batch_size"):  # the two models: the same objective
        assert options["consistency"][key] == options["smollm2-consistency"][key], key
