"""The Python API given mistaken arguments: each is refused by an lmembed error naming the argument, before any
work, instead of an internal error deep in torch, numpy or string formatting, or a silently wrong result (a table
read as its column names, a generator read empty, a string fitted character by character)."""

from __future__ import annotations

import numpy as np
import pytest

from lmembed import Embedder, EmbeddingConfig
from lmembed.encoding.backends.base import BackendError
from lmembed.encoding.chunking import Chunking
from lmembed.errors import ConfigError, InputError, ModelLoadError
from lmembed.models.loading import resolve_device

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def emb(tokenizer):
    from conftest import tiny_model

    return Embedder.from_model(tiny_model("bert", len(tokenizer)), tokenizer, use_cache=False)


def test_a_table_is_refused_and_one_column_embeds(emb):
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame({"text": ["the cat", "a dog", "protein"]})
    with pytest.raises(InputError, match=r"2-dimensional DataFrame; pass one column"):
        emb.encode(frame)  # iterating it gives its column names: one vector for 'text'
    np.testing.assert_array_equal(emb.encode(frame["text"]), emb.encode(["the cat", "a dog", "protein"]))
    with pytest.raises(InputError, match="2-dimensional"):
        emb.encode(np.array([["a", "b"], ["c", "d"]]))


def test_strategies_are_read_once_and_checked(emb):
    config = emb.config
    from_generator = emb.encode_strategies(["the cat"], (c for c in [config, config.with_options(pooling="cls")]))
    assert len(from_generator) == 2  # a generator was read empty after the checks
    with pytest.raises(ConfigError, match="configs is empty"):
        emb.encode_strategies(["the cat"], [])
    with pytest.raises(ConfigError, match=r"configs\[0\] is dict"):
        emb.encode_strategies(["the cat"], [{"pooling": "cls"}])
    with pytest.raises(ConfigError, match="config is dict; expected an EmbeddingConfig"):
        emb.with_config({"pooling": "cls"})


def test_with_config_refuses_what_from_pretrained_refuses(emb):
    """An encoder has no final norm and 64 positions here: said, not ignored under a label that claims it."""
    with pytest.raises(ConfigError, match=r"final_norm=True: .* has no final norm"):
        emb.with_config(emb.config.with_options(final_norm=True))
    with pytest.raises(ConfigError, match=r"max_length=10000: .* positions"):
        emb.with_config(emb.config.with_options(max_length=10000))
    causal = emb.with_config(emb.config.with_options(attention="causal", pooling="cls"))
    assert causal.config.attention == "bidirectional" and "+bidir" in causal.config.label()  # what it does


def test_fit_terms_takes_a_list_of_documents(emb):
    with pytest.raises(InputError, match="documents must be a list of strings, not a single string"):
        emb.fit_terms("insulin regulates glucose")
    with pytest.raises(InputError, match="documents is empty"):
        emb.fit_terms([])
    assert emb.fit_terms(d for d in ["the cat sat", "a dog ran"]).config.terms is not None


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ({"echo_template": "{foo} {text}"}, "echo_template='{foo} {text}' names 'foo'; only {text} is filled"),
        ({"echo_template": "{0}{text}"}, "names '0'"),
        ({"instruction_template": "{instruction} {"}, "Single '{' encountered"),
        ({"latent": "abc"}, "latent='abc' must be an object"),
    ],
)
def test_a_template_or_latent_that_would_fail_at_the_first_text_is_refused_when_built(options, said):
    with pytest.raises(ConfigError) as caught:
        EmbeddingConfig(**options)
    assert said in str(caught.value)


@pytest.mark.parametrize(
    ("call", "said"),
    [
        (lambda: EmbeddingConfig.from_dict("pooling"), "a strategy is an object of options by name, not str"),
        (lambda: EmbeddingConfig.from_dict(None), "not NoneType"),
        (lambda: EmbeddingConfig.from_dict({1: 2}), "not dict"),
        (lambda: EmbeddingConfig.from_json("{bad"), "the strategy is not valid JSON"),
        (lambda: EmbeddingConfig.from_json('{"pooling": "cls", "pooling": "mean"}'), "given twice"),
        (lambda: EmbeddingConfig.from_json(None), "a strategy in JSON is text"),
        (lambda: EmbeddingConfig().with_options(colour=1), "unknown strategy option"),
        (lambda: Chunking(tokens=2.5), "chunk tokens=2.5 must be a whole number"),
        (lambda: Chunking(late="yes"), "chunk late='yes'"),
    ],
)
def test_a_strategy_of_the_wrong_shape_is_a_config_error(call, said):
    with pytest.raises(ConfigError, match=said.replace("(", r"\(")):
        call()


def test_runtime_arguments_are_checked_where_they_are_given(emb, tokenizer, tmp_path):
    from conftest import tiny_model

    model = tiny_model("bert", len(tokenizer))
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(ConfigError, match=r"cache_dir=.* is a file"):
        Embedder.from_model(model, tokenizer, cache_dir=afile)
    for bad in (0, -5, 2.5, "x", True):
        with pytest.raises(ConfigError, match="max_batch_tokens="):
            Embedder.from_model(model, tokenizer, use_cache=False, max_batch_tokens=bad)
    for bad in ("2", 2.5, -1, 0, 10**6, True):
        with pytest.raises(BackendError, match="threads="):
            Embedder.from_model(model, tokenizer, use_cache=False, backend="torch", threads=bad)
    with pytest.raises(ConfigError, match="chunking='maxp' must be a Chunking"):
        emb.encode_corpus(["the cat"], chunking="maxp")
    for device, said in (("mps", "no usable Apple GPU"), (None, "not a device name"), ("xpu", "runs on cpu, cuda")):
        with pytest.raises(ModelLoadError, match=said):
            resolve_device(device)


@pytest.mark.parametrize("bad", [123, None, "", "   "])
def test_a_model_name_that_is_not_a_string_is_refused_as_lmembeds_error(bad):
    """``from_pretrained(123)`` raised a TypeError from deep in the loader, outside lmembed's errors."""
    from lmembed.errors import LmembedError

    with pytest.raises(LmembedError, match="name_or_path="):
        Embedder.from_pretrained(bad)
