"""bench/gpu_throughput.py's dry run (tiny random models, synthetic texts, CPU): the GPU check cannot rot unseen."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import bundled_or_skip

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "bench" / "gpu_throughput.py"
MODELS = ("minilm", "smollm2-135m", "qwen2-0.5b")


def _run(out: Path, *extra: str) -> subprocess.CompletedProcess:
    """The script as a user starts it: for what it refuses before any work."""
    command = [sys.executable, str(SCRIPT), "--device", "cpu", "--dry", "--out", str(out), *extra]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=REPO)


@pytest.fixture(scope="module")
def script():
    """The script's module, imported once here (bench/ on the path for its ``_common``): a dry run in this process
    spares each test the seconds a new interpreter takes to import torch and sentence-transformers."""
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        spec = importlib.util.spec_from_file_location("gpu_throughput_under_test", SCRIPT)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(SCRIPT.parent))
    return module


def _dry(script, out: Path, *extra: str) -> dict:
    """One dry run in this process; torch's thread count (which the dry run sets to 1) is restored after it."""
    threads = torch.get_num_threads()
    try:
        return script.main(["--device", "cpu", "--dry", "--out", str(out), *extra])
    finally:
        torch.set_num_threads(threads)


def test_dry_run_measures_every_cell_and_compares_vectors(script, tmp_path):
    bundled_or_skip("minilm")  # the tokenizers: minilm's, and SmolLM2's for both decoders
    bundled_or_skip("smollm2-135m")
    _dry(script, tmp_path)
    result = json.loads((tmp_path / "result.json").read_text())
    table = (tmp_path / "table.md").read_text()
    assert result["dry"] and "Dry run" in table
    assert list(result["models"]) == list(MODELS)
    for name, section in result["models"].items():
        assert f"## {name}:" in table
        assert len(section["cells"]) == 4  # batch sizes x (short, long)
        for cell in section["cells"].values():
            assert not cell["errors"]
            rates = cell["texts_per_s"]
            for dtype in ("float16", "bfloat16"):
                for label in (f"st-{dtype}", f"lmembed-{dtype}-serial", f"lmembed-{dtype}-packed"):
                    assert rates[label] > 0
                assert f"lmembed-{dtype}-packed / st-float16" in cell["ratios"]
                agree = cell["agreement"]
                # tiny random models: lmembed and sentence-transformers read the same tokens
                assert agree[f"min_cos lmembed-{dtype}-serial vs st-{dtype}"] >= 0.999
                assert agree[f"min_cos lmembed-{dtype}-packed vs serial"] >= 0.999
                if f"lmembed-{dtype}" in rates:  # the pipelined engine (EncodingEngine.pipelined)
                    assert agree[f"lmembed-{dtype} vs serial: bit-for-bit"] is True
                if dtype == "float16":  # the first dtype also plans a quarter of the texts at a time
                    assert agree["min_cos lmembed-float16-window vs serial"] >= 0.999
                    assert cell["first_round_ratios"]["lmembed-float16-window / st-float16"] > 0
                # the cuda-graphs backend's widened batches (run eagerly on the dry run's CPU)
                assert agree[f"min_cos lmembed-{dtype}-graphs vs serial"] >= 0.999
                assert agree[f"min_cos lmembed-{dtype}-graphs vs st-{dtype}"] >= 0.999
                assert cell["ratios"][f"lmembed-{dtype}-graphs / st-float16"] > 0
                # the host's tokenising, as a share of each lmembed call (engine.last_run), where it can be read
                assert 0 < cell["host"][f"tokenising share lmembed-{dtype}-serial"] < 1


def test_time_budget_stops_cleanly_and_still_writes(script, tmp_path):
    _dry(script, tmp_path, "--budget-s", "0")
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["models"] == {} and "time budget" in result["stopped"]
    assert "Stopped early" in (tmp_path / "table.md").read_text()


def test_cpu_without_dry_is_refused(tmp_path):
    command = [sys.executable, str(SCRIPT), "--device", "cpu", "--out", str(tmp_path)]
    refused = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert refused.returncode == 2 and "--dry" in refused.stderr
    assert not (tmp_path / "result.json").exists()


def test_one_dtype_and_two_arms_measure_only_their_rows_and_documents_on_request(script, tmp_path):
    bundled_or_skip("minilm")
    extra = ["--dtypes", "float16", "--models", "minilm", "--batch-sizes", "8", "--lengths", "short,documents"]
    extra += ["--arms", "pipelined,graphs"]
    _dry(script, tmp_path, *extra)
    result = json.loads((tmp_path / "result.json").read_text())
    cells = result["models"]["minilm"]["cells"]
    assert list(cells) == ["batch 4, short", "batch 4, documents"]  # --dry caps the batch size
    rates = cells["batch 4, documents"]["texts_per_s"]
    assert result["dtypes"] == ["float16"] and not any("bfloat16" in label for label in rates)
    assert sorted(rates) == ["lmembed-float16", "lmembed-float16-graphs", "st-float16"]  # the arms asked for
    # no serial arm: the widened batches are compared with the default engine's
    assert cells["batch 4, documents"]["agreement"]["min_cos lmembed-float16-graphs vs pipelined"] >= 0.999
    # on the dry run's CPU every widened batch runs eagerly: no graph is held
    assert cells["batch 4, documents"]["graphs"]["lmembed-float16-graphs"]["held"] == 0
    assert cells["batch 4, documents"]["graphs"]["lmembed-float16-graphs"]["eager_passes"] > 0
    table = (tmp_path / "table.md").read_text()
    assert "first round / st-float16" in table and "documents" in table
    assert "| lmembed-float16-graphs | 0 / " in table  # the graphs row (none held on the CPU)


@pytest.mark.parametrize(("cell_seconds", "rounds"), [("1000", 3), ("0", 1)])
def test_short_cells_get_more_rounds_up_to_the_most(script, tmp_path, cell_seconds, rounds):
    """Past --repeats, rounds go on while a contender has measured under --cell-seconds, up to --max-repeats."""
    bundled_or_skip("minilm")
    extra = ["--dtypes", "float16", "--models", "minilm", "--batch-sizes", "8", "--arms", "pipelined,serial"]
    _dry(script, tmp_path, *extra, "--max-repeats", "3", "--cell-seconds", cell_seconds)
    cells = json.loads((tmp_path / "result.json").read_text())["models"]["minilm"]["cells"]
    assert [cell["rounds"] for cell in cells.values()] == [rounds, rounds]


@pytest.mark.parametrize(
    "bad",
    [
        ["--batch-sizes", "0"],
        ["--models", "bert-large"],
        ["--repeats", "0"],
        ["--dtypes", "float8"],
        ["--lengths", "x"],
        ["--arms", "pipelined,turbo"],
    ],
)
def test_bad_options_are_refused(bad, tmp_path):
    done = _run(tmp_path, *bad)
    assert done.returncode == 2 and bad[0] in done.stderr
