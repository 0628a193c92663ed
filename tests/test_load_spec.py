"""The load spec (lmembed.load_spec): one record of what was loaded, written and read whole by every consumer.

A field added to ``LoadSpec`` needs a sample value in ``SAMPLES`` below and nothing else: the index manifest, Ray's
worker spec, an export's ``lmembed.json`` and the server's ``/v1/models`` all serialise the whole record, and these
tests round-trip every field through each of them.
"""

from __future__ import annotations

import json
import pickle
from dataclasses import fields
from types import SimpleNamespace

import numpy as np
import pytest

from lmembed import Embedder, EmbeddingConfig
from lmembed.errors import ConfigError
from lmembed.index.errors import IndexFormatError
from lmembed.index.kinds import IndexParams
from lmembed.index.manifest import Manifest, ModelRecord
from lmembed.load_spec import LoadSpec, load_field_names

# one value per model field of LoadSpec, each different from its default
SAMPLES = {
    "source": "/models/some-folder",
    "dtype": "bfloat16",
    "backend": "onnx",
    "precision": "int8",
    "calibration": ("first calibration text", "second one"),
    "rope_scale": 2.5,
    "attn_implementation": "eager",
}
STRATEGY = EmbeddingConfig(pooling="last", layer=-2, attention="bidirectional", dim=16, max_length=64)


def sample_spec() -> LoadSpec:
    return LoadSpec(config=STRATEGY, **SAMPLES)


def test_every_field_has_a_sample_that_differs_from_its_default():
    assert set(SAMPLES) == set(load_field_names()), "give the new LoadSpec field a sample value in SAMPLES"
    defaults = LoadSpec(source=None)
    for name in load_field_names():
        assert getattr(defaults, name) != SAMPLES[name], name
    assert {f.name for f in fields(LoadSpec)} == {*load_field_names(), "config"}


def test_the_spec_round_trips_through_json():
    spec = sample_spec()
    assert LoadSpec.from_dict(json.loads(spec.to_json())) == spec


def test_every_field_reaches_the_index_manifest_and_back():
    spec = sample_spec()
    manifest = Manifest(
        params=IndexParams(kind="flat"),
        dim=16,
        count=3,
        model=ModelRecord(name="some-folder", fingerprint="abc123", is_decoder=True, load=spec),
    )
    data = json.loads(json.dumps(manifest.to_dict()))
    for name in load_field_names():  # the manifest's layout: model fields under "model", strategy beside it
        assert name in data["model"], name
    assert data["strategy"]["pooling"] == "last"
    back = Manifest.from_dict(data)
    assert back.model.load == spec and back.config == STRATEGY


def test_every_field_reaches_ray_workers():
    from lmembed.scale import EmbedderSpec

    spec = sample_spec()
    shipped = pickle.loads(pickle.dumps(EmbedderSpec(spec)))
    assert shipped.spec == spec
    driver = SimpleNamespace(load_spec=spec)
    bound = EmbedderSpec("/elsewhere/copy").bind(driver)  # only the source named: the rest is the driver's
    assert bound.spec == spec.with_source("/elsewhere/copy")


def test_every_field_reaches_an_export_and_the_server(tmp_path):
    from lmembed.embedder import _copy_export
    from lmembed.load_spec import STRATEGY_FILE
    from lmembed.serving.app import served_load_spec

    spec = sample_spec()
    graph = tmp_path / "graph"
    graph.mkdir()
    (graph / "model.onnx").write_bytes(b"not a real graph")
    exporter = SimpleNamespace(
        load_spec=spec,
        config=spec.config,
        backbone=SimpleNamespace(name="some-folder", is_decoder=True, tokenizer=SimpleNamespace(save_pretrained=str)),
        backend=SimpleNamespace(describe=lambda: {"backend": "onnx", "precision": "int8"}),
        _save_after_pooling=lambda directory: None,  # no head, no term channel
        _card=lambda name, **kinds: f"# {name}\n",
    )
    out = _copy_export(graph, tmp_path / "exported", exporter)
    meta = json.loads((out / STRATEGY_FILE).read_text())
    assert LoadSpec.from_dict(meta["load"]) == spec

    served = served_load_spec(spec)
    assert served["calibration"] == {"texts": 2}  # the operator's texts are counted, not shown
    served["calibration"] = list(spec.calibration)
    assert LoadSpec.from_dict(served) == spec


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("rope_scale", "2x", "model.rope_scale='2x' must be a number > 1 or null"),
        ("rope_scale", 1.0, "model.rope_scale=1.0 must be a number > 1"),
        ("calibration", "one text", "model.calibration must be a list of texts"),
        ("backend", "", "model.backend='' must be a non-empty string"),
        ("surprise", 1, "unknown field(s) model.surprise"),
    ],
)
def test_a_hand_edited_manifest_is_refused_naming_the_file_and_field(field, value, message):
    data = Manifest(
        params=IndexParams(kind="flat"),
        dim=16,
        count=0,
        model=ModelRecord(name="m", fingerprint="f", is_decoder=False, load=LoadSpec(source="minilm")),
    ).to_dict()
    data["model"][field] = value
    with pytest.raises((IndexFormatError, ConfigError)) as caught:
        Manifest.from_dict(data, "index/manifest.json")
    assert "index/manifest.json" in str(caught.value) and message in str(caught.value)


def test_an_embedder_reloads_from_its_own_spec(make_embedder, tmp_path):
    folder = tmp_path / "model"
    make_embedder("llama").save(folder)
    loaded = Embedder.from_pretrained(
        str(folder), pooling="last", layer=-2, dim=16, rope_scale=2.0, cache=False, show_progress=False
    )
    spec = loaded.load_spec
    assert spec.source == str(folder.resolve()) and spec.rope_scale == 2.0 and spec.config == loaded.config
    again = Embedder.from_spec(LoadSpec.from_dict(json.loads(spec.to_json())), cache=False, show_progress=False)
    assert again.load_spec == spec
    texts = ["the cat sat on the mat", "a model of language", "search"]
    assert np.array_equal(again.encode(texts), loaded.encode(texts))


def test_a_spec_of_a_model_built_in_memory_cannot_be_loaded(make_embedder):
    spec = make_embedder("llama").load_spec
    assert spec.source is None
    with pytest.raises(ConfigError, match="built in memory"):
        Embedder.from_spec(spec)
