"""Issue 38's fixes in ``synthesize``: bad passages files are refused naming file and line, and the corpus-only
recipe rejects a query that copies its passage's opening."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import write_jsonl
from lmembed.errors import ConfigError
from lmembed.io import DataFormatError
from lmembed.synthesis.corpus_only import _opens
from lmembed.synthesis.synthesize import read_passages, synthesize


def test_an_empty_passages_file_says_it_is_empty(tmp_path):
    path = write_jsonl(tmp_path / "corpus.jsonl", [])
    with pytest.raises(ConfigError, match=r"corpus.jsonl: the passages file is empty"):
        read_passages(path)
    text = tmp_path / "p.txt"
    text.write_text("\n\n")
    with pytest.raises(ConfigError, match="is empty"):
        read_passages(text)


def test_a_passage_without_title_or_text_names_its_line(tmp_path):
    path = write_jsonl(tmp_path / "corpus.jsonl", [{"_id": "a", "text": "x"}, {"_id": "b", "title": "", "text": ""}])
    with pytest.raises(DataFormatError, match=r"corpus.jsonl:2: the passage has neither title nor text"):
        read_passages(path)
    path = write_jsonl(tmp_path / "c2.jsonl", [{"_id": "a", "text": ["not", "a", "string"]}])
    with pytest.raises(DataFormatError, match=r"c2.jsonl:1: .*text"):
        read_passages(path)


def test_opening_copies_are_recognised():
    assert _opens("The cat, sat", "the cat sat on the mat")
    assert not _opens("cat sat", "the cat sat on the mat")


def test_corpus_only_rejects_a_query_that_copies_the_opening(tmp_path):
    from lmembed.synthesis.generators import TinyGenerator

    class Copier(TinyGenerator):
        def generate(self, requests):
            return ["the cat sat on the mat" for _ in requests]

    passages = ["the cat sat on the mat with a dog", "the cat sat on the mat in the sun", "a gene study"]
    stats = synthesize(
        "corpus-only-plain",
        Copier(name="copier"),
        tmp_path / "out.jsonl",
        corpus=(["a", "b", "c"], passages),
        encode=lambda texts, side: np.ones((len(texts), 4), dtype=np.float32),
    )
    assert stats["rejected"].get("copy", 0) >= 2


def test_the_tiny_generators_seed_is_part_of_the_plan(tmp_path):
    from lmembed.synthesis.generators import TinyGenerator
    from lmembed.synthesis.runner import PlanMismatch

    out = tmp_path / "rows.jsonl"
    synthesize("e5-mistral", TinyGenerator(), out, limit=2)
    synthesize("e5-mistral", TinyGenerator(seed=0), out, limit=2)  # the same run: resumes
    with pytest.raises(PlanMismatch, match="generator"):
        synthesize("e5-mistral", TinyGenerator(seed=1), out, limit=2)


def test_gecko_says_when_equal_scores_leave_the_retrievers_order(tmp_path):
    import json

    from lmembed.synthesis.generators import ScoringUnsupported, TinyGenerator

    class Flat(TinyGenerator):  # an endpoint without log-probabilities that answers every relevance question alike
        def loglikelihood(self, contexts, continuations):
            raise ScoringUnsupported("no log-probabilities")

        def yes_probability(self, prompts):
            return [0.5 for _ in prompts]

    passages = ["the cat sat on the mat", "a gene study of the cell", "the movie was great", "a man riding a horse"]
    out = tmp_path / "gecko.jsonl"
    stats = synthesize(
        "gecko-plain",
        Flat(),
        out,
        corpus=(["a", "b", "c", "d"], passages),
        encode=lambda texts, side: np.random.default_rng(len(texts)).normal(size=(len(texts), 8)).astype(np.float32),
    )
    assert any("retriever-order" in note for note in stats["notes"]), stats
    again = synthesize(  # a rerun of the finished run generates nothing: the notes come from the shards' records
        "gecko-plain",
        Flat(),
        out,
        corpus=(["a", "b", "c", "d"], passages),
        encode=lambda texts, side: np.random.default_rng(len(texts)).normal(size=(len(texts), 8)).astype(np.float32),
    )
    assert again["shards_generated_now"] == 0 and again["notes"] == stats["notes"]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows and all(r["provenance"]["ranking"] == "retriever-order" for r in rows)
