"""Embedder API: config round-trip, bad input, save/load, cache behaviour."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from helpers import reseal
from lmembed import Embedder, EmbeddingConfig
from lmembed.config import ConfigError
from lmembed.encoding.cache import EmbeddingCache, clear_cache
from lmembed.encoding.inputs import InputError
from lmembed.models.loading import ModelLoadError

TEXTS = ["the cat sat on the mat", "a dog", "hello there friend"]


def test_config_json_round_trip():
    cfg = EmbeddingConfig(pooling="latent_attention", layer=(3, 4), attention="bidirectional", echo=True, dim=64)
    again = EmbeddingConfig.from_json(cfg.to_json())
    assert again == cfg and again.fingerprint() == cfg.fingerprint()
    assert cfg.label() == "latent_attention@[3,4]+bidir+echo+d64"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"pooling": "median"}, "pooling='median' is unknown"),
        ({"attention": "sideways"}, "attention='sideways'"),
        ({"layer": "mid"}, "must be an int"),
        ({"dim": 0}, "dim=0"),
        ({"colour": 1}, "unknown strategy option"),
    ],
)
def test_bad_options_name_the_argument(options, message):
    with pytest.raises((ConfigError, TypeError), match=message):
        EmbeddingConfig.from_dict(options)


def test_bad_inputs_get_clear_errors(make_embedder):
    emb = make_embedder("bert")
    with pytest.raises(InputError, match="not a single string"):
        emb.encode("just one string")
    with pytest.raises(InputError, match="is None"):
        emb.encode(None)
    with pytest.raises(InputError, match=r"texts\[1\] is int"):
        emb.encode(["ok", 3])
    with pytest.raises(InputError, match=r"texts\[0\] is NoneType"):
        emb.encode([None])
    with pytest.raises(InputError, match="texts must be a list of strings, got dict"):
        emb.encode({"a": 1})  # its keys were embedded
    with pytest.raises(InputError, match="the instruction must be a string, got int"):
        emb.encode_queries(["q"], instruction=5)  # an AttributeError inside the engine before
    for size in ("8", 1.5, True, 0):
        with pytest.raises(ConfigError, match=f"batch_size={size!r} must be an integer >= 1"):
            emb.encode(["a"], batch_size=size)
    empty = emb.encode([])
    assert empty.shape == (0, 32) and empty.dtype == np.float32
    blank = emb.encode(["", "   "])  # documented: embeds the special tokens only
    assert np.isfinite(blank).all()
    long = emb.encode(["cat " * 5000])  # over-long: truncated to max_length, not an error
    assert long.shape == (1, 32)


def test_empty_text_on_a_decoder_without_special_tokens(make_embedder):
    emb = make_embedder("llama", pooling="mean")
    vec = emb.encode([""])
    assert np.isfinite(vec).all() and vec.shape == (1, 32)


def test_unknown_model_lists_bundled_names():
    with pytest.raises(ModelLoadError, match="minilm, smollm2-135m, gemma3-270m"):
        Embedder.from_pretrained("no-such-model")


@pytest.mark.parametrize("pooling", ["mean", "latent_attention"])
def test_save_and_load_round_trip(make_embedder, tmp_path, pooling):
    emb = make_embedder("llama", pooling=pooling, attention="bidirectional", layer=(1, 2), dim=16)
    before = emb.encode(TEXTS)
    emb.save(tmp_path / "saved")
    again = Embedder.from_pretrained(str(tmp_path / "saved"), cache=False)
    assert again.config == emb.config
    np.testing.assert_allclose(again.encode(TEXTS), before, atol=1e-6)
    meta = json.loads((tmp_path / "saved" / "lmembed.json").read_text())
    assert meta["strategy"]["pooling"] == pooling
    assert (tmp_path / "saved" / "pooling_head.safetensors").exists() == (pooling == "latent_attention")
    # explicit options override the saved strategy
    assert Embedder.from_pretrained(str(tmp_path / "saved"), dim=8, cache=False).encode(TEXTS).shape == (3, 8)


@pytest.fixture
def saved_latent(make_embedder, tmp_path):
    """A folder an Embedder pooling with a (trained or not) latent-attention head was saved to."""
    emb = make_embedder("llama", pooling="latent_attention", attention="bidirectional")
    emb.save(tmp_path / "saved")
    return tmp_path / "saved"


def _rewrite_head(folder, change):
    from safetensors.torch import load_file, save_file

    weights = load_file(str(folder / "pooling_head.safetensors"))
    change(weights)
    save_file(weights, str(folder / "pooling_head.safetensors"))


def test_a_saved_latent_head_that_is_missing_or_not_its_own_is_refused(saved_latent, tmp_path):
    """Without its weights a latent-attention folder pooled with a head of random weights (vectors that changed
    with every load); a head file of another shape ended in torch's RuntimeError, one of NaN gave NaN vectors, one
    linked from outside the folder was read. Each change is caught by the folder's digests first; with its record
    made to match (a folder edited by hand), by the head's own checks."""
    head = saved_latent / "pooling_head.safetensors"
    original = head.read_bytes()
    head.unlink()
    with pytest.raises(ModelLoadError, match=r"pooling_head.safetensors: .*lmembed.json records it \(files.pooling_"):
        Embedder.from_pretrained(str(saved_latent), cache=False)
    reseal(saved_latent)
    with pytest.raises(ModelLoadError, match=r"lmembed.json: strategy.pooling is 'latent_attention', but the head's"):
        Embedder.from_pretrained(str(saved_latent), cache=False)
    outside = tmp_path / "elsewhere.safetensors"
    outside.write_bytes(original)
    head.symlink_to(outside)
    reseal(saved_latent)
    with pytest.raises(ModelLoadError, match=r"pooling_head.safetensors.*outside"):
        Embedder.from_pretrained(str(saved_latent), cache=False)
    head.unlink()
    head.write_bytes(original)
    reseal(saved_latent)
    _rewrite_head(saved_latent, lambda w: w.update({k: v[:-1] for k, v in list(w.items())[:1]}))
    with pytest.raises(ModelLoadError, match=r"pooling_head.safetensors: its sha256 is not the one .*lmembed.json"):
        Embedder.from_pretrained(str(saved_latent), cache=False)
    reseal(saved_latent)
    with pytest.raises(ModelLoadError, match=r"pooling_head.safetensors: tensor .* has shape .* the strategy's head"):
        Embedder.from_pretrained(str(saved_latent), cache=False)
    head.write_bytes(original)
    _rewrite_head(saved_latent, lambda w: next(iter(w.values())).view(-1).__setitem__(0, float("nan")))
    reseal(saved_latent)
    with pytest.raises(ModelLoadError, match=r"pooling_head.safetensors: tensor .* is not finite"):
        Embedder.from_pretrained(str(saved_latent), cache=False)
    head.write_bytes(original)
    reseal(saved_latent)
    assert Embedder.from_pretrained(str(saved_latent), cache=False).encode(TEXTS).shape[0] == len(TEXTS)


def test_a_latent_head_of_absurd_size_is_refused_before_anything_is_built(saved_latent):
    meta = json.loads((saved_latent / "lmembed.json").read_text())
    meta["strategy"]["latent"]["num_latents"] = 10**9  # 1.5 TB of latents at this width x 32 bits x heads
    (saved_latent / "lmembed.json").write_text(json.dumps(meta))
    match = r"lmembed.json: strategy: latent.num_latents=1000000000 must be a whole number from 1 to 65536"
    with pytest.raises(ModelLoadError, match=match):
        Embedder.from_pretrained(str(saved_latent), cache=False)
    meta["strategy"]["latent"]["num_latents"] = "many"
    (saved_latent / "lmembed.json").write_text(json.dumps(meta))
    with pytest.raises(ModelLoadError, match=r"lmembed.json: strategy: latent.num_latents='many'"):
        Embedder.from_pretrained(str(saved_latent), cache=False)


HOSTILE_SAVED = {
    "a list": ([1, 2], r"strategy: not an object"),
    "no strategy": ({"is_decoder": True}, r"strategy: not an object"),
    "strategy a string": ({"strategy": "mean"}, r"strategy: not an object"),
    "echo as text": ({"strategy": {"echo": "false"}}, r"strategy: echo='false' must be bool"),
    "lowercase as text": ({"strategy": {"lowercase": "false"}}, r"strategy: lowercase='false' must be bool"),
    "max_length as text": ({"strategy": {"max_length": "x"}}, r"strategy: max_length='x' must be int or None"),
    "max_length a fraction": ({"strategy": {"max_length": 8.5}}, r"strategy: max_length=8.5 must be int"),
    "max_length of a trillion": (
        {"strategy": {"max_length": 10**12}},
        r"strategy: max_length=1000000000000 must be from 8",
    ),
    "dim a fraction": ({"strategy": {"dim": 3.5}}, r"strategy: dim=3.5 must be int or None"),
    "final_norm as text": ({"strategy": {"final_norm": "x"}}, r"strategy: final_norm='x' must be bool or None"),
    "echo_template a number": ({"strategy": {"echo_template": 5}}, r"strategy: echo_template=5 must be str"),
    "latent with an unknown key": ({"strategy": {"latent": {"width": 3}}}, r"strategy: .*width"),
}


@pytest.mark.parametrize("case", HOSTILE_SAVED)
def test_a_saved_strategy_of_another_shape_is_refused_naming_the_file_and_option(make_embedder, tmp_path, case):
    """Each ended in an internal error (AttributeError, TypeError) or was believed: "false" turned echo on."""
    make_embedder("llama").save(tmp_path / "saved")
    meta = json.loads((tmp_path / "saved" / "lmembed.json").read_text())
    document, said = HOSTILE_SAVED[case]
    if isinstance(document, dict) and isinstance(document.get("strategy"), dict):
        document = {**meta, "strategy": {**meta["strategy"], **document["strategy"]}}
    (tmp_path / "saved" / "lmembed.json").write_text(json.dumps(document))
    with pytest.raises(ModelLoadError, match=rf"lmembed.json: {said}"):
        Embedder.from_pretrained(str(tmp_path / "saved"), cache=False)


def test_repeated_encode_is_served_from_cache(make_embedder, tmp_path, monkeypatch):
    emb = make_embedder("bert")
    emb.engine.use_cache, emb.engine.cache_dir = True, tmp_path
    first = emb.encode(TEXTS)
    calls = []
    original = emb.backbone.model.forward
    monkeypatch.setattr(emb.backbone.model, "forward", lambda *a, **k: calls.append(1) or original(*a, **k))
    second = emb.encode(TEXTS)
    np.testing.assert_array_equal(first, second)
    assert calls == []
    emb.encode([*TEXTS, "one new text"])
    assert len(calls) == 1  # only the new text is computed
    # a different strategy or output dim: dim/normalize share the raw cache, pooling does not
    emb.with_config(emb.config.with_options(dim=8)).encode(TEXTS)
    assert len(calls) == 1
    emb.with_config(emb.config.with_options(pooling="cls")).encode(TEXTS)
    assert len(calls) == 2
    assert clear_cache(tmp_path) >= 3
    emb.encode(TEXTS)
    assert len(calls) == 3


def test_clearing_the_cache_removes_its_entries_and_nothing_else(make_embedder, tmp_path):
    """``lmembed cache clear --directory DIR`` removed DIR whole, whatever it held (a wrong LMEMBED_CACHE would
    empty whatever folder it named)."""
    from typer.testing import CliRunner

    from lmembed.cli.app import app
    from lmembed.encoding.cache import cache_size

    emb = make_embedder("bert")
    emb.engine.use_cache, emb.engine.cache_dir = True, tmp_path
    emb.encode(TEXTS)
    (tmp_path / "precious.txt").write_text("keep me")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.npz").write_bytes(b"mine")
    shards, size = cache_size(tmp_path)
    assert shards == 1 and size > 0  # the cache's own shard; not notes/a.npz
    result = CliRunner().invoke(app, ["cache", "clear", "--directory", str(tmp_path)])
    assert result.exit_code == 0 and "removed 1 cache shard(s)" in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes", "precious.txt"]
    assert (tmp_path / "notes" / "a.npz").read_bytes() == b"mine" and cache_size(tmp_path) == (0, 0)
    for command in ("clear", "info"):
        refused = CliRunner().invoke(app, ["cache", command, "--directory", str(tmp_path / "precious.txt")])
        assert refused.exit_code == 2 and "precious.txt: not a folder" in refused.output, refused.output
    assert (tmp_path / "precious.txt").read_text() == "keep me"


@pytest.mark.parametrize("pipelined", [False, True])
def test_a_model_that_gives_nan_is_refused_and_nothing_is_cached(make_embedder, tmp_path, pipelined):
    """A model trained with lr=inf (NaN weights) encoded to NaN vectors with exit 0; an index of them searched to
    nothing."""
    import torch

    from lmembed.encoding.cache import cache_size
    from lmembed.encoding.engine import NonFiniteVectorsError

    emb = make_embedder("bert")
    emb.engine.use_cache, emb.engine.cache_dir, emb.engine.pipelined = True, tmp_path, pipelined
    with torch.no_grad():
        next(emb.backbone.model.parameters()).fill_(float("nan"))
    with pytest.raises(NonFiniteVectorsError, match=r"NaN or infinite values .*for 3 of a batch's 3 texts"):
        emb.encode(TEXTS)
    assert cache_size(tmp_path) == (0, 0)


def test_vectors_too_long_for_float32_are_refused_like_nan():
    """A latent head with finite weights of 1e30 gave finite vectors whose length overflowed float32: normalised,
    each came out all zeros, with exit 0."""
    from lmembed.encoding.engine import NonFiniteVectorsError, _add_rows

    huge = np.full((3, 32), 1e38, dtype=np.float32)  # every value finite; the length is not
    assert np.isfinite(huge).all()
    with pytest.raises(NonFiniteVectorsError, match=r"too long for float32\) for 3 of a batch's 3 texts"):
        _add_rows([], [huge], [0, 1, 2])
    _add_rows([], [np.ones((3, 32), dtype=np.float32)], [0, 1, 2])  # ordinary vectors pass


def _npz(path, **members: bytes) -> None:
    """An .npz whose members are written byte for byte (headers that lie included)."""
    import zipfile

    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(f"{name}.npy", data)


def _npy(array, shape=None) -> bytes:
    """``array`` as .npy bytes, its header claiming ``shape`` when given."""
    import io

    buffer = io.BytesIO()
    header = np.lib.format.header_data_from_array_1_0(array)
    if shape is not None:
        header["shape"] = shape
    np.lib.format.write_array_header_1_0(buffer, header)
    buffer.write(array.tobytes())
    return buffer.getvalue()


SHARD_DAMAGE = {
    "one column": lambda keys, vectors, path: np.savez(path, keys=keys, vectors=vectors[:, :1]),
    "one row each": lambda keys, vectors, path: np.savez(path, keys=keys, vectors=vectors[:, 0]),
    "whole numbers": lambda keys, vectors, path: np.savez(path, keys=keys, vectors=vectors.astype(np.int64)),
    "NaN": lambda keys, vectors, path: np.savez(path, keys=keys, vectors=np.full_like(vectors, np.nan)),
    "fewer vectors than keys": lambda keys, vectors, path: np.savez(path, keys=keys, vectors=vectors[:-1]),
    "no vectors": lambda keys, vectors, path: np.savez(path, keys=keys),
    "Python objects": lambda keys, vectors, path: np.savez(path, keys=keys, vectors=vectors.astype(object)),
    "truncated": lambda keys, vectors, path: path.write_bytes(path.read_bytes()[:100]),
    "empty": lambda keys, vectors, path: path.write_bytes(b""),
    # a few KiB on disk, far more once read (a probe's took 1 GiB from 1 MiB): a compressed member's size is the
    # archive's word, not the file's bytes
    "compressed": lambda keys, vectors, path: np.savez_compressed(
        path, keys=np.zeros((2**16, 16), np.uint8), vectors=np.zeros((2**16, vectors.shape[1]), np.float32)
    ),
    "a header of a terabyte": lambda keys, vectors, path: _npz(
        path, keys=_npy(keys), vectors=_npy(vectors, shape=(10**9, vectors.shape[1]))
    ),
}


@pytest.mark.parametrize("damage", SHARD_DAMAGE)
def test_a_damaged_cache_shard_is_skipped_aloud_and_its_texts_encoded_again(make_embedder, tmp_path, caplog, damage):
    """Each ended in an internal error (BadZipFile, EOFError, KeyError, a broadcast ValueError, MemoryError for the
    terabyte), or was served: one column broadcast over every dimension, integers cast, NaN vectors."""
    emb = make_embedder("bert")
    emb.engine.use_cache, emb.engine.cache_dir = True, tmp_path
    expected = emb.encode(TEXTS)
    (shard,) = tmp_path.rglob("*.npz")
    with np.load(shard) as data:
        keys, vectors = data["keys"], data["vectors"]
    SHARD_DAMAGE[damage](keys, vectors, shard)  # written over it
    fresh = make_embedder("bert")  # a new process: nothing of the cache in memory
    fresh.engine.use_cache, fresh.engine.cache_dir = True, tmp_path
    with caplog.at_level("WARNING", logger="lmembed.encoding.cache"):
        np.testing.assert_allclose(fresh.encode(TEXTS), expected, atol=1e-6)
    (said,) = [r.getMessage() for r in caplog.records]
    assert said.startswith(f"skipping {shard}: ") and "its texts are encoded again" in said, said
    assert f"`lmembed cache clear --damaged --directory {tmp_path}` removes such shards" in said


@pytest.mark.parametrize("damage", ["NaN", "truncated", "a header of a terabyte", "one column"])
def test_cache_clear_damaged_removes_the_shards_every_run_skips_and_keeps_the_rest(
    make_embedder, tmp_path, caplog, damage
):
    """A damaged shard was skipped with a warning on every run and never removed; ``cache clear --damaged`` removes
    it (and only it: the shard written when its texts were encoded again stays), and the next run is quiet."""
    from typer.testing import CliRunner

    from lmembed.cli.app import app

    emb = make_embedder("bert")
    emb.engine.use_cache, emb.engine.cache_dir = True, tmp_path
    for text in TEXTS:  # three shards: a one-column shard is told by the width of most of its neighbours
        emb.encode([text])
    first = min(tmp_path.rglob("*.npz"), key=lambda p: p.stat().st_mtime_ns)
    with np.load(first) as data:
        keys, vectors = data["keys"], data["vectors"]
    SHARD_DAMAGE[damage](keys, vectors, first)
    healthy = sorted(set(tmp_path.rglob("*.npz")) - {first})
    result = CliRunner().invoke(app, ["cache", "clear", "--damaged", "--directory", str(tmp_path)])
    assert result.exit_code == 0 and "removed 1 damaged cache shard(s)" in result.output, result.output
    assert first.name in result.output.replace("\n", "")
    assert sorted(tmp_path.rglob("*.npz")) == healthy
    fresh = make_embedder("bert")
    fresh.engine.use_cache, fresh.engine.cache_dir = True, tmp_path
    with caplog.at_level("WARNING", logger="lmembed.encoding.cache"):
        fresh.encode(TEXTS)
    assert not caplog.records


def test_a_cache_shard_linked_from_elsewhere_is_not_read(make_embedder, tmp_path, caplog):
    emb = make_embedder("bert")
    emb.engine.use_cache, emb.engine.cache_dir = True, tmp_path / "cache"
    expected = emb.encode(TEXTS)
    (shard,) = (tmp_path / "cache").rglob("*.npz")
    with np.load(shard) as data:
        np.savez(tmp_path / "zeros.npz", keys=data["keys"], vectors=np.zeros_like(data["vectors"]))
    shard.unlink()
    shard.symlink_to(tmp_path / "zeros.npz")  # it served all-zero rows
    fresh = make_embedder("bert")
    fresh.engine.use_cache, fresh.engine.cache_dir = True, tmp_path / "cache"
    with caplog.at_level("WARNING", logger="lmembed.encoding.cache"):
        np.testing.assert_allclose(fresh.encode(TEXTS), expected, atol=1e-6)
    assert "a link; a cache shard is a plain file" in caplog.records[0].getMessage()


def test_a_cache_shard_moved_into_another_strategys_folder_is_not_served(make_embedder, tmp_path, caplog):
    """A shard is a valid file wherever it lies: copied from the mean-pooled folder into the CLS-pooled one (same
    width), it was served as CLS vectors. It records the folder it was written for, and a shard without one (an
    earlier lmembed's) is encoded again too."""
    mean = make_embedder("bert", pooling="mean")
    mean.engine.use_cache, mean.engine.cache_dir = True, tmp_path
    mean.encode(TEXTS)
    (mean_shard,) = tmp_path.rglob("*.npz")
    with np.load(mean_shard) as data:
        assert data["owner"].tobytes() == f"{mean_shard.parent.parent.name}/{mean_shard.parent.name}".encode()
    cls = make_embedder("bert", pooling="cls")
    expected = cls.encode(TEXTS)  # uncached: the true CLS vectors
    cls.engine.use_cache, cls.engine.cache_dir = True, tmp_path
    cls.encode(["something else"])  # makes the CLS folder
    (cls_folder,) = {p.parent for p in tmp_path.rglob("*.npz")} - {mean_shard.parent}
    copied = cls_folder / "copied.npz"
    copied.write_bytes(mean_shard.read_bytes())
    fresh = make_embedder("bert", pooling="cls")
    fresh.engine.use_cache, fresh.engine.cache_dir = True, tmp_path
    with caplog.at_level("WARNING", logger="lmembed.encoding.cache"):
        np.testing.assert_allclose(fresh.encode(TEXTS), expected, atol=1e-6)
    (said,) = [r.getMessage() for r in caplog.records]
    assert said.startswith(f"skipping {copied}: owner is ") and "written for another folder" in said, said

    with np.load(mean_shard) as data:  # as an earlier lmembed wrote it: keys and vectors, no owner
        np.savez(mean_shard, keys=data["keys"], vectors=data["vectors"])
    caplog.clear()
    again = make_embedder("bert", pooling="mean")
    again.engine.use_cache, again.engine.cache_dir = True, tmp_path
    with caplog.at_level("WARNING", logger="lmembed.encoding.cache"):
        again.encode(TEXTS)
    assert any(f"{mean_shard}: no owner" in r.getMessage() for r in caplog.records), caplog.records


def test_cache_instruction_is_part_of_the_key(make_embedder, tmp_path):
    emb = make_embedder("llama")
    emb.engine.use_cache, emb.engine.cache_dir = True, tmp_path
    plain = emb.encode(TEXTS)
    inst = emb.encode_queries(TEXTS, instruction="find the cat")
    assert not np.allclose(plain, inst)
    np.testing.assert_array_equal(emb.encode_queries(TEXTS, instruction="find the cat"), inst)


WRITER = """
import sys, numpy as np
from pathlib import Path
from lmembed.encoding.cache import EmbeddingCache, text_key
cache = EmbeddingCache(Path(sys.argv[1]), "model", "strategy")
i = 0
while True:
    keys = [text_key(f"text {i} {j}") for j in range(20000)]
    cache.store(keys, np.full((20000, 256), float(i), dtype=np.float32))
    i += 1
    print(i, flush=True)
"""


def test_killed_writer_leaves_no_corrupt_entry(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    proc.stdout.readline()  # at least one shard is complete
    time.sleep(0.15)  # now it is most likely in the middle of the next write
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    cache = EmbeddingCache(tmp_path, "model", "strategy")
    assert len(cache) % 20000 == 0 and len(cache) >= 20000  # whole shards only
    found, missing = cache.lookup(list(cache._load())[::5000])
    assert found and not missing
    for vector in found:
        assert np.all(vector == vector[0])


def test_repeated_texts_get_identical_vectors(make_embedder, monkeypatch):
    """Duplicates are computed once (and so are bit-identical, whatever the batch padding)."""
    emb = make_embedder("llama", pooling="mean")
    texts = [
        "the cat sat on the mat",
        "a much longer text that forces padding of the first one",
        "the cat sat on the mat",
    ]
    seen = []
    original = emb.engine.forward_pool
    monkeypatch.setattr(
        emb.engine, "forward_pool", lambda ids, *a, **k: seen.append(ids.shape[0]) or original(ids, *a, **k)
    )
    vecs = emb.encode(texts, batch_size=1)
    assert np.array_equal(vecs[0], vecs[2])
    assert sum(seen) == 2


def test_dim_larger_than_the_model_is_refused(make_embedder, tmp_path):
    """A dim above the hidden size used to be accepted, with full-size vectors labelled with the dim."""
    with pytest.raises(ConfigError, match=r"dim=64 is larger than the model's hidden size \(32\)"):
        make_embedder("llama", dim=64)
    emb = make_embedder("llama", dim=32)  # equal is fine
    assert emb.encode(TEXTS).shape == (3, 32)
    with pytest.raises(ConfigError, match=r"dim=33 .* \(32\)"):
        emb.with_config(emb.config.with_options(dim=33))
    with pytest.raises(ConfigError, match=r"dim=48 .* \(32\)"):
        emb.encode_strategies(TEXTS, [emb.config.with_options(dim=48)])
    emb.save(tmp_path / "saved")
    with pytest.raises(ConfigError, match=r"dim=40 .* \(32\)"):
        Embedder.from_pretrained(str(tmp_path / "saved"), dim=40, cache=False)


@pytest.mark.parametrize("cache", [False, True])
def test_lone_surrogate_names_the_input(make_embedder, tmp_path, cache):
    emb = make_embedder("bert")
    emb.engine.use_cache, emb.engine.cache_dir = cache, tmp_path
    texts = ["fine", "also fine", "caf\u00e9 is fine too", "bad \udc80 byte"]
    with pytest.raises(InputError, match=r"input 3: text contains a lone surrogate \('\\udc80' at character 4\)"):
        emb.encode(texts)
    with pytest.raises(ValueError, match="input 3"):  # still a ValueError for existing handlers
        emb.encode(texts)
    with pytest.raises(InputError, match="the instruction contains a lone surrogate"):
        emb.encode_queries(TEXTS, instruction="find \ud800 this")
    assert emb.encode(texts[:3]).shape == (3, 32)


def test_user_facing_errors_share_one_base():
    from lmembed.errors import LmembedError
    from lmembed.models.attention import AttentionError
    from lmembed.models.bundled import BundledModelMissing
    from lmembed.pooling.layers import LayerSelectionError

    for error in (ConfigError, InputError, ModelLoadError, AttentionError, BundledModelMissing, LayerSelectionError):
        assert issubclass(error, LmembedError)
    assert issubclass(ConfigError, ValueError) and issubclass(ModelLoadError, ValueError)
    assert issubclass(InputError, ValueError) and issubclass(LayerSelectionError, IndexError)


def test_a_layer_the_model_lacks_is_refused_when_the_strategy_is_set(make_embedder):
    """It was found at the first encode: ``lmembed doctor --layer 99`` loaded the model and ran its checks on it,
    failing two of them (exit 1) where ``encode`` refused the value (exit 2)."""
    from lmembed.pooling.layers import LayerSelectionError

    emb = make_embedder("bert")
    with pytest.raises(LayerSelectionError, match="layer 99 is out of range for a model with"):
        emb.with_config(emb.config.with_options(layer=99))
    with pytest.raises(LayerSelectionError, match="layer -99 is out of range"):
        make_embedder("llama", layer=(1, -99))


@pytest.mark.parametrize(
    ("family", "options", "message"),
    [
        ("bert", {"attention": "causal"}, r"attention='causal': .* is an encoder"),
        ("bert", {"max_length": 4096}, r"max_length=4096: .* has \d+ positions"),
        ("bert", {"final_norm": True}, r"final_norm=True: .* has no final norm"),
        ("bert", {"quantize": "int8", "precision": "float32"}, "ask for two precisions"),
        ("bert", {"threads": 1}, r"threads=1 sets ONNX Runtime's threads"),
    ],
)
def test_an_option_the_model_cannot_take_is_refused_not_dropped(make_embedder, tmp_path, family, options, message):
    """Each was accepted and changed nothing (attention recorded as bidirectional, the length cut to the
    positions, the norm skipped, float32 run, torch's threads kept), the option still shown as given."""
    from lmembed.encoding.backends import BackendError

    folder = make_embedder(family).save(tmp_path / family)
    with pytest.raises((ConfigError, BackendError), match=message):
        Embedder.from_pretrained(str(folder), cache=False, show_progress=False, **options)


def test_an_instruction_and_a_prompt_name_together_are_refused(make_embedder):
    with pytest.raises(ConfigError, match="both set the text before each input"):
        make_embedder("bert").encode(["a"], instruction="Find", prompt_name="query")


def test_a_refused_option_is_not_first_said_to_override_the_model_own(caplog):
    """``pooling="bogus"`` on minilm was a warning that it overrides the folder's mean pooling, then the refusal."""
    with caplog.at_level("WARNING"), pytest.raises(ConfigError, match="pooling='bogus' is unknown"):
        Embedder.from_pretrained("minilm", pooling="bogus", cache=False, show_progress=False)
    assert not [r.getMessage() for r in caplog.records if "overrides" in r.getMessage()]
    with caplog.at_level("WARNING"):
        Embedder.from_pretrained("minilm", pooling="cls", cache=False, show_progress=False)
    assert [r.getMessage() for r in caplog.records if "overrides" in r.getMessage()]


def test_measuring_speed_and_the_doctor_leave_the_shared_engines_cache_on(make_embedder, tmp_path, monkeypatch):
    """Both switched the cache of the engine an Embedder shares with its ``with_config`` siblings off for their run:
    a sibling encoding meanwhile (another thread, a server) ran uncached, and one that ended between the two
    assignments could leave it off. They now use an engine of their own without a cache."""
    from lmembed.encoding.engine import EncodingEngine
    from lmembed.evaluation.doctor import run_checks

    emb = make_embedder("bert")
    emb.engine.use_cache, emb.engine.cache_dir = True, tmp_path
    sibling = emb.with_config(emb.config.with_options(pooling="cls"))
    seen = []
    real = EncodingEngine.encode_raw
    monkeypatch.setattr(
        EncodingEngine,
        "encode_raw",
        lambda self, *a, **k: (seen.append(sibling.engine.use_cache), real(self, *a, **k))[1],
    )
    assert sibling.texts_per_second(TEXTS) > 0
    checks = run_checks(sibling, TEXTS)
    assert seen and all(seen) and sibling.engine.use_cache
    assert not list(tmp_path.rglob("*.npz"))  # and neither cached what it computed
    assert {c.name for c in checks} >= {"attention", "padding"}


def test_the_cache_keeps_keys_in_memory_and_reads_rows_from_its_shards(tmp_path, caplog):
    """Its index held every vector it had computed (as much again as the vectors a long run builds); it now holds
    each key's shard and row, and reads the rows a lookup finds, one by one or the shard whole."""
    from lmembed.encoding.cache import EmbeddingCache, text_key

    rng = np.random.default_rng(0)
    cache = EmbeddingCache(tmp_path, "model", "strategy", width=24)
    assert len(cache) == 0  # read (empty): what is stored from now on is indexed as written
    texts = [f"text {i}" for i in range(300)]
    vectors = rng.standard_normal((300, 24)).astype(np.float32)
    for start in (0, 100, 200):
        cache.store([text_key(t) for t in texts[start : start + 100]], vectors[start : start + 100])
    assert all(isinstance(place, tuple) for place in cache._index.values())
    for picked in ([5], [3, 150, 299, 7], list(range(0, 300, 2)), []):  # a few rows, or most of each shard
        for reader in (cache, EmbeddingCache(tmp_path, "model", "strategy", width=24)):  # written here, or read
            found, missing = reader.lookup([text_key(texts[i]) for i in picked] + [text_key("never stored")])
            assert missing == [len(picked)]
            assert np.array_equal(np.array(found[:-1]).reshape(-1, 24), vectors[picked])

    # a shard rewritten after its keys were read (same size, other bytes) is not served: read again, with its checks
    # (the archive's CRC then finds the changed bytes)
    shard = next(s for s in cache._shards if s is not None)
    first = shard.path
    data = bytearray(first.read_bytes())
    data[shard.offset : shard.offset + 4] = np.float32(np.nan).tobytes()
    time.sleep(0.01)
    first.write_bytes(bytes(data))
    with caplog.at_level("WARNING", logger="lmembed.encoding.cache"):
        found, missing = cache.lookup([text_key(t) for t in texts])
        assert len(missing) == 100  # not served from the changed file ...
        again, missing_again = cache.lookup([text_key(t) for t in texts])
    assert missing_again == missing  # ... and, read again whole, skipped for what it now holds
    said = [r.getMessage() for r in caplog.records]
    assert said[0] == f"not serving {first}: changed since its keys were read; its texts are encoded again", said
    assert said[1].startswith(f"skipping {first}: not a readable cache shard (Bad CRC-32"), said
    served = [i for i in range(300) if i not in missing]
    assert np.array_equal(np.array([again[i] for i in served]), vectors[served])


@pytest.mark.bundled
def test_torch_int8_on_minilm_warns_with_its_gap():
    """minilm in torch's dynamic int8 drifts past the int8 gate (min cosine about 0.96): said at load, as ONNX's
    int8 says it, not served in silence."""
    from conftest import bundled_or_skip

    bundled_or_skip("minilm")
    with pytest.warns(UserWarning, match=r"torch int8 quality gate failed for .*: min cosine 0\.9\d+ < 0\.99"):
        emb = Embedder.from_pretrained("minilm", backend="torch", precision="int8", cache=False, show_progress=False)
    (report,) = emb.backend.quality.values()
    assert not report.passed and report.texts == 32


def test_an_embedder_pickles_as_how_to_load_it_and_refuses_another_model(make_embedder, tmp_path):
    """It did not pickle at all (transformers' hooks are local functions), so a process pool could not take one. It
    pickles as its load spec and identity (about a kilobyte), loads again from its source, and is refused when the
    model was changed in memory after loading; one built in memory says how to send it instead."""
    import pickle

    import torch

    from lmembed.errors import ModelLoadError

    built = make_embedder("bert")
    with pytest.raises(TypeError, match="an Embedder of a model built in memory is not pickled"):
        pickle.dumps(built)
    loaded = Embedder.from_pretrained(str(built.save(tmp_path / "m")), cache=False, show_progress=False)
    data = pickle.dumps(loaded)
    assert len(data) < 10_000
    again = pickle.loads(data)
    assert np.array_equal(again.encode(TEXTS), loaded.encode(TEXTS)) and again.config == loaded.config
    with torch.no_grad():
        next(loaded.backbone.model.parameters()).add_(0.5)
    changed = pickle.dumps(loaded)
    with pytest.raises(ModelLoadError, match="the model loaded from there is not the one that was pickled"):
        pickle.loads(changed)
    pytest.importorskip("onnxruntime")
    int8 = Embedder.from_pretrained(str(tmp_path / "m"), backend="onnx", precision="int8", cache=False)
    with pytest.raises(TypeError, match="an int8 Embedder is pickled once calibrated"):
        pickle.dumps(int8)


def test_the_cache_serves_no_row_of_a_shard_rewritten_in_place_with_its_time_restored(tmp_path, caplog):
    """A shard rewritten in place (same size, the same texts in another order) with its modification time set back
    was served its old row map: 40 of 40 wrong vectors. The status-change time, which cannot be set back, is
    compared too, on the file opened."""
    import os

    from lmembed.encoding.cache import EmbeddingCache, key_array, text_key

    rng = np.random.default_rng(1)
    keys = [text_key(f"text {i}") for i in range(40)]
    vectors = rng.standard_normal((40, 8)).astype(np.float32)
    cache = EmbeddingCache(tmp_path, "model", "strategy", width=8)
    path = cache.store_shard("job-0", key_array(keys), vectors)
    assert len(cache) == 40
    before = path.stat()
    data = bytearray(path.read_bytes())
    shard = next(s for s in cache._shards if s is not None)
    data[shard.offset : shard.offset + 40 * 32] = vectors[::-1].tobytes()  # rows reversed, same size
    path.write_bytes(bytes(data))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    with caplog.at_level("WARNING", logger="lmembed.encoding.cache"):
        found, missing = cache.lookup(keys)
    assert missing == list(range(40))
    assert "changed since its keys were read" in caplog.records[0].getMessage()

    caplog.clear()  # a named shard this cache writes again is read anew, without a word
    cache.store_shard("job-0", key_array(keys), vectors)
    with caplog.at_level("WARNING", logger="lmembed.encoding.cache"):
        found, missing = cache.lookup(keys)
    assert not missing and np.array_equal(np.array(found), vectors) and not caplog.records

    import shutil  # the folder removed under a writer (`cache clear` elsewhere): written again, nothing raised

    shutil.rmtree(tmp_path / "model")
    cache.store([text_key("late")], vectors[:1])
    assert len(list((tmp_path / "model" / "strategy").glob("*.npz"))) == 1
