"""An experiment file is checked whole before any run starts: a recipe arm's prepare steps and every stage's options
(with the arm's overrides), and the seeds, each mistake named by the experiment file's line and key."""

from __future__ import annotations

from pathlib import Path

import pytest

from lmembed.experiments.spec import ExperimentSpecError, load_spec

SPEC = """\
name: probe
model: minilm
device: cpu
seeds: [0, 1]
evaluate:
  tasks: [some/beir/folder]
arms:
  base:
    strategy: {}
  trained:
    recipe:
      name: tiny
      model: minilm
      defaults: {batch_size: 4, warmup_steps: 0}
      prepare:
      - name: nli
        kind: pairs
        input: rows.jsonl
        max_rows: 40
      stages:
      - name: s1
        data: ['{prepared:nli}']
        steps: 2
    overrides: {}
"""


def _spec(tmp_path: Path, old: str, new: str) -> Path:
    assert old in SPEC
    path = tmp_path / "exp.yaml"
    path.write_text(SPEC.replace(old, new))
    return path


def test_the_base_file_loads(tmp_path):
    spec = load_spec(_spec(tmp_path, "seeds: [0, 1]", "seeds: [0, 1]"))
    assert [arm.name for arm in spec.arms] == ["base", "trained"]


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        (
            "- name: nli",
            "- name: ../../escape",
            r":16: arms\.trained\.recipe: prepare step 1: name '\.\./\.\./escape' must be letters",
        ),
        ("max_rows: 40", "max_rows: -5", r":19: arms\.trained\.recipe: prepare step 1: max_rows must be >= 1, got -5"),
        ("steps: 2", "steps: -3", r":23: arms\.trained\.recipe: stage 's1': steps=-3 must be >= 1"),
        (
            "steps: 2",
            "steps: 2\n        bogus: 1",
            r":24: arms\.trained\.recipe\.stages\.0\.bogus: stage 's1': unknown",
        ),
        ("warmup_steps: 0}", "warmup_steps: 0, lr: .nan}", r":14: arms\.trained\.recipe: stage 's1': lr=nan must be"),
        ("overrides: {}", "overrides: {lr: .inf}", r":24: arms\.trained\.overrides\.lr: stage 's1': lr=inf must be"),
        ("seeds: [0, 1]", "seeds: [-1]", r":4: seeds\.0: seed -1 must be from 0"),
    ],
)
def test_a_recipe_arm_mistake_is_found_before_any_run(tmp_path, old, new, message):
    path = _spec(tmp_path, old, new)
    with pytest.raises(ExperimentSpecError, match=f"^{path}{message}"):
        load_spec(path)
