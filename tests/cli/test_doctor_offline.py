"""``lmembed doctor`` without the network (a Hub id resolves to its preset, the weights are said to be absent) and
its final-token check on a folder whose byte-level tokenizer drops the EOS its preset's reference ends with."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lmembed.cli.app import app
from lmembed.evaluation.doctor import check_final_token, weights_here

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
from test_presets import embedder, hub_snapshot
from test_token_level import as_published, save_decoder


@pytest.fixture
def empty_hub_cache(tmp_path, monkeypatch):
    """A Hugging Face cache with nothing in it (looked up on disk only)."""
    constants = pytest.importorskip("huggingface_hub.constants")
    cache = tmp_path / "hf-cache"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    return cache


@pytest.mark.parametrize(
    ("hub_id", "family", "final"),
    [
        ("Salesforce/SFR-Embedding-Mistral", "SFR-Embedding-Mistral", "every text ends with the tokenizer's EOS"),
        ("Qwen/Qwen3-Embedding-0.6B", "Qwen3-Embedding", "every text ends with '<|endoftext|>'"),
        ("McGill-NLP/LLM2Vec-Meta-Llama-3-8B-Instruct-mntp-supervised", "LLM2Vec", None),
    ],
)
def test_doctor_of_a_hub_id_offline_prints_its_conventions(empty_hub_cache, hub_id, family, final):
    result = CliRunner().invoke(app, ["doctor", hub_id], terminal_width=200)
    assert result.exit_code == 2, result.output
    assert "internal error" not in result.output and "couldn't connect" not in result.output
    assert f"preset {family} (hub id)" in result.output
    assert f"published family: {family}" in result.output
    assert "the weights are not on this machine" in result.output
    assert (final in result.output) if final else ("every text ends with" not in result.output)


def test_weights_here_reads_the_cache_on_disk(empty_hub_cache):
    assert not weights_here("Salesforce/SFR-Embedding-Mistral")
    snapshot = empty_hub_cache / "models--Salesforce--SFR-Embedding-Mistral"
    (snapshot / "snapshots" / "abc").mkdir(parents=True)
    (snapshot / "snapshots" / "abc" / "config.json").write_text("{}")
    (snapshot / "refs").mkdir()
    (snapshot / "refs" / "main").write_text("abc")
    assert weights_here("Salesforce/SFR-Embedding-Mistral")


def test_doctor_shows_the_last_token_ids_of_a_tokenizer_that_drops_the_eos(tmp_path):
    folder, _ = as_published(tmp_path, "Salesforce/SFR-Embedding-Mistral")
    result = CliRunner().invoke(app, ["doctor", str(folder)], terminal_width=250)
    assert result.exit_code == 0, result.output
    line = next(row for row in result.output.splitlines() if "final-token" in row)
    assert line.startswith("pass  final-token: the reference ends every text with '</s>' (id 2)")
    assert "appended by lmembed" in line and "ends with ids [" in line


def test_final_token_check_fails_where_the_required_token_is_missing(tmp_path):
    folder, _ = as_published(tmp_path, "Salesforce/SFR-Embedding-Mistral")
    check = check_final_token(embedder(folder, add_eos=False), ["A man is eating food.", "hello"])
    assert check.passed is False and "MISSING" in check.detail


def test_final_token_put_there_by_the_tokenizer_is_not_doubled(tmp_path):
    folder = save_decoder(hub_snapshot(tmp_path, "BAAI/bge-en-icl"), "mistral", "<s> $A </s>")
    check = check_final_token(embedder(folder), ["A man is eating food.", "hello"])
    assert check.passed is True and "put there by the tokenizer" in check.detail
    assert "appended by lmembed" not in check.detail


def test_doctor_of_an_encoder_hub_id_offline_prints_mtebs_prompts(empty_hub_cache):
    pytest.importorskip("mteb")
    result = CliRunner().invoke(app, ["doctor", "intfloat/e5-base-v2"], terminal_width=200)
    assert result.exit_code == 2, result.output
    assert "'query': 'query: '" in result.output and "the weights are not on this machine" in result.output
