"""A task type experiments have never heard of: defined here with only the ``Task`` protocol, registered with
``register_task_type``, and run through ``lmembed experiment`` (suite, shrinking, cache warming, scoring, per-item
paired comparisons) with no change to ``lmembed.experiments``. Also: experiments score retrieval with the task's
own scoring, ``search_method`` included."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
import yaml

from conftest import tiny_model
from lmembed import Embedder, EmbeddingConfig
from lmembed.evaluation import tasks as task_types
from lmembed.evaluation.base import ItemScores, ShrinkLimits, TaskResult, TextsToEmbed
from lmembed.evaluation.metrics import evaluate_run
from lmembed.evaluation.retrieval_data import RetrievalData
from lmembed.evaluation.search import exact_search
from lmembed.evaluation.tasks import RetrievalTask, register_task_type
from lmembed.evaluation.tasks import retrieval as retrieval_module
from lmembed.experiments.runner import run_experiment
from lmembed.experiments.scoring import score_task
from lmembed.experiments.spec import load_spec

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ROWS = [
    ("the cat sat on the mat", "a cat sat on a mat"),
    ("a man riding a horse", "the man is riding a horse"),
    ("a woman eating food", "the woman was eating"),
    ("protein gene study", "the cell gene result"),
    ("a great movie", "the movie was great"),
    ("embedding vector search", "vector search with embeddings"),
    ("hello there friend", "hello friend"),
]


@dataclass
class ParaphraseTask:
    """Each text should find its own paraphrase first among all paraphrases (only the ``Task`` protocol)."""

    name: str
    texts: list[str]
    paraphrases: list[str]
    instruction: str | None = None
    split: str = "test"
    task_type: ClassVar[str] = "ParaphraseFinding"
    main_metric: ClassVar[str] = "accuracy"

    @classmethod
    def from_path(cls, path: str | Path, *, name: str | None = None, split: str = "test", **settings: Any):
        rows = [json.loads(line) for line in Path(path).read_text().splitlines()]
        return cls(name or Path(path).stem, [r["text"] for r in rows], [r["paraphrase"] for r in rows], **settings)

    def with_instruction(self, instruction: str | None) -> ParaphraseTask:
        return dataclasses.replace(self, instruction=instruction)

    def embedded_texts(self) -> list[TextsToEmbed]:
        return [TextsToEmbed(self.texts, "query", self.instruction), TextsToEmbed(self.paraphrases, "document")]

    def shrink(self, limits: ShrinkLimits) -> ParaphraseTask:
        keep = limits.max_items
        if keep is None or keep >= len(self.texts):
            return self
        return dataclasses.replace(
            self, name=f"{self.name}[{keep} items]", texts=self.texts[:keep], paraphrases=self.paraphrases[:keep]
        )

    def evaluate(self, encoder: Any, *, batch_size: int = 32) -> TaskResult:
        queries = np.asarray(encoder.encode_queries(self.texts, instruction=self.instruction, batch_size=batch_size))
        documents = np.asarray(encoder.encode_corpus(self.paraphrases, batch_size=batch_size))
        hits = (np.argmax(queries @ documents.T, axis=1) == np.arange(len(self.texts))).astype(float)
        scores = {"accuracy": float(hits.mean()), "main_score": float(hits.mean())}
        return TaskResult(
            self.name, self.task_type, self.split, scores, self.main_metric, items=ItemScores.numbered("mean", hits)
        )


@pytest.fixture
def paraphrase_type(monkeypatch: pytest.MonkeyPatch):
    """ParaphraseTask registered for this test only."""
    monkeypatch.setattr(task_types, "TASK_TYPES", dict(task_types.TASK_TYPES))
    monkeypatch.setattr(task_types, "_ALIASES", dict(task_types._ALIASES))
    register_task_type(ParaphraseTask.task_type, ParaphraseTask)
    return ParaphraseTask


def test_a_new_task_type_runs_through_an_experiment(tmp_path: Path, tokenizer, paraphrase_type, monkeypatch):
    monkeypatch.setenv("LMEMBED_CACHE", str(tmp_path / "cache"))
    model = tiny_model("bert", len(tokenizer))
    Embedder.from_model(model, tokenizer, EmbeddingConfig(pooling="mean"), use_cache=False).save(tmp_path / "tiny")
    data = tmp_path / "paraphrases.jsonl"
    data.write_text("".join(json.dumps({"text": a, "paraphrase": b}) + "\n" for a, b in ROWS))
    spec = {
        "name": "new-type",
        "model": str(tmp_path / "tiny"),
        "device": "cpu",
        "seeds": [0],
        "evaluate": {
            "tasks": [{"path": str(data), "type": "paraphrase-finding", "name": "Para"}],
            "max_items": 6,
            "batch_size": 4,
        },
        "arms": {"mean": {"strategy": {"pooling": "mean"}}, "cls": {"strategy": {"pooling": "cls"}}},
    }
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    outcome = run_experiment(load_spec(tmp_path / "spec.yaml"), tmp_path / "out")

    assert sorted(outcome.finished) == ["cls/eval", "mean/eval"]
    items = json.loads((tmp_path / "out/runs/mean/eval/items.json").read_text())["Para[6 items]"]
    record = json.loads((tmp_path / "out/runs/mean/eval/run.json").read_text())["tasks"]["Para[6 items]"]
    assert items["statistic"] == "mean" and items["ids"] == [str(i) for i in range(6)]
    assert set(items["values"]) <= {0.0, 1.0} and record["items"] == 6
    assert record["task_type"] == "ParaphraseFinding"
    assert record["main_score"] == pytest.approx(np.mean(items["values"]))
    summary = outcome.summary
    (compared,) = [c for c in summary["comparisons"] if c["task"] == "Para[6 items]"]
    assert compared["items"] == 6 and {compared["a"], compared["b"]} == {"mean", "cls"}
    assert summary["scores"]["mean"]["Para[6 items]"]["interval"] is not None


# ---------------------------------------------------------------------------------------------- retrieval
def _retrieval_task(rng: np.random.Generator) -> RetrievalTask:
    docs = [f"d{i}" for i in range(40)]
    queries = [f"q{i}" for i in range(12)]
    qrels = {q: {docs[(3 * i) % 40]: 1, docs[(3 * i + 7) % 40]: int(rng.integers(1, 3))} for i, q in enumerate(queries)}
    data = RetrievalData("Synthetic", "test", docs, docs, queries, queries, qrels)
    return RetrievalTask(data)


class VectorEncoder:
    """Fixed random vectors per text: queries and documents share nothing but chance."""

    model_name = "vectors"

    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)
        self.table: dict[str, np.ndarray] = {}

    def _rows(self, texts: list[str]) -> np.ndarray:
        for text in texts:
            self.table.setdefault(text, self.rng.normal(size=16).astype(np.float32))
        return np.stack([self.table[t] for t in texts])

    def encode_queries(self, texts, *, instruction=None, batch_size=32):
        return self._rows(list(texts))

    def encode_corpus(self, texts, *, batch_size=32):
        return self._rows(list(texts))


@pytest.mark.parametrize("search_method", ["exact", "faiss"])
def test_retrieval_items_are_the_tasks_own_per_query_scores(search_method: str, monkeypatch: pytest.MonkeyPatch):
    task = dataclasses.replace(_retrieval_task(np.random.default_rng(1)), search_method=search_method)
    methods: list[str] = []
    real_search = retrieval_module.search_corpus

    def spy(*args, **kwargs):
        methods.append(kwargs["method"])
        return real_search(*args, **kwargs)

    monkeypatch.setattr(retrieval_module, "search_corpus", spy)
    encoder = VectorEncoder()
    score = score_task(task, encoder)
    assert methods == ([] if search_method == "exact" else ["faiss"])  # the task's own search, as configured

    # what the scoring experiments used before (exact search of the same embeddings, nDCG@10 per query)
    queries, corpus = encoder.encode_queries(task.data.query_texts), encoder.encode_corpus(task.data.corpus_texts)
    run = exact_search(queries, corpus, top_k=1000).to_run(task.data.query_ids, task.data.corpus_ids)
    per_query = evaluate_run(task.data.qrels, run).per_query
    assert score.statistic == "mean" and score.item_ids == sorted(task.data.query_ids)
    assert score.values == pytest.approx([per_query[q]["ndcg_at_10"] for q in score.item_ids], abs=1e-6)
    assert np.mean(score.values) == pytest.approx(score.scores["ndcg_at_10"], abs=1e-5) == score.main_score
    assert len(set(score.values)) > 2  # the queries differ, so a wrong pairing of ids and values would show
