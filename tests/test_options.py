"""The option objects: frozen, built once, and complete for what they feed (Embedder.from_pretrained, engines)."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from lmembed.errors import ConfigError
from lmembed.options import EngineOptions, ModelOptions


@pytest.mark.parametrize("options", [ModelOptions(), EngineOptions()])
def test_options_are_frozen(options):
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.device = "cuda"  # type: ignore[misc]


def test_layer_text_is_parsed_once():
    assert ModelOptions(layer="15,16").layer == (15, 16)
    assert ModelOptions(layer="-2").layer == -2
    assert ModelOptions(layer=(3, 4)).layer == (3, 4)
    with pytest.raises(ConfigError, match="comma list"):
        ModelOptions(layer="x")


def test_every_model_option_reaches_from_pretrained():
    from lmembed.embedder import Embedder

    accepted = set(inspect.signature(Embedder.from_pretrained).parameters)
    loading = ModelOptions(precision="int8", no_cache=True).loading()
    assert set(loading) <= accepted
    assert (loading["cache"], loading["precision"]) == (False, "int8")
    assert ModelOptions().loading()["precision"] is None  # float32: the library's default


def test_engine_options_feed_the_ray_engine_whole():
    ray_settings = EngineOptions(engine="ray", workers=2).ray()
    assert "engine" not in ray_settings
    assert set(ray_settings) == {f.name for f in dataclasses.fields(EngineOptions)} - {"engine"}
