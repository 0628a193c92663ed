"""Dataset resolution: lookup order, aliases, verified downloads, clear failures (no network)."""

from __future__ import annotations

import hashlib
import urllib.error
import zipfile
from pathlib import Path

import pytest

from lmembed import datasets, paths
from lmembed.datasets import (
    ArchiveSpec,
    ChecksumMismatchError,
    DatasetNotFoundError,
    canonical_name,
    resolve_dataset,
    resolve_local,
)
from lmembed.paths import shared_datasets_dir

REAL_FETCH = datasets._fetch


@pytest.fixture
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No $LMEMBED_DATA or $LMEMBED_HOME, no shared folder, a private home cache and no network."""
    monkeypatch.delenv(paths.DATA_ENV_VAR, raising=False)
    monkeypatch.delenv(paths.HOME_ENV_VAR, raising=False)
    monkeypatch.setattr(paths, "shared_candidates", lambda: [tmp_path / "no-shared"])
    monkeypatch.setattr(Path, "home", classmethod(lambda cls: tmp_path / "home"))

    def offline(url: str, dest: Path, *, timeout: float = 60.0) -> None:
        raise urllib.error.URLError("network is unreachable (test)")

    monkeypatch.setattr(datasets, "_fetch", offline)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_existing_path_wins(isolated: Path) -> None:
    folder = isolated / "my-data"
    folder.mkdir()
    assert resolve_dataset(folder) == folder.resolve()
    assert resolve_dataset("my-data") == folder.resolve()  # relative to the working directory


def test_env_var_before_shared(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env, shared = isolated / "env", isolated / "shared"
    (env / "scifact").mkdir(parents=True)
    (shared / "beir" / "scifact").mkdir(parents=True)
    monkeypatch.setattr(paths, "shared_candidates", lambda: [shared])
    monkeypatch.setenv(paths.DATA_ENV_VAR, str(env))
    assert resolve_dataset("scifact") == (env / "scifact").resolve()
    monkeypatch.delenv(paths.DATA_ENV_VAR)
    assert resolve_dataset("scifact") == (shared / "beir" / "scifact").resolve()


def test_resolve_local_finds_files_inside_a_dataset_folder(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = isolated / "env"
    (env / "training").mkdir(parents=True)
    (env / "training" / "rows.jsonl").write_text("{}\n")
    monkeypatch.setenv(paths.DATA_ENV_VAR, str(env))
    assert resolve_local("training/rows.jsonl") == (env / "training").resolve() / "rows.jsonl"
    (isolated / "here.jsonl").touch()
    assert resolve_local("here.jsonl") == Path("here.jsonl")  # an existing path is returned as given
    with pytest.raises(DatasetNotFoundError):
        resolve_local("nowhere/rows.jsonl")


def test_env_var_with_shared_layout(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (isolated / "env" / "sts" / "sickr").mkdir(parents=True)
    monkeypatch.setenv(paths.DATA_ENV_VAR, str(isolated / "env"))
    assert resolve_dataset("SICK-R") == (isolated / "env" / "sts" / "sickr").resolve()


def test_aliases_and_known_names() -> None:
    assert canonical_name("SICK-R") == "sickr" and canonical_name("sick-r") == "sickr"
    assert datasets.KNOWN_DATASETS["sts14"] == "sts/sts14"
    assert datasets.KNOWN_DATASETS["banking77"] == "classification/banking77"


def test_shared_dir_discovery(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert shared_datasets_dir() is None
    real = isolated / "shared" / "datasets"
    real.mkdir(parents=True)
    monkeypatch.setattr(paths, "shared_candidates", lambda: [isolated / "nope", real])
    assert shared_datasets_dir() == real.resolve()


def test_shared_candidates_are_relative_to_checkout_and_cwd() -> None:
    candidates = paths.shared_candidates()
    root = Path(paths.__file__).resolve().parents[2]
    assert candidates[0] == root.parent / "shared" / "datasets"
    assert Path.cwd().parent / "shared" / "datasets" in candidates


def test_failed_download_names_everything_tried(isolated: Path) -> None:
    with pytest.raises(DatasetNotFoundError) as info:
        resolve_dataset("scifact")
    message = str(info.value)
    assert "https://public.ukp.informatik.tu-darmstadt.de/thakur/BEIR/datasets/scifact.zip" in message
    assert "URLError" in message and "network is unreachable" in message
    assert str(isolated / "no-shared" / "beir" / "scifact") in message
    assert str(isolated / "home" / ".cache" / "lmembed" / "datasets" / "scifact") in message
    assert "LMEMBED_DATA" in message


def test_lmembed_home_moves_the_download_cache(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(paths.HOME_ENV_VAR, str(isolated / "lmhome"))
    with pytest.raises(DatasetNotFoundError) as info:
        resolve_dataset("scifact")
    assert str(isolated / "lmhome" / "datasets" / "scifact") in str(info.value)
    assert str(isolated / "home" / ".cache") not in str(info.value)
    spec = _zip(isolated / "toy.zip", {"toy/corpus.jsonl": "{}\n"})
    monkeypatch.setitem(datasets.ARCHIVES, "toy", spec)
    monkeypatch.setattr(datasets, "_fetch", REAL_FETCH)  # urllib reads file:// URLs
    assert resolve_dataset("toy") == (isolated / "lmhome" / "datasets" / "toy").resolve()


def test_unknown_or_undownloadable_names(isolated: Path) -> None:
    with pytest.raises(DatasetNotFoundError, match="no official archive is known for 'stsbenchmark'"):
        resolve_dataset("stsbenchmark")
    with pytest.raises(DatasetNotFoundError, match="download: disabled"):
        resolve_dataset("nfcorpus", download=False)


def _zip(path: Path, members: dict[str, str]) -> ArchiveSpec:
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in members.items():
            zf.writestr(name, text)
    data = path.read_bytes()
    return ArchiveSpec(url=path.as_uri(), sha256=hashlib.sha256(data).hexdigest(), size=len(data))


def test_verified_download_is_extracted_into_cache(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = _zip(isolated / "toy.zip", {"toy/corpus.jsonl": "{}\n", "toy/qrels/test.tsv": "a\tb\t1\n"})
    monkeypatch.setitem(datasets.ARCHIVES, "toy", spec)
    monkeypatch.setenv(paths.DATA_ENV_VAR, str(isolated / "cache"))
    monkeypatch.setattr(datasets, "_fetch", REAL_FETCH)  # urllib reads file:// URLs
    path = resolve_dataset("toy")
    assert path == (isolated / "cache" / "toy").resolve()
    assert (path / "qrels" / "test.tsv").read_text() == "a\tb\t1\n"
    assert not [p for p in (isolated / "cache").iterdir() if p.name.startswith(".")]  # temp dir cleaned
    assert resolve_dataset("toy") == path  # second call: found locally


def test_checksum_mismatch_is_refused(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = _zip(isolated / "toy.zip", {"toy/corpus.jsonl": "{}\n"})
    bad = ArchiveSpec(url=spec.url, sha256="0" * 64)
    monkeypatch.setitem(datasets.ARCHIVES, "toy", bad)
    monkeypatch.setenv(paths.DATA_ENV_VAR, str(isolated / "cache"))
    monkeypatch.setattr(datasets, "_fetch", REAL_FETCH)  # urllib reads file:// URLs
    with pytest.raises(DatasetNotFoundError, match=r"ChecksumMismatchError: .*sha256"):
        resolve_dataset("toy")
    assert not (isolated / "cache" / "toy").exists()


def test_unpinned_archive_and_zip_slip_are_refused(isolated: Path) -> None:
    spec = _zip(isolated / "evil.zip", {"../escape.txt": "x"})
    with pytest.raises(ChecksumMismatchError, match="no checksum"):
        datasets.verify_archive(isolated / "evil.zip", ArchiveSpec(url=spec.url))
    with pytest.raises(ValueError, match="escapes"):
        datasets._safe_extract(isolated / "evil.zip", isolated / "out")
    assert not (isolated / "escape.txt").exists()


def test_pinned_beir_checksums_are_well_formed() -> None:
    for name in ("scifact", "nfcorpus", "arguana"):
        spec = datasets.ARCHIVES[name]
        assert spec.url.endswith(f"/BEIR/datasets/{name}.zip")
        assert spec.md5 is not None and len(spec.md5) == 32
    assert len(datasets.ARCHIVES["scifact"].sha256 or "") == 64


def test_real_shared_folder_when_present() -> None:
    shared = shared_datasets_dir()
    if shared is None:
        pytest.skip("../shared/datasets is not available in this checkout")
    assert resolve_dataset("scifact", download=False) == (shared / "beir" / "scifact").resolve()
    assert resolve_dataset("sick-r", download=False) == (shared / "sts" / "sickr").resolve()
