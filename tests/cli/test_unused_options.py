"""An option typed on the command line that the command would not use is refused by name, before any model loads
(each was accepted and changed nothing; found by an options probe). Defaults and other commands' options are not."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from lmembed.cli.app import app


def _run(argv: list[str]) -> tuple[int, str]:
    result = CliRunner().invoke(app, argv)
    return result.exit_code, " ".join(result.output.replace("│", " ").split())


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["search", "IDX", "q", "--mode", "bm25", "--instruction", "X"], "--instruction is not used with --mode bm25"),
        (["search", "IDX", "q", "--mode", "bm25", "--model", "m", "--ef-search", "5"], "--model and --ef-search are"),
        (["search", "IDX", "q", "--fusion", "minmax"], "--fusion is not used with --mode dense"),
        (["search", "IDX", "q", "--rerank-top-k", "5"], "--rerank-top-k is not used without --rerank"),
        (["index", "build", "C", "-o", "OUT", "--kind", "flat", "--ef-search", "7"], "--ef-search is not used by a"),
        (["index", "build", "C", "-o", "OUT", "--kind", "hnsw", "--nprobe", "3"], "--nprobe is not used by a --kind"),
        (["eval", "--pooling", "cls"], "--pooling is not used by the main job"),
        (["eval", "-m", "m", "-d", "D", "--first-stage", "hybrid", "--grid", "pooling=cls"], "--grid is not used by"),
        (["eval", "-m", "m", "-d", "D", "--first-stage", "bm25", "--pooling", "cls"], "--pooling is not used with"),
        (["train", "--recipe", "R.yaml", "--config", "C.yaml"], "--config (a training run's file) is not read"),
        (["adapt", "-m", "minilm", "--corpus", "C", "-o", "OUT", "--generator-model", "gpt"], "no generator is given"),
        (["synthesize", "--recipe", "e5-mistral", "-o", "O.jsonl", "--device", "cuda:7"], "--device is not used by"),
    ],
)
def test_an_option_the_command_would_not_use_is_refused(tmp_path, monkeypatch, argv, said):
    monkeypatch.chdir(tmp_path)
    status, output = _run(argv)
    assert status == 2 and said in output, output
    assert "Traceback" not in output


def test_an_option_left_at_its_default_is_not_taken_for_one_given(tmp_path, monkeypatch):
    """--fusion's default with --mode dense is not a given --fusion (the refusal names only typed flags)."""
    monkeypatch.chdir(tmp_path)
    status, output = _run(["search", "IDX", "q", "--mode", "dense"])
    assert status != 0 and "not used" not in output, output
