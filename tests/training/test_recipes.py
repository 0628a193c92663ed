"""YAML recipes: parsing, planning, and end-to-end runs on a tiny model (test-only overrides)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from conftest import REPO, shared_or_skip, tiny_model
from lmembed import Embedder, EmbeddingConfig
from lmembed.training.recipes import (
    RecipeError,
    apply_overrides,
    load_recipe,
    parse_recipe,
    plan_recipe,
    run_recipe,
)
from lmembed.training.stages import ObjectiveConfig
from lmembed.training.train_config import TrainConfig
from lmembed.training.trainable import TrainableEmbedder

pytestmark = pytest.mark.usefixtures("one_torch_thread")


RECIPES = sorted((REPO / "recipes").glob("*.yaml"))
EXPECTED = {
    "nv-embed-two-stage",
    "anchor-stage1-stage2",
    "llm2vec-mntp-simcse",
    "matryoshka",
    "2dmse",
    "gte",
    "angle",
    "e5-mistral-lora",
    "grit",
    "reranker",
    "reranker-gpu",
    "llm-reranker-lora",
    "gpl-distill",
}
TINY = {"steps": 1, "batch_size": 4, "max_length": 64, "warmup_steps": 0}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, tokenizer) -> str:
    """A saved tiny Llama Embedder (random weights, word-level tokenizer) to stand in for real models."""
    folder = tmp_path_factory.mktemp("tiny-llama")
    model = tiny_model("llama", len(tokenizer))
    Embedder.from_model(model, tokenizer, EmbeddingConfig(), use_cache=False).save(folder)
    return str(folder)


def _write_jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


# ---------------------------------------------------------------------------------------------- shipped recipes
def test_all_seed_recipes_are_shipped():
    assert {p.stem for p in RECIPES} == EXPECTED


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_shipped_recipe_names_its_paper_and_plans_valid_stages(path):
    header = path.read_text().split("\nname:")[0]
    assert "Paper" in header or "paper" in header.lower()
    recipe = load_recipe(path)
    assert recipe.name == path.stem and recipe.paper
    assert recipe.model in ("minilm", "smollm2-135m")  # bundled models only
    plans = plan_recipe(recipe)
    assert [p["name"] for p in plans] == [s["name"] for s in recipe.stages]
    for plan in plans:
        options = {k: v for k, v in plan.items() if k not in ("name", "type")}
        gpu = options.get("device") == "cuda"  # a GPU-sized recipe says so, and has a CPU-sized sibling
        if plan["type"] == "contrastive":
            config = TrainConfig.from_dict(options)
            assert config.steps <= 100 and config.batch_size <= 16  # CPU-sized
        elif plan["type"] == "rerank":  # a reranker needs more steps to learn its new head (bench/rerank.py runs it)
            config = TrainConfig.from_dict(options)
            assert config.reranker and config.steps <= (1000 if gpu else 300) and config.batch_size <= 16
            assert not gpu or (path.parent / f"{path.stem.removesuffix('-gpu')}.yaml").is_file()
        else:
            config = ObjectiveConfig.from_dict(options)
            assert config.objective == plan["type"] and config.steps <= 100
    assert plans[1:] == [] or plans[1]["model"].endswith(f"{plans[0]['name']}/model")  # chained stages


def test_nv_embed_recipe_follows_the_paper():
    recipe = load_recipe(REPO / "recipes" / "nv-embed-two-stage.yaml")
    first, second = plan_recipe(recipe)
    assert first["pooling"] == second["pooling"] == "latent_attention"
    assert first["attention"] == "bidirectional"
    assert first["in_batch_negatives"] is True and second["in_batch_negatives"] is False
    assert second["lr"] < first["lr"]
    assert {"symmetric": True} in [
        {k: v for k, v in d.items() if k == "symmetric"} for d in second["data"] if isinstance(d, dict)
    ]
    mined = [s["mine"] for s in recipe.prepare if "mine" in s]
    assert all(m["method"] == "perc_pos" and m["margin"] == 0.95 for m in mined)


# ---------------------------------------------------------------------------------------------- validation
def test_structural_errors_are_reported():
    with pytest.raises(RecipeError, match="stages"):
        parse_recipe({"model": "m"})
    with pytest.raises(RecipeError, match="used twice"):
        parse_recipe({"model": "m", "stages": [{"name": "a"}, {"name": "a"}]})
    with pytest.raises(RecipeError, match="type"):
        parse_recipe({"model": "m", "stages": [{"name": "a", "type": "magic"}]})
    with pytest.raises(RecipeError, match="unknown top-level"):
        parse_recipe({"model": "m", "stages": [{"name": "a"}], "stagez": []})
    with pytest.raises(RecipeError, match="kind"):
        parse_recipe({"model": "m", "stages": [{"name": "a"}], "prepare": [{"name": "p", "input": "x"}]})
    recipe = parse_recipe({"model": "m", "stages": [{"name": "a"}]})
    with pytest.raises(RecipeError, match="match no stage option"):
        apply_overrides(recipe, {"stepz": 1})
    with pytest.raises(RecipeError, match=r"'cites' names nope2020, which lmembed.citations does not hold"):
        parse_recipe({"model": "m", "stages": [{"name": "a"}], "cites": ["li2023gte", "nope2020"]})
    with pytest.raises(RecipeError, match="a list of citation keys"):
        parse_recipe({"model": "m", "stages": [{"name": "a"}], "cites": "li2023gte"})


@pytest.mark.parametrize(
    ("step", "message"),
    [
        ({"kind": "beir", "options": {"colour": 1}}, r"step 1: options: unknown key\(s\) colour; known: min_score"),
        ({"kind": "classification", "options": {"split": "dev"}}, r"options: unknown key\(s\) split"),
        ({"kind": "rows", "options": {"mode": "auto"}}, r"known: none"),
        ({"kind": "sts", "mine": {"teacher": "m", "k": "many"}}, r"mine\.k must be a whole number, got 'many'"),
        ({"kind": "pairs", "mine": {"teacher": "m", "methd": "x"}}, r"mine: unknown key\(s\) methd; known: .*method"),
        ({"kind": "beir", "seed": "x"}, r"seed must be a whole number"),
    ],
)
def test_prepare_step_values_are_checked_when_the_recipe_is_read(step, message):
    """A prepare step's options and mining keys reach a converter or the miner as keywords: a wrong one is
    refused when the recipe is read, naming the step, not as a TypeError when the step runs."""
    recipe = {"model": "m", "stages": [{"name": "a"}], "prepare": [{"name": "p", "input": "x", **step}]}
    with pytest.raises(RecipeError, match=message):
        parse_recipe(recipe, Path("r.yaml"))


SYNTH = {"kind": "synthesize", "recipe": "corpus-only", "generator": "tiny"}


@pytest.mark.parametrize(
    ("step", "message"),
    [
        ({**SYNTH, "generator": None}, r"step 1: a synthesize step needs 'generator'"),
        ({**SYNTH, "recipe": "nope"}, r"step 1: synthesis recipe 'nope' is not a file nor one of: .*corpus-only"),
        ({**SYNTH, "limt": 3}, r"synthesize step: unknown key\(s\) limt; known: .*limit"),
        ({**SYNTH, "limit": 0}, r"limit must be a whole number >= 1, got 0"),
        ({**SYNTH, "options": {"colour": 1}}, r"options: unknown key\(s\) colour; known: .*concurrency"),
    ],
)
def test_synthesize_steps_are_checked_when_the_recipe_is_read(step, message):
    recipe = {"model": "m", "stages": [{"name": "a"}], "prepare": [{"name": "p", **step}]}
    with pytest.raises(RecipeError, match=message):
        parse_recipe(recipe, Path("r.yaml"))


def test_unknown_stage_option_names_the_stage(tmp_path, tiny_dir):
    data = _write_jsonl(tmp_path / "d.jsonl", [{"query": "q", "positive": "p"}] * 4)
    recipe = parse_recipe(
        {"model": tiny_dir, "output": str(tmp_path / "o"), "stages": [{"name": "s1", "data": [data], "lrr": 1}]}
    )
    with pytest.raises(RecipeError, match="s1"):
        run_recipe(recipe)


def test_unknown_placeholder_is_reported(tmp_path, tiny_dir):
    recipe = parse_recipe(
        {"model": tiny_dir, "output": str(tmp_path / "o"), "stages": [{"name": "s", "data": ["{prepared:nope}"]}]}
    )
    with pytest.raises(RecipeError, match="prepared:nope"):
        run_recipe(recipe)


# ---------------------------------------------------------------------------------------------- end to end
TEXT_ROWS = [
    {"query": "the cat sat", "positive": "a cat sat on the mat", "instruction": "find"},
    {"query": "the dog ran", "positive": "a dog was eating food"},
    {"query": "science study", "positive": "protein gene cell study result"},
    {"query": "hello friend", "positive": "hello there friend"},
    {"query": "riding horse", "positive": "the man is riding a horse"},
    {"query": "great movie", "positive": "great movie, bad food"},
]
STS_ROWS = [
    {"sentence1": "a man is riding a horse", "sentence2": "the man sat on a horse", "score": 4.5},
    {"sentence1": "the cat sat on the mat", "sentence2": "a cat sat on a rug", "score": 4.2},
    {"sentence1": "a woman is eating food", "sentence2": "the dog was eating", "score": 1.0},
    {"sentence1": "hello there", "sentence2": "science result", "score": 0.0},
]
CLASS_ROWS = [{"text": f"{w} {i}", "label_text": w} for w in ("cat", "dog", "food") for i in range(4)]


def test_toy_recipe_runs_every_stage_type_end_to_end(tmp_path, tiny_dir, monkeypatch):
    from lmembed.training import rows as data

    seen_batches: list[set[str]] = []
    original = data.TaskHomogeneousSampler.batch

    def spy(self, step):
        batch = original(self, step)
        seen_batches.append(set(batch.sources))
        return batch

    monkeypatch.setattr(data.TaskHomogeneousSampler, "batch", spy)
    rows = _write_jsonl(tmp_path / "rows.jsonl", TEXT_ROWS)
    recipe = {
        "name": "toy",
        "model": tiny_dir,
        "output": str(tmp_path / "run"),
        "defaults": {"pooling": "mean", "attention": "bidirectional", "progress": False, "device": "cpu"},
        "prepare": [
            {"name": "rows", "kind": "rows", "input": rows, "mine": {"teacher": tiny_dir, "k": 2, "method": "naive"}},
            {
                "name": "sts",
                "kind": "sts",
                "input": _write_jsonl(tmp_path / "sts.jsonl", STS_ROWS),
                "mine": {"teacher": tiny_dir, "k": 1, "method": "naive"},
            },
            {
                "name": "classes",
                "kind": "classification",
                "input": _write_jsonl(tmp_path / "c.jsonl", CLASS_ROWS),
                "options": {"num_negatives": 2},
            },
        ],
        "stages": [
            {"name": "mntp", "type": "mntp", "data": ["{prepared:rows}"], "lora_r": 4},
            {"name": "simcse", "type": "simcse", "data": ["{prepared:rows}"], "dropout": 0.2},
            {"name": "stage1", "data": ["{prepared:rows}"], "num_negatives": 2},
            {
                "name": "stage2",
                "batching": "homogeneous",
                "in_batch_negatives": False,
                "num_negatives": 1,
                "data": ["{prepared:classes}", {"path": "{prepared:sts}", "symmetric": True}],
            },
        ],
    }
    started = time.perf_counter()
    result = run_recipe(parse_recipe(recipe), overrides={**TINY, "steps": 2})
    elapsed = time.perf_counter() - started
    assert [s.name for s in result.stages] == ["mntp", "simcse", "stage1", "stage2"]
    assert all(s.steps == 2 for s in result.stages)
    assert all(len(b) == 1 for b in seen_batches) and len(seen_batches) == 2  # homogeneous batches
    mined = [json.loads(line) for line in result.prepared["rows"].read_text().splitlines()]
    assert all(len(r["negatives"]) == 2 and r["positive"] not in r["negatives"] for r in mined)
    sts = [json.loads(line) for line in result.prepared["sts"].read_text().splitlines()]
    assert len(sts) == 4 and all(r["symmetric"] for r in sts)
    final = Embedder.from_pretrained(str(result.model_dir), cache=False, show_progress=False)
    assert final.config.attention == "bidirectional" and final.encode(["the cat"]).shape == (1, 32)
    saved = json.loads((tmp_path / "run" / "recipe_result.json").read_text())
    assert saved["model_dir"] == str(result.model_dir)
    assert elapsed < 120


def test_sts_rows_carry_the_sts_instruction_unless_told_none(tmp_path):
    from lmembed.task_registry import STS_INSTRUCTION
    from lmembed.training.recipes import prepare_data

    source = _write_jsonl(tmp_path / "sts.jsonl", STS_ROWS)
    rows = {}
    for label, extra in (("default", {}), ("none", {"instruction": ""})):
        step = {"name": label, "kind": "sts", "input": source, "output": f"{label}-rows.jsonl", **extra}
        rows[label] = [json.loads(line) for line in prepare_data(step, tmp_path).read_text().splitlines()]
    assert rows["default"] and all(r["instruction"] == STS_INSTRUCTION for r in rows["default"])
    assert len(rows["none"]) == len(rows["default"])
    assert all("instruction" not in r and not r["document_instruction"] for r in rows["none"])


def test_prepared_data_is_reused_when_unchanged(tmp_path, tiny_dir):
    rows = _write_jsonl(tmp_path / "rows.jsonl", TEXT_ROWS)
    recipe = parse_recipe(
        {
            "model": tiny_dir,
            "output": str(tmp_path / "run"),
            "prepare": [{"name": "rows", "kind": "rows", "input": rows}],
            "stages": [{"name": "only", "data": ["{prepared:rows}"], "progress": False, "device": "cpu"}],
        }
    )
    first = run_recipe(recipe, overrides=TINY)
    stamp = first.prepared["rows"].stat().st_mtime_ns
    second = run_recipe(recipe, overrides=TINY)
    assert second.prepared["rows"].stat().st_mtime_ns == stamp


def test_prepared_data_is_made_again_when_its_input_is_edited_or_its_stamp_damaged(tmp_path, caplog):
    """The stamp digests the input's content, not only its path: edited data in place was reused stale."""
    from lmembed.training.recipes import prepare_data

    source = _write_jsonl(tmp_path / "sts.jsonl", STS_ROWS)
    step = {"name": "sts", "kind": "sts", "input": source, "output": "sts-prepared.jsonl"}
    first = prepare_data(step, tmp_path).read_text()
    _write_jsonl(tmp_path / "sts.jsonl", [{**STS_ROWS[0], "sentence1": "an edited sentence"}, *STS_ROWS[1:]])
    second = prepare_data(step, tmp_path).read_text()
    assert "an edited sentence" in second and "an edited sentence" not in first
    stamp = tmp_path / "data" / "sts-prepared.jsonl.recipe.json"
    stamp.write_text("[1, 2]")
    assert prepare_data(step, tmp_path).read_text() == second
    assert any("prepare stamp must hold an object" in r.getMessage() for r in caplog.records)


def test_symmetric_sources_instruct_the_documents(tmp_path, tiny_dir, monkeypatch):
    calls: list[list] = []
    original = TrainableEmbedder.tokenize

    def spy(self, texts, instructions=None):
        calls.append(list(instructions) if isinstance(instructions, list) else [instructions] * len(texts))
        return original(self, texts, instructions)

    monkeypatch.setattr(TrainableEmbedder, "tokenize", spy)
    sts = [{"query": "a man", "positive": "the man", "negatives": ["the dog"], "instruction": "Retrieve similar"}] * 4
    recipe = parse_recipe(
        {
            "model": tiny_dir,
            "output": str(tmp_path / "run"),
            "stages": [
                {
                    "name": "s",
                    "data": [{"path": _write_jsonl(tmp_path / "sts.jsonl", sts), "symmetric": True}],
                    "num_negatives": 1,
                    "progress": False,
                    "device": "cpu",
                }
            ],
        }
    )
    run_recipe(recipe, overrides=TINY)
    (instructions,) = [c for c in calls if len(c) == 12]  # 4 queries + 4 positives + 4 negatives
    assert instructions == ["Retrieve similar"] * 12


def test_shipped_nv_embed_recipe_runs_on_a_tiny_model(tmp_path, tiny_dir):
    shared_or_skip("beir/scifact")
    overrides = {
        **TINY,
        "model": tiny_dir,
        "teacher": tiny_dir,
        "output": str(tmp_path / "nv"),
        "max_rows": 8,
        "max_corpus": 24,
        "num_negatives": 1,
    }
    started = time.perf_counter()
    result = run_recipe(REPO / "recipes" / "nv-embed-two-stage.yaml", overrides=overrides)
    assert [s.name for s in result.stages] == ["stage1-retrieval", "stage2-blend"]
    final = Embedder.from_pretrained(str(result.model_dir), cache=False, show_progress=False)
    assert final.config.pooling == "latent_attention" and final.pooling_head is not None
    assert time.perf_counter() - started < 120
    card = (Path(result.model_dir) / "README.md").read_text()  # the recipe, its stage and its papers
    assert "| recipe | nv-embed-two-stage, stage stage2-blend |" in card and "NV-Embed (arXiv:2405.17428)" in card
    for key in ("lee2024nvembed", "moreira2024nvretriever", "oord2018cpc", "hu2021lora"):
        assert f"{{{key}," in card, key


def test_shipped_grit_recipe_runs_on_a_tiny_model(tmp_path, tiny_dir):
    shared_or_skip("training/nli_entailment_pairs.jsonl")
    overrides = {**TINY, "model": tiny_dir, "output": str(tmp_path / "grit"), "max_rows": 8}
    result = run_recipe(REPO / "recipes" / "grit.yaml", overrides=overrides)
    records = [json.loads(line) for line in (tmp_path / "grit" / "grit" / "metrics.jsonl").read_text().splitlines()]
    assert {"loss_embedding", "loss_generative"} <= set(records[0])  # the prepared generative rows were read
    final = Embedder.from_pretrained(str(result.model_dir), cache=False, show_progress=False)
    assert final.config.plain_prefix == "<|embed|>\n" and final.config.attention == "bidirectional"


def test_shipped_gpl_distill_recipe_runs_on_a_tiny_model(tmp_path, tiny_dir):
    """SciFact's first 10 passages, the tiny generator and the tiny model as teacher and student: synthesised rows
    with teacher scores, then MarginMSE steps."""
    shared_or_skip("beir/scifact")
    overrides = {**TINY, "model": tiny_dir, "teacher": tiny_dir, "generator": "tiny", "output": str(tmp_path / "gpl")}
    result = run_recipe(REPO / "recipes" / "gpl-distill.yaml", overrides={**overrides, "max_rows": 6, "max_corpus": 10})
    rows = [json.loads(line) for line in result.prepared["scifact-synthetic"].read_text().splitlines()]
    assert 0 < len(rows) <= 6 and all(len(r["teacher_scores"]["negatives"]) == len(r["negatives"]) for r in rows)
    assert {r["provenance"]["generator"] for r in rows} == {"tiny"}
    records = [json.loads(line) for line in (tmp_path / "gpl" / "distil" / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 1 and records[0]["loss"] > 0


def test_cli_runs_a_recipe_with_command_line_overrides(tmp_path, tiny_dir):
    from typer.testing import CliRunner

    from lmembed.cli.app import app

    rows = _write_jsonl(tmp_path / "rows.jsonl", TEXT_ROWS)
    recipe = tmp_path / "toy.yaml"
    recipe.write_text(
        "# Paper: none (a toy)\nname: toy\nmodel: minilm\nstages:\n"
        f"  - {{name: only, data: ['{rows}'], steps: 50, batch_size: 16, pooling: mean, device: cpu}}\n"
    )
    output = tmp_path / "out"
    runner = CliRunner()
    argv = ["train", "--recipe", str(recipe), "--model", tiny_dir, "--output", str(output), "--no-progress"]
    done = runner.invoke(app, [*argv, "--steps", "1", "--batch-size", "4", "--warmup-steps", "0"])
    assert done.exit_code == 0, done.output
    assert json.loads((output / "only" / "model" / "lmembed.json").read_text())["strategy"]["pooling"] == "mean"
    assert len((output / "only" / "metrics.jsonl").read_text().splitlines()) == 1  # --steps 1 won over 50
    refused = runner.invoke(app, [*argv, "--data", rows])
    assert refused.exit_code != 0 and "--data cannot be combined with --recipe" in refused.output


# ---------------------------------------------------------------------------------------------- synthesize step
SYNTH_RECIPE = """# Paper: none (corpus-only synthesis, then MarginMSE on the teacher's scores)
name: synth
model: {model}
output: {output}
defaults: {{pooling: mean, progress: false, device: cpu, max_length: 64, warmup_steps: 0}}
prepare:
  - name: synthetic
    kind: synthesize
    recipe: corpus-only
    generator: tiny
    input: {corpus}
    embedder: {model}
    shard_size: 2
stages:
  - {{name: distil, data: ["{{prepared:synthetic}}"], loss: margin_mse, num_negatives: 2, steps: 2, batch_size: 4}}
"""


def _synth_recipe(tmp_path: Path, tiny_dir: str, output: str) -> Path:
    from helpers import TOY_DOCS, write_beir

    corpus = tmp_path / "corpus"
    if not corpus.exists():
        write_beir(corpus, [(f"d{i}", t) for i, t in enumerate(TOY_DOCS)], [("q", "cat")], [("q", "d0")])
    path = tmp_path / f"{output}.yaml"
    path.write_text(SYNTH_RECIPE.format(model=tiny_dir, output=tmp_path / output, corpus=corpus))
    return path


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_synthesize_step_feeds_a_distillation_stage(tmp_path, tiny_dir):
    """Recipe file -> corpus-only rows from the deterministic tiny generator (teacher: the tiny embedder) -> two
    MarginMSE steps on the rows' teacher scores."""
    result = run_recipe(_synth_recipe(tmp_path, tiny_dir, "run"))
    rows = _rows(result.prepared["synthetic"])
    assert len(rows) == 8  # one per passage: 8 passages are all within the round trip's top 10
    for row in rows:
        assert len(row["negatives"]) == 4 == len(row["teacher_scores"]["negatives"])
        assert row["provenance"]["generator"] == "tiny" and row["provenance"]["kind"] == "corpus-only"
    stats = json.loads((tmp_path / "run" / "data" / "synthetic.synth.jsonl.stats.json").read_text())
    assert stats["rows"] == 8 and stats["shards"] == 4
    (stage,) = result.stages
    assert stage.steps == 2 and stage.first_loss is not None and stage.first_loss > 0
    assert Embedder.from_pretrained(str(result.model_dir), cache=False, show_progress=False).config.pooling == "mean"


def test_a_killed_synthesize_step_resumes_from_its_shards(tmp_path, tiny_dir, monkeypatch):
    """The generator dies on the third shard; the rerun generates only shards 3 and 4, and the rows equal an
    uninterrupted run's."""
    from lmembed.synthesis.generators import GeneratorError, TinyGenerator

    original, calls = TinyGenerator.generate, []

    def dies_on_the_third_call(self, requests):
        calls.append(len(requests))
        if len(calls) == 3:
            raise GeneratorError("the server went away")
        return original(self, requests)

    monkeypatch.setattr(TinyGenerator, "generate", dies_on_the_third_call)
    path = _synth_recipe(tmp_path, tiny_dir, "killed")
    with pytest.raises(RecipeError, match="prepare step 'synthetic': the server went away"):
        run_recipe(path, stages=[])
    parts = tmp_path / "killed" / "data" / "synthetic.synth.jsonl.parts"
    assert sorted(p.name for p in parts.glob("shard-*.stats.json")) == [
        "shard-00000.stats.json",
        "shard-00001.stats.json",
    ]
    resumed = run_recipe(path, stages=[])
    stats = json.loads((parts.parent / "synthetic.synth.jsonl.stats.json").read_text())
    assert stats["shards_generated_now"] == 2 and stats["rows"] == 8
    assert len(calls) == 5  # 2 shards, the failed call, then the 2 missing shards
    fresh = run_recipe(_synth_recipe(tmp_path, tiny_dir, "fresh"), stages=[])
    assert _rows(resumed.prepared["synthetic"]) == _rows(fresh.prepared["synthetic"])


@pytest.mark.parametrize("target", ["/tmp/escaped.jsonl", "../../escaped.jsonl", "data/../../escaped.jsonl"])
def test_a_prepare_output_outside_the_data_folder_is_refused(tmp_path, target):
    """A prepare step's ``output`` was written wherever it pointed (an absolute path, or ``..`` from the working
    directory); it is refused naming the recipe, its line and ``prepare.output``, before anything is written."""
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        f"model: m\noutput: {tmp_path / 'run'}\nprepare:\n  - name: p\n    kind: rows\n    input: x.jsonl\n"
        f"    output: {target}\nstages:\n  - name: s\n    data: ['{{prepared:p}}']\n"
    )
    with pytest.raises(RecipeError, match=rf"r\.yaml:7: prepare step 1: prepare\.output='{re.escape(target)}'"):
        load_recipe(recipe)


def test_a_code_built_prepare_output_outside_the_data_folder_is_refused(tmp_path):
    from lmembed.training.recipes import prepare_data

    rows = _write_jsonl(tmp_path / "rows.jsonl", TEXT_ROWS)
    for target in (str(tmp_path / "escaped.jsonl"), "../escaped.jsonl"):
        step = {"name": "p", "kind": "rows", "input": rows, "output": target}
        with pytest.raises(RecipeError, match=r"prepare\.output="):
            prepare_data(step, tmp_path / "run")
    assert not (tmp_path / "escaped.jsonl").exists() and not (tmp_path / "run" / "escaped.jsonl").exists()
