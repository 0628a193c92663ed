"""Classification: MTEB's undersampling protocol, its determinism, and the probe's scores."""

from __future__ import annotations

import hashlib
import json
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pytest

from lmembed.evaluation.tasks import ClassificationTask, load_task
from lmembed.evaluation.tasks.classification import undersample
from lmembed.paths import shared_datasets_dir
from lmembed.task_registry import TASKS

SHARED = (shared_datasets_dir() or Path("/nonexistent")) / "classification"


def mteb_112_undersample(labels, samples_per_label, n_experiments=10):
    """mteb 1.12.75 as it ran: global np.random.shuffle, re-seeded to 42 by every evaluator."""
    np.random.seed(42)  # AbsTask.__init__
    order, out = np.arange(len(labels)), []
    for _ in range(n_experiments):
        np.random.shuffle(order)
        taken, chosen = defaultdict(int), []
        for i in order:
            if taken[labels[i]] < samples_per_label:
                chosen.append(int(i))
                taken[labels[i]] += 1
        out.append(chosen)
        np.random.seed(42)  # logRegClassificationEvaluator -> Evaluator.__init__(seed=42)
    return out


class ClassEncoder:
    """Texts 'c<k> ...' map near the k-th axis; records which texts were embedded."""

    def __init__(self, dim: int = 8, noise: float = 0.05) -> None:
        self.dim, self.noise = dim, noise
        self.embedded: list[str] = []

    def _vec(self, text: str) -> np.ndarray:
        k = int(text.split()[0][1:])
        seed = int(hashlib.md5(text.encode()).hexdigest()[:8], 16)
        v = np.random.default_rng(seed).normal(scale=self.noise, size=self.dim)
        v[k] += 1.0
        return v.astype(np.float32)

    def encode(self, texts, *, batch_size=32):
        self.embedded += list(texts)
        return np.stack([self._vec(t) for t in texts])

    def encode_queries(self, texts, *, instruction=None, batch_size=32):
        return self.encode(texts)

    def encode_corpus(self, texts, *, batch_size=32):
        return self.encode(texts)


def _toy(n_classes: int = 3, per_class: int = 30, **kwargs) -> ClassificationTask:
    train = [(f"c{k} train {i}", k) for k in range(n_classes) for i in range(per_class)]
    test = [(f"c{k} test {i}", k) for k in range(n_classes) for i in range(10)]
    return ClassificationTask(
        "Toy", [t for t, _ in train], [y for _, y in train], [t for t, _ in test], [y for _, y in test], **kwargs
    )


def test_undersample_counts_per_label():
    labels = [0] * 50 + [1] * 20 + [2] * 5
    selections = undersample(labels, samples_per_label=8)
    assert len(selections) == 10
    for chosen in selections:
        counts = Counter(labels[i] for i in chosen)
        assert counts == {0: 8, 1: 8, 2: 5}  # a label with fewer examples keeps them all
        assert len(set(chosen)) == len(chosen)


def test_undersample_is_deterministic_and_varies_between_experiments():
    labels = [i % 4 for i in range(200)]
    assert undersample(labels) == undersample(labels)
    selections = undersample(labels)
    assert len({tuple(s) for s in selections}) == 10
    assert undersample(labels, seed=7) != selections


def test_undersample_reproduces_mteb_1_12_global_rng_order():
    labels = [i % 7 for i in range(300)]
    assert undersample(labels, samples_per_label=16) == mteb_112_undersample(labels, 16)


def test_perfectly_separable_classes_score_one_and_f1_is_macro():
    result = _toy().evaluate(ClassEncoder())
    assert result.scores["accuracy"] == 1.0
    assert result.scores["f1"] == 1.0
    assert result.main_score == result.scores["accuracy"]
    assert result.main_metric == "accuracy"
    assert len(result.extra["scores_per_experiment"]) == 10
    assert "ap" not in result.scores  # three classes


def test_binary_tasks_report_ap():
    result = _toy(n_classes=2, n_experiments=2).evaluate(ClassEncoder())
    assert result.scores["ap"] == pytest.approx(1.0)


def test_evaluation_is_deterministic_and_embeds_only_used_train_examples():
    task = _toy(per_class=40, samples_per_label=4, n_experiments=2)
    encoder = ClassEncoder(noise=0.8)
    first = task.evaluate(encoder)
    used = set().union(*task.experiments())
    train_embedded = [t for t in encoder.embedded if " train " in t]
    assert set(train_embedded) == {task.train_texts[i] for i in used}
    assert len(train_embedded) == len(used)  # each once
    second = task.evaluate(ClassEncoder(noise=0.8))
    assert first.scores == second.scores


def test_instruction_goes_on_train_and_test_texts():
    seen = []

    class Recording(ClassEncoder):
        def encode_queries(self, texts, *, instruction=None, batch_size=32):
            seen.append(instruction)
            return super().encode(texts)

        def encode(self, texts, *, batch_size=32):
            seen.append("plain")
            return super().encode(texts)

    task = _toy(instruction="Classify it", n_experiments=2)
    task.evaluate(Recording())
    assert seen == ["Classify it"]


def test_from_path(tmp_path):
    for split, n in (("train", 12), ("test", 4)):
        rows = [{"text": f"c{i % 2} {split} {i}", "label": i % 2, "label_text": "x"} for i in range(n)]
        (tmp_path / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = load_task(tmp_path, samples_per_label=2)
    assert isinstance(task, ClassificationTask)
    assert len(task.train_texts) == 12 and len(task.test_texts) == 4
    assert all(len(s) == 4 for s in task.experiments())
    same = load_task(tmp_path / "test.jsonl", task_type="classification")
    assert same.test_texts == task.test_texts


def test_known_settings():
    assert TASKS["EmotionClassification"].settings["samples_per_label"] == 16
    assert "samples_per_label" not in TASKS["Banking77Classification"].settings


@pytest.mark.skipif(not (SHARED / "banking77/train.jsonl").is_file(), reason="shared data absent")
def test_real_sample_counts_banking77_and_emotion():
    banking = ClassificationTask.from_path(SHARED / "banking77", name="Banking77Classification")
    selections = banking.experiments()
    assert len(set(banking.train_labels)) == 77
    assert [len(s) for s in selections] == [616] * 10  # 77 labels x 8
    assert all(set(Counter(banking.train_labels[i] for i in s).values()) == {8} for s in selections)
    assert selections == mteb_112_undersample(banking.train_labels, 8)
    emotion = ClassificationTask.from_path(
        SHARED / "emotion", name="EmotionClassification", **TASKS["EmotionClassification"].settings
    )
    assert [len(s) for s in emotion.experiments()] == [96] * 10  # 6 labels x 16
