"""Bad training values are refused before any work starts, naming the option (a flag, or a file's line and key):
non-finite or out-of-range numbers, a mistyped ``loss_kwargs`` or ``data``, LoRA targets the model lacks, a
recipe's prepare-step name that would leave the output folder, a later stage's bad option, and a mining input's
row without a positive."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import tiny_model
from lmembed.cli.app import app
from lmembed.errors import ConfigError
from lmembed.mining import MiningError, read_training_rows
from lmembed.training.recipes import RecipeError, load_recipe, run_recipe
from lmembed.training.train_config import ObjectiveConfig, ObjectiveConfigError, TrainConfig, TrainConfigError

ROWS = [{"query": f"q{i}", "positive": f"p{i}"} for i in range(4)]


def _rows(folder: Path) -> Path:
    path = folder / "rows.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    return path


def _cli(argv: list[str]) -> tuple[int, str]:
    """Exit status and output (rich's boxes and line wrapping undone) of ``lmembed ARGV``."""
    result = CliRunner().invoke(app, argv)
    assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit), result.output
    return result.exit_code, " ".join(result.output.replace("│", " ").split())


# ---------------------------------------------------------------------------------------------- numbers
@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("lr", float("inf"), "lr=inf must be a finite number"),
        ("lr", float("nan"), "lr=nan must be a finite number"),
        ("lr", 0.0, "lr=0.0 must be positive"),
        ("lr", 2e5, r"lr=200000.0 must be positive and at most 1.0: .* 2e5 for 2e-5"),
        ("temperature", float("inf"), "temperature=inf must be a finite number"),
        ("max_grad_norm", -1.0, "max_grad_norm=-1.0 must be positive"),
        ("weight_decay", -1.0, "weight_decay=-1.0 must be >= 0"),
        ("seed", -1, "seed=-1 must be from 0"),
        ("eval_batch_size", 0, "eval_batch_size=0 must be >= 1"),
        ("eval_max_queries", -1, "eval_max_queries=-1 must be >= 1"),
        ("eval_max_docs", 0, "eval_max_docs=0 must be >= 1"),
        ("loss_kwargs", [1, 2], r"loss_kwargs=\[1, 2\] must be a mapping"),
        ("data", 5, "data=5 must be a list"),
        ("lora_alpha", 0, r"lora_alpha=0 must be > 0 \(the adapters' update is scaled by alpha / r\)"),
        ("lora_alpha", -32, "lora_alpha=-32 must be > 0"),
    ],
)
def test_a_bad_training_value_is_refused_by_name(option, value, message):
    with pytest.raises(TrainConfigError, match=message):
        TrainConfig(**{option: value})


@pytest.mark.parametrize(
    ("option", "value"),
    [("lr", float("nan")), ("lr", 3.0), ("max_grad_norm", 0.0), ("weight_decay", -0.5), ("seed", -3)],
)
def test_a_bad_stage_value_is_refused_by_name(option, value):
    with pytest.raises(ObjectiveConfigError, match=f"{option}="):
        ObjectiveConfig(**{option: value})


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--lr", "inf"),
        ("--lr", "nan"),
        ("--max-grad-norm", "-1"),
        ("--weight-decay", "-1"),
        ("--seed", "-1"),
        ("--eval-max-queries", "-1"),
        ("--weight", "-2"),
    ],
)
def test_train_names_the_flag_of_a_bad_value(tmp_path, flag, value):
    argv = ["train", "-m", "no-such-model", "--data", str(_rows(tmp_path)), "-o", str(tmp_path / "run"), flag, value]
    status, output = _cli(argv)
    assert status == 2, output
    assert f"Invalid value for {flag}" in output or f"Invalid value for '{flag}'" in output, output
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        ("steps: 1\nloss_kwargs: [1, 2]\n", 2, "loss_kwargs=[1, 2] must be a mapping"),
        ("steps: 1\nlr: .nan\n", 2, "lr=nan must be a finite number"),
        ("steps: 1\n\ndata: 5\n", 3, "data=5 must be a list"),
        ("data:\n  - x.jsonl\n  - {path: y.jsonl, weight: -2}\n", 3, "data[1].weight=-2 must be a finite number >= 0"),
        ("data:\n  - {path: y.jsonl, colour: red}\n", 2, "data[0]: unknown data source option(s): colour"),
    ],
)
def test_a_config_file_names_the_line_of_a_bad_value(tmp_path, text, line, message):
    path = tmp_path / "run.yaml"
    path.write_text(text)
    with pytest.raises(TrainConfigError) as caught:
        TrainConfig.from_yaml(path)
    assert str(caught.value).startswith(f"{path}:{line}: {message}"), caught.value


def test_a_bad_config_file_value_is_a_clean_cli_error(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text(f"model: no-such-model\ndata: [{_rows(tmp_path)}]\nsteps: 1\nloss_kwargs: [1, 2]\n")
    status, output = _cli(["train", "--config", str(config), "-o", str(tmp_path / "run")])
    assert status == 2 and f"{config}:4: loss_kwargs=[1, 2]" in output, output


def test_more_negatives_than_texts_to_draw_from_are_refused_at_once():
    """num_negatives 100,000,000 over 10 rows drew for minutes (100 tries a negative) before any word."""
    from lmembed.training.rows import MixtureSampler, TrainDataset, TrainExample, TrainingDataError

    examples = [TrainExample(f"q{i}", (f"p{i}",), ()) for i in range(10)]
    sampler = MixtureSampler([TrainDataset("rows", examples, [])], batch_size=4, num_negatives=100_000_000, seed=0)
    with pytest.raises(TrainingDataError, match=r"num_negatives=100000000: query 'q\d' has 0 negatives .* \d+ other"):
        sampler.batch(0)


@pytest.mark.parametrize(("method", "margin"), [("abs", float("nan")), ("margin_pos", float("nan")), ("abs", 1e400)])
def test_a_mining_margin_that_is_not_finite_is_refused(method, margin):
    from lmembed.mining import resolve_margin

    with pytest.raises(MiningError, match="is not a finite number"):
        resolve_margin(method, margin)


# ---------------------------------------------------------------------------------------------- LoRA targets
def test_lora_targets_the_model_lacks_are_named_with_its_layers(tokenizer):
    from peft import LoraConfig

    from lmembed.training.trainable import peft_with_lora

    model = tiny_model("llama", len(tokenizer))
    with pytest.raises(ConfigError, match=r"--lora-targets.*'nonexistent_module'.*its linear layers: .*q_proj"):
        peft_with_lora(model, LoraConfig(target_modules=["nonexistent_module"]))
    adapted = peft_with_lora(tiny_model("llama", len(tokenizer)), LoraConfig(target_modules=["q_proj", "query"]))
    assert any("lora_A" in name for name, _ in adapted.named_parameters())  # one name of several models matches


# ---------------------------------------------------------------------------------------------- recipes
def _recipe(tmp_path: Path, prepare: str, stages: str) -> Path:
    rows = _rows(tmp_path)
    path = tmp_path / "recipe.yaml"
    path.write_text(
        f"name: r\nmodel: no-such-model\noutput: {tmp_path / 'out'}\ndefaults: {{batch_size: 4, device: cpu}}\n"
        f"prepare:\n  - name: {prepare}\n    kind: pairs\n    input: {rows}\n    max_rows: 4\n"
        f"stages:\n{stages}"
    )
    return path


ONE_STAGE = "  - {name: s1, data: ['{prepared:p}'], steps: 1}\n"


@pytest.mark.parametrize("name", ["../../escaped", "..", "a/b", ".hidden"])
def test_a_prepare_name_that_leaves_the_output_folder_is_refused(tmp_path, name):
    path = _recipe(tmp_path, name, ONE_STAGE.replace("{prepared:p}", f"{{prepared:{name}}}"))
    with pytest.raises(RecipeError, match=rf"{path}:6: prepare step 1: name '{name}' must be letters"):
        load_recipe(path)
    status, output = _cli(["train", "--recipe", str(path)])
    assert status == 2 and "name" in output, output
    assert not (tmp_path / "out").exists() and not (tmp_path / "escaped.jsonl").exists()


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [("max_rows", -5, "max_rows must be >= 1, got -5"), ("max_rows", 2.5, "max_rows must be a whole number")],
)
def test_a_prepare_number_out_of_range_names_its_line(tmp_path, key, value, message):
    path = _recipe(tmp_path, "p", ONE_STAGE)
    path.write_text(path.read_text().replace("max_rows: 4", f"{key}: {value}"))
    with pytest.raises(RecipeError, match=rf"{path}:9: prepare step 1: {message}"):
        load_recipe(path)


@pytest.mark.parametrize(
    ("stage", "message"),
    [
        ("    steps: -2\n", r":14: stage 's2': steps=-2 must be >= 1"),
        ("    lr: .inf\n", r":14: stage 's2': lr=inf must be a finite number"),
        ("    bogus: 1\n", r":14: stages\.1\.bogus: stage 's2': unknown option 'bogus'"),
        # the loss, its options and an objective's options: each found only once the stages before had trained
        ("    loss: infonse\n", r":14: stage 's2': unknown loss 'infonse'; available: .*infonce"),
        ("    loss_kwargs: {temprature: 0.1}\n", r":14: stage 's2': loss 'infonce' has no option temprature"),
        ("    type: simcse\n    options: {temprature: 0.1}\n", r":15: stage 's2': objective 'simcse' has no option"),
        ("    type: angle\n    options: {positive_treshold: 4}\n", r":15: stage 's2': objective 'angle' has no option"),
    ],
)
def test_a_later_stage_is_checked_before_anything_runs(tmp_path, stage, message):
    stages = ONE_STAGE + "  - name: s2\n    data: ['{prepared:p}']\n" + stage
    path = _recipe(tmp_path, "p", stages)
    with pytest.raises(RecipeError, match=message):
        run_recipe(path)
    assert not (tmp_path / "out").exists()  # nothing prepared, no stage trained


def test_a_recipe_override_from_the_command_line_is_named_by_its_flag(tmp_path):
    path = _recipe(tmp_path, "p", ONE_STAGE)
    status, output = _cli(["train", "--recipe", str(path), "--lr", "inf"])
    assert status == 2 and "Invalid value for --lr" in output and "lr=inf" in output, output
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------------------------- mining input
def test_a_mining_row_without_a_positive_names_its_line(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n\n" + json.dumps({"anchor": "x"}) + "\n")
    with pytest.raises(MiningError, match=rf"{path}:3: row has no positive"):
        read_training_rows(path)
    status, output = _cli(["mine", "-t", "no-such-model", "--data", str(path), "-o", str(tmp_path / "m.jsonl")])
    assert status == 2 and f"{path}:3: row has no positive" in output, output


def test_a_synthesize_step_with_a_bad_generator_seed_is_refused_when_read():
    from lmembed.training.recipes import parse_recipe

    step = {"name": "s", "kind": "synthesize", "recipe": "corpus-only", "generator": "tiny:abc"}
    with pytest.raises(RecipeError, match=r"r\.yaml: prepare step 1: generator 'tiny:abc': the seed after 'tiny:'"):
        parse_recipe({"model": "m", "stages": [{"name": "a"}], "prepare": [step]}, Path("r.yaml"))


def test_a_batch_larger_than_the_rows_is_refused(make_embedder, tmp_path):
    """``--batch-size 1000`` on 40 rows trained (83 s a step) on batches that repeated every row, each copy a false
    in-batch negative of the others."""
    from lmembed.training.trainer import Trainer

    config = TrainConfig(data=[str(_rows(tmp_path))], batch_size=8, steps=1, output=str(tmp_path / "out"))
    with pytest.raises(TrainConfigError, match=r"batch_size=8 is more than the 4 training rows"):
        Trainer(config, model=make_embedder("bert"))


def test_a_recipe_rows_step_to_mine_names_the_line_of_a_row_without_a_positive(tmp_path):
    """A recipe's ``mine`` step met a row without a positive only while mining, and named no line."""
    from lmembed.training.recipe_data import _convert

    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n\n" + json.dumps({"query": "q only"}) + "\n")
    with pytest.raises(MiningError, match=rf"^{path}:3: row has no positive"):
        _convert({"kind": "rows", "name": "r"}, path, teacher=object())
    assert len(_convert({"kind": "rows", "name": "r"}, path, teacher=None)) == 2  # unmined rows: train's reader judges


def test_lora_options_without_lora_are_refused(make_embedder):
    """--lora-r 8 --keep-adapter on an encoder (fully fine-tuned by default) trained full weights and saved no
    adapter, the options still recorded in train_config.yaml."""
    from lmembed.training.trainable import build_trainable

    with pytest.raises(ConfigError, match=r"lora_r=8: LoRA options, .*an encoder is fully fine-tuned by default"):
        build_trainable(TrainConfig(lora_r=8), make_embedder("bert"))
    with pytest.raises(ConfigError, match=r"keep_adapter: LoRA options, but no adapters are trained \(lora is false"):
        build_trainable(TrainConfig(lora=False, merge_lora=False), make_embedder("llama"))
    assert build_trainable(TrainConfig(lora_r=16), make_embedder("bert")) is not None  # the default: nothing said


def test_a_lora_rank_above_the_hidden_size_is_refused_before_any_adapter(make_embedder):
    """lora_r: 100000000 ended in an internal RuntimeError allocating 153 GB; a rank above the hidden size is
    refused naming lora_r (a small excess here: a regression must not allocate a huge adapter)."""
    from lmembed.training.trainable import build_trainable

    embedder = make_embedder("llama")
    hidden = embedder.backbone.hidden_size
    with pytest.raises(ConfigError, match=rf"lora_r={2 * hidden} is more than the model's hidden size \({hidden}\)"):
        build_trainable(TrainConfig(lora=True, lora_r=2 * hidden), embedder)
    assert build_trainable(TrainConfig(lora=True, lora_r=hidden), make_embedder("llama")) is not None


@pytest.mark.parametrize("steps", [10**15, 2.5, True])
def test_steps_beyond_any_run_or_not_whole_are_refused(tmp_path, steps):
    with pytest.raises(TrainConfigError, match=r"steps=.* must be a whole number from 1 to 1000000000"):
        TrainConfig(steps=steps)
    config = tmp_path / "c.yaml"
    config.write_text(f"model: m\nsteps: {10**15}\n")
    with pytest.raises(TrainConfigError, match=r"c\.yaml:2: steps=1000000000000000"):
        TrainConfig.from_yaml(config)
