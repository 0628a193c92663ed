"""``lmembed doctor``: the resolved strategy with its sources, and checks that pass on a sound model and fail on
a broken one (exit status 1)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import build_tokenizer, tiny_model
from helpers import reseal
from lmembed import Embedder, EmbeddingConfig
from lmembed.cli.app import app
from lmembed.evaluation.doctor import provenance, run_checks


def e5_snapshot(tmp_path: Path) -> Path:
    """A tiny Mistral saved where huggingface_hub keeps intfloat/e5-mistral-7b-instruct."""
    folder = tmp_path / "models--intfloat--e5-mistral-7b-instruct" / "snapshots" / "0123abc"
    tok = build_tokenizer(bos=True)
    tiny_model("mistral", len(tok)).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def test_doctor_prints_sources_and_passes_on_a_published_model(tmp_path):
    result = CliRunner().invoke(app, ["doctor", str(e5_snapshot(tmp_path))], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "preset e5-mistral-7b-instruct (Hugging Face cache path)" in result.output
    assert "published family: e5-mistral-7b-instruct" in result.output
    for name in ("attention", "padding", "truncation"):
        assert f"pass  {name}:" in result.output
    assert "skip  prompt-pooling" in result.output  # last-token pooling reads one token
    assert "papers: wang2024e5mistral, ma2023repllama" in result.output  # the family's, its last-token pooling


def test_a_published_model_saved_again_cites_its_family_paper_first(tmp_path):
    import re

    from lmembed.training.trainable import TrainableEmbedder

    emb = Embedder.from_pretrained(str(e5_snapshot(tmp_path)), cache=False, show_progress=False)
    card = (emb.save(tmp_path / "copy") / "README.md").read_text()
    assert re.findall(r"^@\w+\{([^,\n]+),$", card, flags=re.M) == ["wang2024e5mistral", "ma2023repllama"]
    trained = (TrainableEmbedder(emb).save(tmp_path / "trained") / "README.md").read_text()  # a trained copy too
    assert re.findall(r"^@\w+\{([^,\n]+),$", trained, flags=re.M)[0] == "wang2024e5mistral"


def test_provenance_names_option_preset_and_default(tmp_path):
    emb = Embedder.from_pretrained(str(e5_snapshot(tmp_path)), cache=False, pooling="mean", show_progress=False)
    sources = {f.name: f.source for f in provenance(emb, {"pooling": "mean"})}
    assert sources["pooling"] == "option"
    assert sources["add_eos"].startswith("preset e5-mistral-7b-instruct")
    assert sources["layer"] == "lmembed default"
    checks = {c.name: c for c in run_checks(emb)}
    assert checks["prompt-pooling"].passed is True  # mean pooling: the instruction's tokens stay out


def test_doctor_fails_when_sentence_transformers_disagrees(tmp_path):
    pytest.importorskip("sentence_transformers")
    tok = build_tokenizer()
    emb = Embedder.from_model(tiny_model("bert", len(tok)), tok, EmbeddingConfig(pooling="mean"), use_cache=False)
    folder = emb.save(tmp_path / "saved")
    window = folder / "sentence_bert_config.json"  # sentence-transformers now reads 8 tokens, lmembed the model's
    config = json.loads(window.read_text())
    config.update(max_seq_length=8)
    window.write_text(json.dumps(config))
    reseal(folder)  # the record made to match: a folder edited by hand
    result = CliRunner().invoke(app, ["doctor", str(folder)], terminal_width=200)
    assert result.exit_code == 1, result.output
    assert "FAIL  sentence-transformers: lowest cosine to SentenceTransformer: no prompt" in result.output
    assert "pass  padding" in result.output

    pooling = folder / "1_Pooling" / "config.json"  # the ST files say CLS while lmembed.json says mean: the folder
    config = json.loads(pooling.read_text())  # is refused before anything reads it (each library read its own)
    config.update(pooling_mode_mean_tokens=False, pooling_mode_cls_token=True)
    pooling.write_text(json.dumps(config))
    reseal(folder)
    result = CliRunner().invoke(app, ["doctor", str(folder)], terminal_width=200)
    assert result.exit_code == 2, result.output
    assert "the folder's two records of its strategy disagree" in " ".join(result.output.replace("│", " ").split())


def test_doctor_compares_each_prompt_of_a_sentence_transformers_folder(tmp_path):
    st = pytest.importorskip("sentence_transformers")
    modules = pytest.importorskip("sentence_transformers.sentence_transformer.modules")
    tok = build_tokenizer()
    tiny_model("bert", len(tok)).save_pretrained(tmp_path / "bert")
    tok.save_pretrained(tmp_path / "bert")
    stack = [modules.Transformer(str(tmp_path / "bert")), modules.Pooling(32, "mean", include_prompt=False)]
    model = st.SentenceTransformer(modules=stack, prompts={"query": "query : ", "document": ""}, device="cpu")
    model.save(str(tmp_path / "st"))
    result = CliRunner().invoke(app, ["doctor", str(tmp_path / "st")], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "include_prompt       = False  <- " in result.output  # read from 1_Pooling/config.json
    assert "'query': 'query : '" in result.output
    assert "pass  sentence-transformers: lowest cosine to SentenceTransformer: no prompt 1.0" in result.output
    assert "prompt 'query' 1.0" in result.output
    assert "pass  prompt-pooling" in result.output
