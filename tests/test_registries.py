"""Each list of names derives from its registry, and docs/architecture.md's where-to-add table is true: a toy
pooling, loss, reranker kind and backend name are each added by touching only the places the table names (here by
monkeypatching those registries), and the rest of lmembed accepts them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from lmembed import config, task_registry
from lmembed.cli import export as export_cli
from lmembed.cli import options as cli_options
from lmembed.config import EmbeddingConfig
from lmembed.encoding import backends
from lmembed.errors import ConfigError
from lmembed.evaluation import instructions
from lmembed.evaluation import tasks as task_types
from lmembed.models import presets
from lmembed.models import sentence_transformers_folder as st_folder
from lmembed.pooling import poolers
from lmembed.rerank import loading as rerank_loading
from lmembed.rerank.base import RERANKER_FILE
from lmembed.training import losses, train_config
from lmembed.training import reranker as training_reranker

pytestmark = pytest.mark.usefixtures("one_torch_thread")


# ------------------------------------------------------------------ the lists agree with their registries
def test_pooling_names_have_one_source():
    assert tuple(config.POOLING_HELP) == config.POOLINGS
    assert set(poolers.STATELESS_POOLERS) == set(config.POOLINGS) - set(config.TRAINED_POOLINGS)


@pytest.mark.parametrize("mode", sorted(st_folder.POOLING_MODES))
def test_sentence_transformers_pooling_modes_map_to_registered_poolings(mode):
    assert st_folder.POOLING_MODES[mode] in config.POOLINGS


@pytest.mark.parametrize("pooling", sorted(st_folder.ST_POOLING_MODES))
def test_written_pooling_flags_name_registered_poolings(pooling):
    assert pooling in config.POOLINGS


@pytest.mark.parametrize("pooling", config.POOLINGS)
def test_every_registered_pooling_is_a_valid_strategy(pooling):
    assert EmbeddingConfig(pooling=pooling).pooling == pooling


def test_backend_and_precision_names_have_one_source():
    assert backends.BACKENDS is config.BACKENDS and backends.PRECISIONS is config.PRECISIONS
    assert cli_options.CLI_PRECISIONS == export_cli.PRECISIONS == config.PORTABLE_PRECISIONS
    assert set(config.PORTABLE_PRECISIONS) <= set(config.PRECISIONS)


@pytest.mark.parametrize("backend", config.BACKENDS)
def test_the_cli_accepts_every_registered_backend(backend):
    assert cli_options.check_backend(backend, "float32", None) is None


def test_the_cli_refuses_an_unregistered_backend_naming_the_registered_ones():
    with pytest.raises(Exception, match="choose torch or onnx") as caught:
        cli_options.check_backend("tpu", "float32", None)
    assert "--backend" in str(caught.value.param_hint)


def test_every_named_backend_has_a_builder():
    assert set(backends.BUILDERS) == set(config.BACKENDS)


class _ToyBackend(backends.TorchBackend):
    """A toy backend: the torch backend's states, doubled (so its vectors differ before normalisation)."""

    name = "toy"

    def states(self, input_ids, attention_mask, configs, mode):
        return [2 * states for states in super().states(input_ids, attention_mask, configs, mode)]


def test_a_toy_backend_needs_only_its_class_its_builder_and_its_name(monkeypatch, tokenizer):
    """Row "a backend": a module implementing base.Backend, its builder in backends.BUILDERS and its name in
    config.BACKENDS (what the command line accepts); a decoder needs no family entry."""
    from conftest import tiny_model
    from lmembed import Embedder

    monkeypatch.setitem(backends.BUILDERS, "toy", lambda backbone, precision, threads: _ToyBackend(backbone))
    monkeypatch.setattr(config, "BACKENDS", (*config.BACKENDS, "toy"))
    assert cli_options.check_backend("toy", "float32", None) is None
    model = tiny_model("llama", len(tokenizer))
    plain = Embedder.from_model(model, tokenizer, EmbeddingConfig(normalize=False), use_cache=False)
    toy = Embedder.from_model(model, tokenizer, EmbeddingConfig(normalize=False), use_cache=False, backend="toy")
    texts = ["the cat sat", "a model of language"]
    assert toy.backend.name == "toy"
    np.testing.assert_allclose(toy.encode(texts), 2 * plain.encode(texts), rtol=1e-5, atol=1e-6)


def test_reranker_kinds_agree_with_training():
    assert set(rerank_loading.KINDS) == set(train_config.RERANKER_KINDS) - {"auto"}
    assert set(rerank_loading.KINDS) == set(training_reranker.KIND_TRAINING)
    for kind, cls in rerank_loading.KINDS.items():
        assert cls.kind == kind


# ------------------------------------------------------------------ where to add: toy items
def _twice_mean(hidden: torch.Tensor, pool_mask: torch.Tensor) -> torch.Tensor:
    return 2 * poolers.mean_pool(hidden, pool_mask)


def test_a_toy_pooling_needs_only_its_function_and_its_help_entry(monkeypatch, make_embedder):
    """Row "a pooling": a function in STATELESS_POOLERS and its name + help in config.POOLING_HELP."""
    with pytest.raises(ConfigError, match="twice_mean"):
        EmbeddingConfig(pooling="twice_mean")
    monkeypatch.setitem(poolers.STATELESS_POOLERS, "twice_mean", _twice_mean)
    monkeypatch.setitem(config.POOLING_HELP, "twice_mean", "twice the mean (a toy).")
    texts = ["the cat sat", "a much longer text about a dog"]
    toy = make_embedder("llama", pooling="twice_mean", normalize=False).encode(texts, batch_size=2)
    mean = make_embedder("llama", pooling="mean", normalize=False).encode(texts, batch_size=2)
    np.testing.assert_allclose(toy, 2 * mean, rtol=1e-5, atol=1e-6)


class _HalfSquaredDistance(torch.nn.Module):
    """A toy loss: half the squared distance between each query and its positive."""

    def forward(self, query: torch.Tensor, positive: torch.Tensor, negatives: torch.Tensor | None = None):
        return 0.5 * (query - positive).pow(2).sum(dim=-1).mean()


def test_a_toy_loss_needs_only_its_spec_in_losses(monkeypatch):
    """Row "a loss": one LossSpec in training/losses.LOSSES; names, spellings and the wrapper follow."""
    monkeypatch.setitem(losses.LOSSES, "half_sq", losses.LossSpec(_HalfSquaredDistance))
    assert "half_sq" in losses.available_losses()
    assert isinstance(losses.build_loss("Half-SQ"), _HalfSquaredDistance)
    query, positive = torch.ones(2, 4), torch.zeros(2, 4)
    assert float(losses.build_loss("half_sq")(query, positive)) == pytest.approx(2.0)
    wrapped = losses.build_loss("matryoshka", inner="half_sq", dims=[2, 4])
    assert float(wrapped(query, positive)) == pytest.approx(1.0 + 2.0)
    assert train_config.TrainConfig(loss="half_sq").loss == "half_sq"


class _ToyReranker:
    """A toy reranker kind: scores a pair by the words its texts share."""

    kind = "word-overlap"

    def __init__(self, path: str, options: dict[str, Any]) -> None:
        self.path, self.options = path, options

    @classmethod
    def from_pretrained(cls, name_or_path: str, **options: Any) -> _ToyReranker:
        return cls(name_or_path, options)

    def score_pairs(self, pairs: list[tuple[str, str]]) -> np.ndarray:
        return np.array([len(set(q.split()) & set(d.split())) for q, d in pairs], dtype=np.float32)


def test_a_toy_reranker_kind_needs_only_its_entries(monkeypatch, tmp_path: Path):
    """Row "a reranker kind": its class in rerank/loading.KINDS (a folder records its kind); to train it, its name
    in training's RERANKER_KINDS and its entry in training/reranker.KIND_TRAINING."""
    folder = tmp_path / "toy-reranker"
    folder.mkdir()
    (folder / RERANKER_FILE).write_text(json.dumps({"kind": _ToyReranker.kind}))
    (folder / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(Exception, match="word-overlap"):
        rerank_loading.load_reranker(str(folder))
    monkeypatch.setitem(rerank_loading.KINDS, _ToyReranker.kind, _ToyReranker)
    reranker = rerank_loading.load_reranker(str(folder))
    assert isinstance(reranker, _ToyReranker)
    assert reranker.score_pairs([("a red cat", "the red cat")]).tolist() == [2.0]
    assert isinstance(rerank_loading.load_reranker(str(folder), kind="word-overlap"), _ToyReranker)
    with pytest.raises(Exception, match="word-overlap"):
        train_config.TrainConfig(reranker="word-overlap", loss="listwise_softmax", num_negatives=1)
    monkeypatch.setattr(train_config, "RERANKER_KINDS", (*train_config.RERANKER_KINDS, _ToyReranker.kind))
    trained = train_config.TrainConfig(reranker="word-overlap", loss="listwise_softmax", num_negatives=1)
    assert trained.reranker == "word-overlap"
    with pytest.raises(ConfigError, match="'word-overlap' cannot be trained"):
        training_reranker.kind_training(reranker)
    traits = training_reranker.KindTraining(peft_task_type="SEQ_CLS", own_head=True, decoder=False)
    monkeypatch.setitem(training_reranker.KIND_TRAINING, _ToyReranker.kind, traits)
    assert training_reranker.kind_training(reranker) is traits


def test_every_synthesis_kind_has_its_own_runner():
    from lmembed.synthesis import recipes, synthesize

    runners = {kind: type(synthesize._runner(kind)) for kind in recipes.KINDS}
    assert len(set(runners.values())) == len(recipes.KINDS), runners


class _ToySynthesisRunner:
    """A toy synthesis kind's runner: one row per seed passage, its first word as the query."""

    def plan(self, context: Any) -> list[dict[str, Any]]:
        return [{"row": i} for i in range(len(context.corpus_texts))]

    def run(self, items: Any, context: Any) -> Any:
        from lmembed.synthesis.runner import ShardResult

        result = ShardResult(attempted=len(items))
        for item in items:
            text = context.corpus_texts[item["row"]]
            result.rows.append({"query": text.split()[0], "positive": text})
        return result


def test_a_synthesis_kind_is_added_by_registering_it(tmp_path, monkeypatch):
    """Row "a synthesis recipe kind": its runner (any module implementing RecipeRunner) and its entry in
    synthesis/recipes.SYNTHESIS_KINDS, and a recipe file of that kind; no other edit."""
    from lmembed.synthesis import recipes
    from lmembed.synthesis.generators import build_generator
    from lmembed.synthesis.synthesize import synthesize

    toy = recipes.SynthesisKind(("generate",), f"{__name__}:_ToySynthesisRunner")
    monkeypatch.setitem(recipes.SYNTHESIS_KINDS, "toy", toy)
    monkeypatch.setattr(recipes, "KINDS", tuple(recipes.SYNTHESIS_KINDS))
    recipe = tmp_path / "toy.yaml"
    recipe.write_text("kind: toy\ngenerate: 'not used by the toy runner'\n")
    output = tmp_path / "rows.jsonl"
    corpus = (["a", "b"], ["first passage here", "second passage there"])
    synthesize(recipe, build_generator("tiny"), output, corpus=corpus)
    rows = [json.loads(line) for line in output.read_text().splitlines()]
    assert [row["query"] for row in rows] == ["first", "second"]
    (tmp_path / "bad.yaml").write_text("kind: toy2\ngenerate: x\n")
    with pytest.raises(ConfigError, match=r"'kind' must be one of .*toy, got 'toy2'"):  # the list names the new kind
        recipes.load_recipe(tmp_path / "bad.yaml")


@pytest.mark.parametrize("task_type", sorted(task_types.TASK_TYPES))
def test_every_task_type_says_which_side_its_instruction_goes_to(task_type):
    sides = [task_type in instructions.QUERY_ONLY_TASK_TYPES, task_type in instructions.SYMMETRIC_TASK_TYPES]
    assert sides.count(True) == 1
    assert task_types.canonical_task_type(task_type.lower()) == task_type


def test_every_known_task_names_a_registered_task_type():
    unknown = {spec.name: spec.task_type for spec in task_registry.TASKS.values()}
    assert {name: t for name, t in unknown.items() if t not in task_types.TASK_TYPES} == {}


@pytest.mark.parametrize("preset", presets.PRESETS, ids=lambda p: p.family)
def test_every_preset_strategy_is_a_valid_config_of_registered_names(preset):
    cfg = preset.config()
    assert cfg.pooling in config.POOLINGS


def test_a_toy_preset_needs_only_its_entry_in_presets(monkeypatch):
    """Row "a published model preset": one Preset in models/presets.PRESETS; lookups by family, Hub id and
    resolution follow."""
    toy = presets.Preset(
        family="toy-embed",
        hub_ids=("toy-org/toy-embed-*",),
        strategy={"pooling": "mean_sqrt_len", "normalize": True},
        source="a test",
        verified="tests/test_registries.py",
        padding_side="right",
    )
    assert presets.preset_for_id("toy-org/toy-embed-small") is None
    monkeypatch.setattr(presets, "PRESETS", (*presets.PRESETS, toy))
    assert presets.preset_named("Toy-Embed") is toy
    assert presets.preset_for_id("toy-org/toy-embed-small") is toy
    found = presets.resolve("toy-org/toy-embed-small")
    assert found is not None and found.preset is toy and found.reason == "hub id"
    assert toy.config().pooling == "mean_sqrt_len"


def test_the_family_matrix_checks_every_backend_and_quantised_precision():
    from lmembed.models.families import ALL_BACKENDS

    assert set(ALL_BACKENDS) == set(config.BACKENDS) | set(config.QUANTISED_PRECISIONS)


def test_help_texts_name_every_registered_loss_batching_and_instruction_table():
    """Help texts written by hand went stale (round_robin, angle, matryoshka_2d, e5 and qwen3 were missing)."""
    from lmembed.cli.app import app
    from lmembed.evaluation.instructions import INSTRUCTION_SETS
    from lmembed.training.losses import available_losses
    from lmembed.training.rows import BATCHING_MODES
    from lmembed.training.train_config import BATCHING_DOC, LOSS_DOC

    assert [name for name in available_losses() if name not in LOSS_DOC] == []
    assert [name for name in BATCHING_MODES if name not in BATCHING_DOC] == []
    shown = " ".join(CliRunner().invoke(app, ["eval", "--help"], env={"COLUMNS": "400"}).output.split())
    assert [name for name in INSTRUCTION_SETS if f"'{name}'" not in shown] == []
