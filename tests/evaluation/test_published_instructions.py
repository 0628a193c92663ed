"""A published model is evaluated with the per-task instructions mteb's registry gives it (leaderboard parity)."""

from __future__ import annotations

import pytest

from lmembed.evaluation.instructions import instruction_for, llm2vec_instruction, published_instructions
from lmembed.models import presets


def test_llm2vec_instruction_ends_in_a_colon():
    assert llm2vec_instruction("Retrieve semantically similar text.") == "Retrieve semantically similar text:"
    assert llm2vec_instruction("Given a claim:") == "Given a claim:"
    assert llm2vec_instruction("") == ""


def test_published_models_use_mteb_task_prompts():
    mteb = pytest.importorskip("mteb")
    e5 = published_instructions(presets.resolve("intfloat/e5-mistral-7b-instruct"))
    assert e5["SciFact"] == mteb.get_task("SciFact").metadata.prompt["query"]
    assert e5["NFCorpus"] != instruction_for("NFCorpus", "nv-embed")  # mteb's wording, not NV-Embed's table
    from mteb.abstasks.abstask import get_abstask_prompt

    assert e5["STSBenchmark"] == get_abstask_prompt("STSBenchmark")  # no task prompt: its task type's
    llm2vec = published_instructions(presets.resolve("McGill-NLP/LLM2Vec-Mistral-7B-Instruct-v2-mntp-supervised"))
    assert llm2vec["STSBenchmark"] == llm2vec_instruction(get_abstask_prompt("STSBenchmark"))
    assert "my-own-folder" not in e5
    assert published_instructions(None) is None
