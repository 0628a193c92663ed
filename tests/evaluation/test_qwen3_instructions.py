"""Qwen3-Embedding is evaluated with its authors' own per-task instructions (QwenLM/Qwen3-Embedding's evaluation
code), not with mteb's task metadata."""

from __future__ import annotations

import pytest

from lmembed.evaluation.instructions import (
    QWEN3_RETRIEVAL_FALLBACK,
    Qwen3TaskInstructions,
    instruction_for,
    published_instructions,
)
from lmembed.models import presets

SIMILAR = "Retrieve semantically similar text"


def test_qwen3_embedding_uses_its_own_table():
    table = published_instructions(presets.resolve("Qwen/Qwen3-Embedding-8B"))
    assert isinstance(table, Qwen3TaskInstructions)
    # STS and pair classification: one instruction whatever the task (its get_instruction's rule)
    for task in ("STSBenchmark", "SICK-R", "BIOSSES", "TwitterURLCorpus", "SprintDuplicateQuestions", "RTE3"):
        assert table[task] == SIMILAR
    # its task_prompts.json's own wording where it differs from E5's table
    assert table["NQ"] == "Given a question, retrieve Wikipedia passages that answer the question"
    assert table["NFCorpus"] != instruction_for("NFCorpus", "nv-embed")
    # and E5's definitions elsewhere
    assert table["SciFact"] == instruction_for("SciFact", "nv-embed")
    assert table["Banking77Classification"] == instruction_for("Banking77Classification", "nv-embed")
    assert "my-own-folder" not in table
    assert len(table) >= 60


def test_qwen3_differs_from_mtebs_metadata_where_its_code_does():
    mteb = pytest.importorskip("mteb")
    table = published_instructions(presets.resolve("Qwen/Qwen3-Embedding-0.6B"))
    mteb_table = published_instructions(presets.resolve("intfloat/e5-mistral-7b-instruct"))
    assert mteb_table["STSBenchmark"] != table["STSBenchmark"] == SIMILAR
    assert mteb_table["TwitterURLCorpus"] != table["TwitterURLCorpus"]
    # a task outside lmembed's registry: by its mteb type (STS) or mteb's prompt
    known = set(table)  # the registry's tasks
    sts = next(t.metadata.name for t in mteb.get_tasks(task_types=["STS"]) if t.metadata.name not in known)
    assert table[sts] == SIMILAR
    assert QWEN3_RETRIEVAL_FALLBACK.startswith("Retrieval relevant passage")


def test_mteb_adapter_gives_a_published_model_its_own_table():
    mteb = pytest.importorskip("mteb")
    from lmembed.evaluation.mteb_adapter import MTEBEncoder

    class Published:
        published = presets.resolve("Qwen/Qwen3-Embedding-0.6B")

    adapter = MTEBEncoder(Published())  # type: ignore[arg-type]
    sts = mteb.get_task("STSBenchmark").metadata
    assert adapter.task_instruction(sts, None) == SIMILAR
    assert MTEBEncoder(Published(), instructions="nv-embed").task_instruction(sts, None) != SIMILAR
