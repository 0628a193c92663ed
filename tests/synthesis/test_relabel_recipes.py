"""The Gecko and corpus-only recipes: the tiny generator through both, a real endpoint through Gecko (relabelling
by relevance alone, and saying so), the round-trip filter and the mined negatives."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from lmembed.errors import ConfigError
from lmembed.synthesis.gecko import RELEVANCE_ONLY, rrf
from lmembed.synthesis.generators import EndpointGenerator, ScoringUnsupported, TinyGenerator
from lmembed.synthesis.synthesize import read_passages, synthesize
from lmembed.training.rows import read_jsonl_examples
from test_synthesize import server  # noqa: F401  (the fixture starting a real OpenAI-compatible server)

TOPICS = [
    "protein folding energy in the cell membrane",
    "ocean storm forecast for the coastal city",
    "garden soil and planet climate over the river",
    "vector search engine for query retrieval",
    "market prices of stone and energy",
    "memory theory of the neural model",
    "forest signal from the delta river",
    "light gamma rays in the planet atmosphere",
]
IDS = [f"doc{i}" for i in range(len(TOPICS))]


def encode(texts, side):
    """Hashed bag of words, L2-normalised: deterministic and word-overlap sensitive."""
    out = np.zeros((len(texts), 64), dtype=np.float32)
    for row, text in enumerate(texts):
        for word in text.lower().split():
            out[row, int(hashlib.md5(word.encode()).hexdigest(), 16) % 64] += 1
    return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-9)


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_gecko_relabels_with_both_signals_fused_and_keeps_provenance(tmp_path):
    out = tmp_path / "g.jsonl"
    stats = synthesize("gecko", TinyGenerator(), out, corpus=(IDS, TOPICS), encode=encode, shard_size=3)
    rows = _rows(out)
    assert len(rows) == stats["rows"] == stats["attempted"] == len(TOPICS)
    for row in rows:
        prov = row["provenance"]
        assert prov["relabel"] == "query-likelihood+relevance" and prov["kind"] == "gecko"
        assert prov["positive"]["rank"] == 1 and prov["negative"]["rank"] >= 3
        assert prov["positive"]["fused"] > prov["negative"]["fused"]
        assert row["positive"] != row["negatives"][0] and row["positive"] in TOPICS
        assert prov["positive_is_seed"] == (row["positive"] == TOPICS[IDS.index(prov["seed_passage"])])
    assert read_jsonl_examples(out)[1] == 0
    assert stats["notes"] == []


def test_gecko_never_takes_the_seed_passage_or_a_copy_of_the_positive_as_the_hard_negative(tmp_path):
    """The negative was drawn from fused ranks 3-8 whatever it was: a seed passage outranked there became its own
    query's hard negative, and with duplicate passages the negative was the positive's very text."""
    docs = [*TOPICS, TOPICS[0], TOPICS[1]]  # two duplicates
    ids = [f"doc{i}" for i in range(len(docs))]
    out = tmp_path / "g.jsonl"
    synthesize("gecko", TinyGenerator(), out, corpus=(ids, docs), encode=encode, shard_size=3)
    rows = _rows(out)
    assert rows
    for row in rows:
        seed = docs[ids.index(row["provenance"]["seed_passage"])]
        assert row["negatives"][0] != row["positive"]
        assert row["provenance"]["negative"]["id"] != row["provenance"]["seed_passage"]
        assert row["negatives"][0] != seed or seed == row["positive"]  # the seed's text only as a positive


def test_the_hard_negative_pool_leaves_out_the_seed_and_copies_of_the_positive():
    from lmembed.synthesis.gecko import negative_pool

    candidates = [10, 11, 12, 13, 14, 15]  # corpus rows; the seed is 12
    texts = ["a", "b", "c", "a", "e", "f"]  # row 13 is a copy of row 10's text
    ranked = [0, 1, 2, 3, 4, 5]  # the positive is candidate 0 (row 10); the seed ranks 3rd
    assert negative_pool(ranked, candidates, texts, 12, (3, 8)) == [4, 5]  # not the seed, not the copy
    assert negative_pool(ranked, candidates, texts, 12, (3, 4)) == [1, 4, 5]  # none left in the ranks: any below
    assert negative_pool([0, 1], [10, 12], ["a", "c"], 12, (3, 8)) == []  # nothing but the seed: no negative


def test_reciprocal_rank_fusion_rewards_agreement():
    fused = rrf([3.0, 2.0, 1.0], [0.1, 0.9, 0.5], k=1)
    assert fused[1] > fused[0] > fused[2]


def test_gecko_through_an_endpoint_falls_back_to_relevance_only_and_says_so(server, tmp_path):  # noqa: F811
    gen = EndpointGenerator(server(), "tiny", concurrency=2, retries=0)
    out = tmp_path / "e.jsonl"
    stats = synthesize("gecko", gen, out, corpus=(IDS, TOPICS), encode=encode)
    rows = _rows(out)
    assert rows and all(r["provenance"]["relabel"] == RELEVANCE_ONLY for r in rows)
    assert all(r["provenance"]["positive"]["query_likelihood"] is None for r in rows)
    assert any(RELEVANCE_ONLY in note and "/v1/completions answered HTTP 404" in note for note in stats["notes"])


def test_an_endpoint_that_echoes_prompt_logprobs_scores_query_likelihood(server):  # noqa: F811
    """``/v1/completions`` with echo + logprobs: the continuation's tokens are summed (the context's and the
    generated token's are not); Gecko then relabels with both signals."""
    gen = EndpointGenerator(server(COMPLETIONS="echo"), "tiny", concurrency=2, retries=0)
    # tokens after the context "cell river\n": " cell" (seen: -0.5), " ocean" (new: -4.0)
    assert gen.loglikelihood(["cell river\n", "a b"], ["cell ocean", "b"]) == [-4.5, -0.5]
    assert gen.usage.requests == 2
    without = EndpointGenerator(server(), "tiny", retries=0)
    with pytest.raises(ScoringUnsupported, match="/v1/completions answered HTTP 404"):
        without.loglikelihood(["a"], ["b"])
    with pytest.raises(ScoringUnsupported, match="HTTP 404"):
        without.loglikelihood(["c"], ["d"])
    assert without.usage.requests == 1  # known after the first answer: not asked again


def test_gecko_through_an_endpoint_with_prompt_logprobs_uses_both_signals(server, tmp_path):  # noqa: F811
    gen = EndpointGenerator(server(COMPLETIONS="echo"), "tiny", concurrency=2, retries=0)
    stats = synthesize("gecko", gen, tmp_path / "e.jsonl", corpus=(IDS, TOPICS), encode=encode)
    rows = _rows(tmp_path / "e.jsonl")
    assert rows and all(r["provenance"]["relabel"] == "query-likelihood+relevance" for r in rows)
    assert all(r["provenance"]["positive"]["query_likelihood"] < 0 for r in rows)
    assert stats["notes"] == []


def test_corpus_only_keeps_round_trips_mines_negatives_and_teacher_scores(tmp_path):
    out = tmp_path / "c.jsonl"
    stats = synthesize("corpus-only", TinyGenerator(), out, corpus=(IDS, TOPICS), encode=encode)
    rows = _rows(out)
    assert rows and stats["rows"] + sum(stats["rejected"].values()) == len(TOPICS)
    for row in rows:
        seed = TOPICS.index(row["positive"])
        scores = encode([row["query"]], "query") @ encode(TOPICS, "document").T
        assert int((scores[0] > scores[0, seed]).sum()) < 10  # the seed is in the teacher's top 10
        assert row["positive"] not in row["negatives"] and 1 <= len(row["negatives"]) <= 4
        assert len(row["teacher_scores"]["negatives"]) == len(row["negatives"])
        assert row["provenance"]["seed_passage"] == IDS[seed]


class _OffTopic(TinyGenerator):
    def generate(self, requests):
        return ['{"query": "zzzz qqqq unrelated words"}' for _ in requests]


def test_corpus_only_rejects_queries_that_do_not_find_their_passage(tmp_path):
    import yaml

    recipe = yaml.safe_load(Path("recipes/synthesis/corpus-only.yaml").read_text())
    recipe["top_k"] = 1
    path = tmp_path / "strict.yaml"
    path.write_text(yaml.safe_dump(recipe))
    stats = synthesize(path, _OffTopic(), tmp_path / "o.jsonl", corpus=(IDS, TOPICS), encode=encode)
    assert stats["rows"] < len(TOPICS) and stats["rejected"]["round_trip"] == len(TOPICS) - stats["rows"]


def test_relabel_recipes_need_a_corpus_and_an_embedder(tmp_path):
    with pytest.raises(ConfigError, match="needs a corpus"):
        synthesize("gecko", TinyGenerator(), tmp_path / "x.jsonl")
    with pytest.raises(ConfigError, match="needs an embedder"):
        synthesize("corpus-only", TinyGenerator(), tmp_path / "x.jsonl", corpus=(IDS, TOPICS))


def test_passages_come_from_a_text_file_or_a_corpus_file(tmp_path):
    (tmp_path / "p.txt").write_text("first passage\n\nsecond passage\n")
    assert read_passages(tmp_path / "p.txt") == (["1", "3"], ["first passage", "second passage"])
    (tmp_path / "corpus.jsonl").write_text('{"_id": "a", "title": "T", "text": "body"}\n')
    assert read_passages(tmp_path) == (["a"], ["T body"])
