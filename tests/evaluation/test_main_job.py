"""The main job (``lmembed eval`` with no arguments) reads each bundled model with that model's own conventions."""

from __future__ import annotations

import pytest

from lmembed import Embedder
from lmembed.evaluation import main_job


def test_each_main_job_strategy_is_the_model_own_with_the_job_options(monkeypatch, tmp_path):
    """minilm is recorded with its folder's bidirectional attention, as ``eval --model minilm`` records it (the job
    gave a whole default strategy, causal attention included, so one strategy became two rows of a report)."""
    seen = {}

    def record(embedder, tasks, configs, **_):
        seen.setdefault(embedder.name, []).extend(configs)
        return []

    monkeypatch.setattr(main_job, "evaluate_strategies", record)
    monkeypatch.setattr(main_job, "write_all", lambda results, output: None)
    try:
        main_job.run_main_job(tmp_path, batch_size=8)
    except FileNotFoundError as exc:  # the SciFact files beside the project
        pytest.skip(str(exc))
    alone = Embedder.from_pretrained("minilm", cache=False)
    minilm = next(configs for name, configs in seen.items() if "minilm" in name)
    assert [c.label() for c in minilm] == ["mean@-1+bidir", "mean@-1+bidir"]
    assert minilm[0] == alone.config  # the strategy `eval --model minilm` evaluates, field for field
    decoder = next(configs for name, configs in seen.items() if "smollm2" in name)
    labels = ["mean@-1", "weighted_mean@-1", "mean@15+norm", "mean@[15,16]+norm"]
    assert [c.label() for c in decoder] == labels and {c.max_length for c in decoder} == {256}
