"""The schema layer of the files users write: one YAML-with-lines reader, one way to name a mistake
(``FILE:LINE: key.path: message``), and training options declared once (their flags ride on TrainConfig's
fields, the model side on ModelOptions' and LoraOptions' fields)."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from lmembed.cli.app import app
from lmembed.experiments.spec import ExperimentSpecError, parse_spec
from lmembed.options import LoraOptions, ModelOptions, flags_of
from lmembed.schema import Where, check_fields, load_yaml_with_lines
from lmembed.synthesis.recipes import SynthesisRecipeError, load_recipe
from lmembed.training.recipe_schema import RecipeError
from lmembed.training.recipe_schema import load_recipe as load_training_recipe
from lmembed.training.train_config import ObjectiveConfig, TrainConfig, TrainConfigError


def test_yaml_lines_name_every_key_and_item():
    data, lines = load_yaml_with_lines("a: 1\nb:\n  c: [x, y]\n  d:\n    - {e: 2}\n")
    assert data == {"a": 1, "b": {"c": ["x", "y"], "d": [{"e": 2}]}}
    assert lines[("a",)] == 1 and lines[("b",)] == 2 and lines[("b", "c")] == 3
    assert lines[("b", "d")] == 4 and lines[("b", "d", 0)] == 5 and lines[("b", "d", 0, "e")] == 5


def test_a_key_given_twice_is_refused_naming_both_lines_but_an_anchor_may_be_overridden(tmp_path):
    """``steps: 1`` ... ``steps: 2`` in a config trained 2 steps without a word (YAML keeps the last value)."""
    path = tmp_path / "train.yaml"
    path.write_text("steps: 1\nlr: 0.001\nsteps: 2\n")
    with pytest.raises(TrainConfigError, match=r"train.yaml:3: invalid YAML \(key 'steps' is given twice \(first on"):
        TrainConfig.from_yaml(path)
    for nested in ("a:\n  b: 1\n  b: 2\n", "a: [{x: 1, x: 2}]\n"):
        with pytest.raises(Exception, match="is given twice"):
            load_yaml_with_lines(nested)
    base = "base: &b {lr: 1, steps: 2}\narm:\n  <<: *b\n  lr: 3\n"  # a merged key overridden: YAML's own way
    assert load_yaml_with_lines(base)[0]["arm"] == {"lr": 3, "steps": 2}


def test_aliases_that_expand_without_end_are_refused_naming_the_file_and_line(tmp_path):
    """Nested aliases ("billion laughs": 9 levels of 9 took every byte of memory) and a node that contains itself
    (a RecursionError) are invalid YAML, refused in well under a second; ordinary aliases still work."""
    bomb, previous = "steps: 1\na: &a [x, x, x, x, x, x, x, x, x]\n", "a"
    for name in "bcdefghi":
        bomb += f"{name}: &{name} [{', '.join([f'*{previous}'] * 9)}]\n"
        previous = name
    path = tmp_path / "train.yaml"
    for text, problem in (
        (bomb, "more than 100,000 values once its aliases are expanded"),
        ("steps: 1\na: &a [*a]\n", "an alias refers to a node that contains it"),
        ("steps: 1\nx: &x {y: *x}\n", "an alias refers to a node that contains it"),
    ):
        path.write_text(text)
        with pytest.raises(TrainConfigError, match=rf"train.yaml:2: invalid YAML \(.*{problem}"):
            TrainConfig.from_yaml(path)
    shared = "base: &b [1, 2]\nuses: [*b, *b]\n"
    assert load_yaml_with_lines(shared)[0] == {"base": [1, 2], "uses": [[1, 2], [1, 2]]}


def test_where_names_the_nearest_line_and_builds_the_files_own_error():
    where = Where("run.yaml", {("train",): 3, ("train", "steps"): 4}, TrainConfigError)
    assert where(("train", "steps")) == "run.yaml:4: train.steps"
    assert where(("train", "lr")) == "run.yaml:3: train.lr"  # a key the file lacks: its parent's line
    error = where.error(("train", "steps"), "must be >= 1")
    assert isinstance(error, TrainConfigError) and str(error) == "run.yaml:4: train.steps: must be >= 1"
    assert Where("")(("steps",)) == "steps"  # a mapping built in code: the key path alone


@dataclass
class _Toy:
    steps: int = 1
    lr: float = 0.1
    name: str | None = None
    extra: dict | None = None


def test_check_fields_is_strict_on_plain_types_and_forbids_unknown_keys():
    where = Where("toy.yaml", {("toy",): 1, ("toy", "steps"): 2, ("toy", "bogus"): 3}, ValueError)
    with pytest.raises(
        ValueError, match=r"^toy\.yaml:3: toy\.bogus: unknown option; toy\.yaml:2: toy\.steps: expected int"
    ):
        check_fields(_Toy, {"steps": "7", "bogus": 1}, where, prefix=("toy",))
    with pytest.raises(ValueError, match=r"toy\.name: expected str or null, got 3"):
        check_fields(_Toy, {"name": 3}, where, prefix=("toy",))
    with pytest.raises(ValueError, match=r"lr: expected float, got True"):
        check_fields(_Toy, {"lr": True}, where)
    check_fields(_Toy, {"steps": 3, "lr": 1, "name": None, "extra": {"anything": [1]}}, where)  # no error


def test_a_training_config_file_names_the_file_line_and_key(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("model: minilm\nsteps: 10\nlr: 2e-5\nbogus: 1\n")
    with pytest.raises(TrainConfigError) as caught:
        TrainConfig.from_yaml(path)
    message = str(caught.value)
    assert f"{path}:4: bogus: unknown training option" in message
    assert f"{path}:3: lr: expected float, got '2e-5' (YAML reads 2e-5 as text: write 2.0e-5)" in message
    path.write_text("model: minilm\nlr: 2.0e-5\n")
    assert TrainConfig.from_yaml(path).lr == 2e-5


def test_an_experiment_file_names_the_line_of_a_mistyped_training_option():
    text = (
        "model: minilm\narms:\n  tuned:\n    train:\n      data: [rows.jsonl]\n      steps: many\n"
        "evaluate: {tasks: [scifact]}\n"
    )
    data, lines = load_yaml_with_lines(text)
    with pytest.raises(
        ExperimentSpecError, match=r"^exp\.yaml:6: arms\.tuned\.train\.steps: expected int, got 'many'$"
    ):
        parse_spec(data, "exp.yaml", lines)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("      loss: infonse\n", r"arms\.tuned\.train\.loss: unknown loss 'infonse'; available: "),
        ("      loss_kwargs: {temprature: 0.1}\n", r"arms\.tuned\.train\.loss_kwargs: loss 'infonce' has no option"),
    ],
)
def test_an_experiment_arms_loss_is_checked_before_any_run(extra, message):
    """An arm's mistyped loss was found only after the arms before it had run (each a full evaluation)."""
    text = (
        "model: minilm\narms:\n  base: {}\n  tuned:\n    train:\n      data: [rows.jsonl]\n      steps: 1\n"
        f"{extra}evaluate: {{tasks: [scifact]}}\n"
    )
    data, lines = load_yaml_with_lines(text)
    with pytest.raises(ExperimentSpecError, match=rf"^exp\.yaml:8: {message}"):
        parse_spec(data, "exp.yaml", lines)


def test_a_synthesis_recipe_names_the_line_of_a_bad_value(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("version: 2\nkind: sonnet\n")
    with pytest.raises(SynthesisRecipeError, match=rf"^{re.escape(str(path))}:2: kind: 'kind' must be one of"):
        load_recipe(path)


def test_a_synthesis_recipe_that_is_not_utf8_names_its_line(tmp_path):
    """It was decoded with errors='replace': a Latin-1 prompt became U+FFFD in every generated row."""
    from lmembed.io import DataFormatError

    path = tmp_path / "mine.yaml"
    path.write_bytes(b"version: 2\nkind: corpus\nprompt: caf\xe9\n")
    with pytest.raises(DataFormatError, match=rf"^{re.escape(str(path))}:3: not valid UTF-8"):
        load_recipe(path)


def test_a_training_recipe_names_the_line_of_a_mistake(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("model: m\nstages:\n  - name: a\n  - name: a\n")
    with pytest.raises(RecipeError, match=rf"^{re.escape(str(path))}:4: stage 2: stage name 'a' is used twice$"):
        load_training_recipe(path)
    path.write_text("model: m\nstages:\n  - name: a\nstagez: []\n")
    with pytest.raises(RecipeError, match=rf"^{re.escape(str(path))}:4: stagez: unknown top-level key 'stagez'"):
        load_training_recipe(path)


def test_training_reuses_the_model_options_and_the_lora_group():
    """One declaration per option: training's model side is ModelOptions' fields (training's device default is
    auto, a GPU when there is one) and LoraOptions' fields, flags and help included."""
    train_flags, model_flags, lora_flags = flags_of(TrainConfig), flags_of(ModelOptions), flags_of(LoraOptions)
    for name in ("pooling", "attention", "max_length", "device"):
        assert train_flags[name] == model_flags[name], name
    assert all(train_flags[name] == spec for name, spec in lora_flags.items())
    assert ModelOptions().device == "cpu" and TrainConfig().device == "auto" and ObjectiveConfig().device == "cpu"
    assert (TrainConfig().lora_r, TrainConfig().lora_alpha, LoraOptions().lora_dropout) == (16, 32, 0.1)


def test_train_options_are_generated_from_the_config_fields():
    """Every TrainConfig field with a flag is an option of `lmembed train`, with its declarations; --help shows
    TrainConfig's default, and no help text repeats a default by hand ('LoRA rank (16).')."""
    command = typer.main.get_command(app).commands["train"]
    declared = {opt for param in command.params for opt in (*param.opts, *param.secondary_opts)}
    for spec in flags_of(TrainConfig).values():
        assert {d for decl in spec.decls for d in decl.split("/")} <= declared, spec.decls
        assert not re.search(r"\(\d[\d.e-]*\)", spec.help), spec.help
    assert {"--weight", "--instruction", "--config", "--recipe", "-m", "-o"} <= declared
    # a default is TrainConfig's own (shown by --help); a value the command line did not give is dropped by its
    # parameter source, so a --config file's value stays (tests/cli/test_option_groups.py)
    fields = {f.name: f for f in dataclasses.fields(TrainConfig)}
    defaults = {
        spec.name.lstrip("-").replace("-", "_"): fields[name].default for name, spec in flags_of(TrainConfig).items()
    }
    for param in command.params:
        if param.name != "help" and param.default is not None:
            assert param.default == defaults[param.name], (param.name, param.default)
    result = CliRunner().invoke(app, ["train", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    lora_r = next(line for line in result.output.splitlines() if "--lora-r " in line)
    assert "LoRA rank." in lora_r and "16" in lora_r


def test_the_recipe_modules_import_one_way():
    """training/recipes.py is split in three, each importing only those below it: the stage runner (recipes)
    → the data preparation (recipe_data) → the file's schema (recipe_schema), which runs nothing."""
    import ast

    import lmembed.training as training

    folder = Path(training.__file__).parent
    order = ["recipes", "recipe_data", "recipe_schema"]
    for index, name in enumerate(order):
        tree = ast.parse((folder / f"{name}.py").read_text())
        imported = {
            node.module.rsplit(".", 1)[-1]
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("lmembed.training.")
        }
        assert not imported & set(order[: index + 1]), (name, sorted(imported))
    assert "lmembed.training.recipe_data" in (folder / "recipes.py").read_text()
