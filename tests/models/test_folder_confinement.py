"""Every path a model folder names stays inside it (issue 36): a ``modules.json`` module path or a Router's module
that climbs out through ``..``, is absolute or is a link to elsewhere, and an adapter's relative base leading out,
are refused by name (exit 2 on the command line) before anything outside is opened; :func:`lmembed.paths.inside`,
the one check they all use, accepts what lies inside."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from typer.testing import CliRunner

from helpers import opened, opened_under
from lmembed.cli.app import app
from lmembed.errors import ModelLoadError, UnsafeFileError
from lmembed.models.adapters import UnsafeAdapterPathError, base_folder
from lmembed.models.sentence_transformers_folder import PublishedModelError, UnsafeModuleError
from lmembed.paths import inside

pytestmark = pytest.mark.usefixtures("one_torch_thread")

HIDDEN = 32
TEXTS = ["the cat sat on the mat", "a dog"]


# ---------------------------------------------------------------------------------------------- inside()
def test_inside_accepts_what_lies_inside_and_refuses_each_way_out(tmp_path):
    root = tmp_path / "model"
    (root / "a" / "b").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    (root / "link-in").symlink_to(root / "a")
    (root / "link-out").symlink_to(tmp_path / "elsewhere")
    (root / "loop").symlink_to(root / "loop")
    for ok in ("", ".", "a", "a/b", "a/../a/b", "link-in/b", "not-yet-there"):
        assert inside(root, ok, file="modules.json", field="modules[0].path") == root / ok
    refused = {
        "../elsewhere": "climbs out of",
        "a/../../elsewhere": "climbs out of",
        str(tmp_path / "elsewhere"): "is an absolute path",
        "~/x": "is an absolute path",
        "link-out": "leads outside",
        "link-out/x": "leads outside",
        "link-in/../link-out": "leads outside",
    }
    for path, reason in refused.items():
        with pytest.raises(UnsafeFileError) as caught:
            inside(root, path, file=root / "modules.json", field="modules[3].path")
        assert str(caught.value).startswith(f"{root / 'modules.json'}: modules[3].path={path!r} {reason}")
    with pytest.raises(UnsafeFileError):
        inside(root, "loop", file="x.json", field="f")
    with pytest.raises(PublishedModelError):  # the caller's own error class
        inside(root, "../x", file="x.json", field="f", error=UnsafeModuleError)


def test_a_hub_cache_snapshot_may_link_to_its_own_repositorys_blobs_only(tmp_path):
    """huggingface_hub links each file of a snapshot to the repository's ``blobs/``: those links are the folder's
    own files; a link to another repository's blobs, to a folder, or out of a folder that is no snapshot is not."""
    repo = tmp_path / "hub" / "models--org--name"
    snapshot = repo / "snapshots" / "0123abc"
    (snapshot / "1_Pooling").mkdir(parents=True)
    (repo / "blobs").mkdir()
    (repo / "blobs" / "aa11").write_text("{}")
    (snapshot / "config.json").symlink_to("../../blobs/aa11")
    (snapshot / "1_Pooling" / "config.json").symlink_to("../../../blobs/aa11")
    assert inside(snapshot, "config.json", file="lmembed.json", field="files") == snapshot / "config.json"
    assert inside(snapshot / "1_Pooling", "config.json", file="x", field="f") == snapshot / "1_Pooling" / "config.json"
    other = tmp_path / "hub" / "models--org--other" / "blobs"
    other.mkdir(parents=True)
    (other / "bb22").write_text("{}")
    (snapshot / "stolen.json").symlink_to(other / "bb22")
    (snapshot / "blob-folder").symlink_to(repo / "blobs")
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "config.json").symlink_to(repo / "blobs" / "aa11")
    for folder, name in ((snapshot, "stolen.json"), (snapshot, "blob-folder"), (plain, "config.json")):
        with pytest.raises(UnsafeFileError, match="leads outside"):
            inside(folder, name, file="lmembed.json", field="files")


# ---------------------------------------------------------------------------------------------- modules.json
@pytest.fixture(scope="module")
def published(tmp_path_factory) -> Path:
    """A sentence-transformers folder (Transformer at the root, mean Pooling, Normalize) and a Dense module's
    folder beside it, outside it."""
    from conftest import build_tokenizer, tiny_model
    from lmembed import Embedder, EmbeddingConfig

    root = tmp_path_factory.mktemp("published")
    tok = build_tokenizer()
    emb = Embedder.from_model(tiny_model("bert", len(tok)), tok, EmbeddingConfig(), use_cache=False)
    model = emb.save(root / "model")
    (model / "lmembed.json").unlink()  # a plain sentence-transformers folder
    dense = root / "outside" / "2_Dense"
    dense.mkdir(parents=True)
    config = {"in_features": HIDDEN, "out_features": 8, "bias": True}
    (dense / "config.json").write_text(
        json.dumps({**config, "activation_function": "torch.nn.modules.activation.Tanh"})
    )
    generator = torch.Generator().manual_seed(3)
    weights = {"linear.weight": torch.randn(8, HIDDEN, generator=generator), "linear.bias": torch.randn(8)}
    save_file(weights, str(dense / "model.safetensors"))
    base = root / "base"  # the backbone's files, beside the folder
    base.mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(model / name, base / name)
    return root


@pytest.fixture
def layout(published, tmp_path) -> Path:
    shutil.copytree(published, tmp_path / "p", symlinks=True)
    return tmp_path / "p"


def set_module(model: Path, index: int, path: str, kind: str | None = None) -> None:
    modules = json.loads((model / "modules.json").read_text())
    entry = {"idx": index, "name": str(index), "path": path, "type": f"sentence_transformers.models.{kind}"}
    if kind is None:
        modules[index]["path"] = path
    else:
        modules.insert(index, entry)
    (model / "modules.json").write_text(json.dumps(modules))


def load(model: Path):
    from lmembed import Embedder

    return Embedder.from_pretrained(str(model), cache=False, show_progress=False)


def test_a_dense_module_inside_the_folder_is_used(layout):
    """The control: the same Dense module inside the folder loads and changes the vectors (so one read from
    outside would change them too)."""
    model = layout / "model"
    plain = load(model).encode_corpus(TEXTS)
    shutil.copytree(layout / "outside" / "2_Dense", model / "2_Dense")
    set_module(model, 2, "2_Dense", "Dense")
    with_dense = load(model).encode_corpus(TEXTS)
    assert plain.shape[1] == HIDDEN and with_dense.shape[1] == 8


def _dense_dotdot(root: Path) -> tuple[int, str, str | None]:
    return 2, "../outside/2_Dense", "Dense"


def _dense_absolute(root: Path) -> tuple[int, str, str | None]:
    return 2, str(root / "outside" / "2_Dense"), "Dense"


def _dense_symlink(root: Path) -> tuple[int, str, str | None]:
    (root / "model" / "2_Dense").symlink_to(root / "outside" / "2_Dense")
    return 2, "2_Dense", "Dense"


def _transformer_sibling(root: Path) -> tuple[int, str, str | None]:
    return 0, "../base", None


def _transformer_symlink(root: Path) -> tuple[int, str, str | None]:
    (root / "model" / "backbone").symlink_to(root / "base")
    return 0, "backbone", None


def _pooling_etc(root: Path) -> tuple[int, str, str | None]:
    return 1, "../../../../etc", None


HOSTILE = {
    "Dense ../": (_dense_dotdot, "climbs out of"),
    "Dense absolute": (_dense_absolute, "is an absolute path"),
    "Dense symlink": (_dense_symlink, "leads outside"),
    "Transformer ../base": (_transformer_sibling, "climbs out of"),
    "Transformer symlink": (_transformer_symlink, "leads outside"),
    "Pooling ../../../../etc": (_pooling_etc, "climbs out of"),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_module_path_leaving_the_folder_is_refused_before_it_is_read(layout, case):
    make, reason = HOSTILE[case]
    model = layout / "model"
    index, path, kind = make(layout)
    set_module(model, index, path, kind)
    expected = f"{model / 'modules.json'}: modules[{index}].path={path!r} {reason}"
    with opened() as files:
        with pytest.raises(UnsafeModuleError) as caught:
            load(model)
        texts = layout / "texts.txt"
        texts.write_text("\n".join(TEXTS) + "\n")
        argv = ["encode", str(texts), "-o", str(layout / "v.npy"), "--model", str(model)]
        result = CliRunner().invoke(app, argv)
    assert str(caught.value).startswith(expected)
    assert isinstance(caught.value, ModelLoadError)
    assert result.exit_code == 2, result.output
    assert expected in " ".join(result.output.replace("│", " ").split())
    assert "Traceback" not in result.output
    assert not (layout / "v.npy").exists()
    assert opened_under(files, layout / "outside") == []
    assert opened_under(files, layout / "base") == []


def test_a_router_module_leaving_the_folder_is_refused(layout):
    model = layout / "model"
    router = model / "2_Router"
    router.mkdir()
    escape = "../../outside/2_Dense"
    dense = "sentence_transformers.models.Dense"
    config = {"types": {escape: dense}, "structure": {"query": [escape], "document": [escape]}, "parameters": {}}
    (router / "router_config.json").write_text(json.dumps(config))
    set_module(model, 2, "2_Router", "Router")
    with opened() as files, pytest.raises(UnsafeModuleError) as caught:
        load(model)
    assert str(caught.value).startswith(f"{router / 'router_config.json'}: structure.query[0]={escape!r} climbs out of")
    assert opened_under(files, layout / "outside") == []


# ---------------------------------------------------------------------------------------------- adapters
def test_an_adapter_base_relative_to_the_adapter_stays_inside_it(tmp_path, monkeypatch):
    adapter = tmp_path / "adapter"
    (adapter / "mntp").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    (adapter / "linked").symlink_to(tmp_path / "elsewhere")
    assert base_folder(adapter, "mntp") == adapter / "mntp"
    assert base_folder(adapter, "./mntp") == adapter / "./mntp"
    assert base_folder(adapter, str(tmp_path / "elsewhere")) == tmp_path / "elsewhere"  # a model named by its place
    for base, reason in (("../elsewhere", "climbs out of"), ("linked", "leads outside"), ("~/x", "absolute")):
        with pytest.raises(UnsafeAdapterPathError) as caught:
            base_folder(adapter, base)
        assert str(caught.value).startswith(f"{adapter / 'adapter_config.json'}: base_model_name_or_path={base!r}")
        assert reason in str(caught.value)
        assert isinstance(caught.value, ModelLoadError)
    # a Hub id is never looked up as a folder of the working directory
    (tmp_path / "org" / "name").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    import huggingface_hub

    def offline(repo_id: str, **kwargs):
        raise OSError(f"offline: {repo_id}")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    with pytest.raises(ModelLoadError, match="not a local folder and not downloadable"):
        base_folder(adapter, "org/name")


def test_a_saved_head_layer_outside_the_folder_is_refused(layout):
    """lmembed's own saved folder: ``lmembed.json``'s ``strategy.head[i].path`` stays inside it too."""
    model = layout / "model"
    shutil.copytree(layout / "outside" / "2_Dense", model / "2_Dense")
    set_module(model, 2, "2_Dense", "Dense")
    saved = load(model).save(layout / "saved")
    expected_vectors = load(saved).encode_corpus(TEXTS)
    assert expected_vectors.shape == (2, 8)
    meta = json.loads((saved / "lmembed.json").read_text())
    assert meta["strategy"]["head"][0]["path"] == "2_Dense"
    meta["strategy"]["head"][0]["path"] = "../outside/2_Dense"
    (saved / "lmembed.json").write_text(json.dumps(meta))
    with opened() as files, pytest.raises(UnsafeFileError) as caught:
        load(saved)
    assert str(caught.value).startswith(
        f"{saved / 'lmembed.json'}: strategy.head[0].path='../outside/2_Dense' climbs out of"
    )
    assert opened_under(files, layout / "outside") == []
