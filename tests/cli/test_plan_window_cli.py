"""``--plan-window N`` (every command that encodes with a local engine): the engine tokenises and plans N texts at a
time; the vectors are those of planning all at once within float rounding; a window of no texts is refused by name,
on the command line and in the Python API, before anything is encoded."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from lmembed import Embedder
from lmembed.cli.app import app
from lmembed.encoding.engine import EncodingEngine
from lmembed.errors import ConfigError

TEXTS = [f"text {i} " + "the cat sat on the mat " * (1 + i % 5) for i in range(9)]


@pytest.fixture
def model(make_embedder, tmp_path) -> str:
    return str(make_embedder("bert", pooling="mean").save(tmp_path / "model"))


def _encode(tmp_path, model: str, *extra: str):
    source = tmp_path / "texts.txt"
    source.write_text("\n".join(TEXTS) + "\n")
    out = tmp_path / f"out{len(list(tmp_path.glob('out*.npy')))}.npy"
    args = ["encode", str(source), "-o", str(out), "--model", model, "--no-cache", "--batch-size", "2", *extra]
    return CliRunner().invoke(app, args), out


def test_the_window_reaches_the_engine_and_keeps_the_vectors(model, tmp_path, monkeypatch):
    windows: list[int | None] = []
    compute = EncodingEngine._compute

    def spy(self, *args, **kwargs):
        windows.append(self.plan_window)
        return compute(self, *args, **kwargs)

    monkeypatch.setattr(EncodingEngine, "_compute", spy)
    whole, whole_out = _encode(tmp_path, model)
    windowed, windowed_out = _encode(tmp_path, model, "--plan-window", "4")
    assert whole.exit_code == 0 and windowed.exit_code == 0, whole.output + windowed.output
    assert windows == [None, 4]
    np.testing.assert_allclose(np.load(windowed_out), np.load(whole_out), atol=1e-5)


def test_a_window_of_no_texts_is_refused_by_name(model, tmp_path):
    result, out = _encode(tmp_path, model, "--plan-window", "0")
    assert result.exit_code == 2 and "--plan-window" in result.output
    assert not out.exists()
    with pytest.raises(ConfigError, match=r"plan_window=0 must be a number of texts"):
        Embedder.from_pretrained(model, plan_window=0)


def test_a_window_on_ray_is_refused_by_name_before_anything_starts(model, tmp_path):
    """Ray's workers load the model from its spec and plan their own shards: the flag would do nothing there."""
    result, out = _encode(tmp_path, model, "--plan-window", "4", "--engine", "ray")
    assert result.exit_code == 2 and "--plan-window" in result.output and "--engine local" in result.output
    assert not out.exists()
