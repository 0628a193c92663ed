"""The ordered source readers of ``Embedder.from_pretrained`` (lmembed.load_plan): the first that recognises a source
decides how it loads and which strategy fields its own files (or preset) set, and who set each."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import bundled_or_skip, tiny_model
from lmembed import Embedder
from lmembed.load_plan import READERS, plan_load, read_transformers
from lmembed.load_spec import STRATEGY_FILE


def test_readers_are_tried_in_the_documented_order():
    assert [r.__name__ for r in READERS] == [
        "read_saved",
        "read_preset",
        "read_hub_saved",
        "read_sentence_transformers",
        "read_transformers",
    ]
    assert READERS[-1] is read_transformers  # the last reader answers every name


def test_a_saved_folder_is_read_by_its_lmembed_json(make_embedder, tmp_path):
    folder = tmp_path / "saved"
    make_embedder("llama", pooling="last", layer=-2).save(folder)
    plan = plan_load(str(folder))
    assert plan.reader == "saved" and plan.exact_tokenizer
    assert plan.options["pooling"] == "last" and plan.options["layer"] == -2
    assert plan.sources["pooling"] == str(folder / STRATEGY_FILE)
    loaded = Embedder.from_pretrained(str(folder), cache=False, show_progress=False)
    assert loaded.config.pooling == "last" and loaded.source == str(folder.resolve())


def test_a_run_folder_is_read_as_the_model_inside_it(make_embedder, tmp_path):
    make_embedder("llama").save(tmp_path / "run" / "model")
    plan = plan_load(str(tmp_path / "run"))
    assert plan.reader == "saved" and Path(plan.where) == tmp_path / "run" / "model"


def test_a_plain_transformers_folder_has_no_conventions_of_its_own(tokenizer, tmp_path):
    folder = tmp_path / "plain"
    tiny_model("bert", len(tokenizer)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    plan = plan_load(str(folder))
    assert plan.reader == "transformers" and plan.options == {} and plan.sources == {}
    loaded = Embedder.from_pretrained(str(folder), cache=False, show_progress=False)
    assert loaded.config.pooling == "mean" and loaded.published is None and loaded.published_folder is None


def test_a_preset_hub_id_is_planned_without_the_network():
    plan = plan_load("intfloat/e5-mistral-7b-instruct")
    assert plan.reader == "preset" and plan.published is not None
    assert plan.options["pooling"] == "last"
    assert all(source.startswith("preset ") for source in plan.sources.values())


@pytest.mark.bundled
def test_the_bundled_minilm_is_read_from_its_sentence_transformers_folder():
    plan = plan_load(bundled_or_skip("minilm"))
    assert plan.reader == "sentence-transformers" and plan.name == "minilm"
    assert plan.options["pooling"] == "mean" and plan.options["normalize"] is True
    assert "pooling" in plan.sources
