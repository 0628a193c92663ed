"""The task registry: one TaskSpec per task, every other table derived from it, and adding a dataset
is one entry."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from lmembed import datasets, task_registry
from lmembed.evaluation.instructions import NV_EMBED_INSTRUCTIONS, STS_INSTRUCTION, instruction_for
from lmembed.evaluation.results import read_result
from lmembed.evaluation.suites import locate, resolve_task, run_suite
from lmembed.evaluation.tasks import STSTask, build_task
from lmembed.task_registry import TaskSpec

STS_ROWS = [
    {"sentence1": "a cat sits on the mat", "sentence2": "a cat is on the mat", "score": 4.8},
    {"sentence1": "dogs run fast", "sentence2": "fast dogs run", "score": 4.5},
    {"sentence1": "the sky is blue", "sentence2": "I like green tea", "score": 0.2},
]

TOY = TaskSpec(
    "ToySTS",
    "STS",
    "sts/toy_sts",
    aliases=("toy-sts",),
    settings={"max_score": 4.0},
    instruction="Retrieve toy sentences that mean the same.",
)


class WordEncoder:
    """Bag of letters; records the instructions it was given."""

    def __init__(self) -> None:
        self.instructions: list[str | None] = []

    def encode(self, texts, *, batch_size=32):
        return np.stack([np.bincount([ord(c) % 16 for c in t], minlength=16).astype(np.float32) + 0.1 for t in texts])

    def encode_queries(self, texts, *, instruction=None, batch_size=32):
        self.instructions.append(instruction)
        return self.encode(texts)

    def encode_corpus(self, texts, *, batch_size=32):
        return self.encode(texts)


@pytest.fixture
def toy_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A data root holding the toy dataset, and the toy dataset registered: one entry."""
    folder = tmp_path / "sts" / "toy_sts"
    folder.mkdir(parents=True)
    (folder / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in STS_ROWS))
    monkeypatch.setenv("LMEMBED_DATA", str(tmp_path))
    task_registry.register(TOY)
    try:
        yield tmp_path
    finally:
        del task_registry.TASKS[TOY.name]


def test_adding_a_dataset_is_one_entry(toy_root: Path):
    # the suites locate it and score it, with its instruction
    located = locate("ToySTS", toy_root)
    assert located.available and located.task_type == "STS" and located.path == toy_root / "sts" / "toy_sts"
    encoder = WordEncoder()
    report = run_suite(["ToySTS"], encoder, data_root=toy_root, instructions="nv-embed")
    assert [r.task_name for r in report.results] == ["ToySTS"] and not report.failed
    assert encoder.instructions and set(encoder.instructions) == {TOY.instruction}
    # loading by name (`lmembed eval --data NAME`): MTEB name, short name and alias all find it
    for name in ("ToySTS", "toy_sts", "toy-sts", "toysts"):
        task = resolve_task(name)
        assert isinstance(task, STSTask) and task.name == "ToySTS" and task.max_score == 4.0, name
    task = build_task(task_registry.get("toy-sts"), located.path, instruction="x")
    assert task.instruction == "x" and task.evaluate(WordEncoder()).task_type == "STS"
    # the results reader knows its type; the instruction tables know its definition
    result_file = toy_root / "ToySTS.json"
    result_file.write_text(json.dumps({"task_name": "ToySTS", "scores": {"test": [{"main_score": 0.5}]}}))
    assert read_result(result_file).task_type == "STS"
    assert instruction_for("ToySTS") == TOY.instruction == NV_EMBED_INSTRUCTIONS["ToySTS"]
    # and lmembed.datasets resolves its short name and alias
    assert datasets.KNOWN_DATASETS["toy_sts"] == "sts/toy_sts" and datasets.canonical_name("TOY-STS") == "toy_sts"
    assert datasets.resolve_dataset("toy-sts", download=False) == (toy_root / "sts" / "toy_sts").resolve()


def test_the_entry_is_gone_after_removal():
    assert task_registry.find("ToySTS") is None and instruction_for("ToySTS") is None
    assert "toy_sts" not in datasets.KNOWN_DATASETS


def test_derived_tables_match_the_registry():
    with_data = [spec for spec in task_registry.TASKS.values() if spec.path]
    assert {spec.short_name: spec.path for spec in with_data} == dict(datasets.KNOWN_DATASETS)
    assert datasets.ALIASES["sick-r"] == "sickr" and datasets.ALIASES["stsb"] == "stsbenchmark"
    assert all(instruction_for(spec.name) == spec.instruction for spec in task_registry.TASKS.values())
    sts = [spec for spec in task_registry.TASKS.values() if spec.task_type == "STS"]
    assert sts and all(spec.instruction == STS_INSTRUCTION for spec in sts)
    assert task_registry.task_type_of("SciFact") == "Retrieval" and task_registry.task_type_of("nope") is None
    classification = [spec for spec in with_data if spec.task_type == "Classification"]
    assert all(spec.extra_splits == ("train",) for spec in classification)


def test_registry_rejects_duplicates_and_unknown_names():
    with pytest.raises(ValueError, match="already registered"):
        task_registry.register(task_registry.TASKS["SciFact"])
    with pytest.raises(task_registry.UnknownTaskError):
        task_registry.get("no-such-task")


def test_training_uses_the_same_sts_instruction():
    from lmembed.training import converters

    assert converters.STS_INSTRUCTION is STS_INSTRUCTION
