"""Model and engine options are fields of one frozen dataclass each; the command line derives its flags from
them, so every command that loads a model offers the same flags, and a new field is a new flag with no other
edit."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any

import pytest
import typer
from typer.testing import CliRunner

from lmembed.cli.app import app
from lmembed.cli.options import GROUPS_ATTR, Exclude, options_command
from lmembed.options import EngineOptions, ModelOptions, flag, flags_of


@dataclasses.dataclass(frozen=True)
class WithTemperature(ModelOptions):
    """ModelOptions plus one new field, declared nowhere else."""

    temperature: float = flag(1.0, "--temperature", help="A new option, declared once.")


def _commands(group: Any, prefix: str = "") -> dict[str, Any]:
    found = {}
    for name, command in group.commands.items():
        if hasattr(command, "commands"):  # a group (typer's own click)
            found.update(_commands(command, f"{prefix}{name} "))
        else:
            found[prefix + name] = command
    return found


def _flags(command: Any) -> set[str]:
    return {decl.split("/")[0] for param in command.params for decl in (*param.opts, *param.secondary_opts)}


def _groups(command: Any) -> dict:
    return getattr(command.callback, GROUPS_ATTR, {})


@pytest.fixture(scope="module")
def commands() -> dict[str, Any]:
    return _commands(typer.main.get_command(app))


def test_commands_that_load_a_model_take_the_model_options(commands):
    takers = {
        name for name, command in commands.items() if any(g.kind is ModelOptions for g in _groups(command).values())
    }
    assert takers == {"encode", "eval", "index build", "serve", "export", "doctor", "mine"}
    engines = {
        name for name, command in commands.items() if any(g.kind is EngineOptions for g in _groups(command).values())
    }
    assert engines == {"encode", "eval", "index build", "synthesize"}  # the commands that run on Ray


@pytest.mark.parametrize("name", ["encode", "eval", "index build", "serve", "export", "doctor", "mine"])
def test_each_offers_exactly_the_model_options_flags_less_its_exclusions(commands, name):
    (group,) = [g for g in _groups(commands[name]).values() if g.kind is ModelOptions]
    expected = {spec.name for spec in flags_of(ModelOptions).values()}
    excluded = {spec.name for field, spec in flags_of(ModelOptions).items() if field not in group.offered}
    offered = _flags(commands[name])
    assert expected - excluded <= offered
    if name != "export":  # export's own --precision / --calibration have their own help
        assert not excluded & offered
    if name in ("encode", "eval", "index build"):
        assert not excluded, f"{name} leaves out {excluded}"
        assert {spec.name for spec in flags_of(EngineOptions).values()} <= offered


def test_flags_keep_their_help_and_defaults(commands):
    params = {p.name: p for p in commands["encode"].params}
    for field, spec in flags_of(ModelOptions).items():
        assert params[field].help == spec.help
        default = next(f.default for f in dataclasses.fields(ModelOptions) if f.name == field)
        assert params[field].default == default
    assert commands["serve"].params  # serve never caches: no --no-cache, the object says so
    (served,) = _groups(commands["serve"]).values()
    assert served.base.no_cache and "--no-cache" not in _flags(commands["serve"])


def _tiny_app(seen: list) -> typer.Typer:
    tiny = typer.Typer()

    @tiny.command()
    @options_command
    def run(
        name: Annotated[str, typer.Option("--name")] = "x",
        options: Annotated[WithTemperature, Exclude("no_cache")] = WithTemperature(device="cuda"),
        engine: EngineOptions = EngineOptions(),
    ) -> None:
        seen.append((name, options, engine))

    @tiny.command()
    def other() -> None:  # a second command, so that typer keeps the command name
        return None

    return tiny


def test_a_new_field_is_a_new_flag_with_no_other_edit():
    seen: list = []
    tiny = _tiny_app(seen)
    runner = CliRunner()
    result = runner.invoke(tiny, ["run", "--temperature", "0.5", "--layer", "15,16", "--workers", "3", "--name", "y"])
    assert result.exit_code == 0, result.output
    (name, options, engine) = seen[0]
    assert name == "y"
    assert isinstance(options, WithTemperature)
    assert (options.temperature, options.layer, options.device, options.no_cache) == (0.5, (15, 16), "cuda", False)
    assert engine == EngineOptions(workers=3)
    shown = runner.invoke(tiny, ["run", "--help"], env={"COLUMNS": "200"}).output
    assert "--temperature" in shown and "A new option, declared once." in shown
    assert "--no-cache" not in shown  # excluded
    refused = runner.invoke(tiny, ["run", "--no-cache"])
    assert refused.exit_code == 2


def test_a_bad_value_is_refused_naming_its_flag():
    result = CliRunner().invoke(_tiny_app([]), ["run", "--layer", "a,b"])
    assert result.exit_code == 2
    assert "--layer" in result.output and "expected an int or a comma list of ints" in result.output


def test_an_option_offered_twice_is_refused_when_the_command_is_declared():
    def clash(device: str = "cpu", options: ModelOptions = ModelOptions()) -> None:
        return None

    with pytest.raises(TypeError, match="device"):
        options_command(clash)


def test_train_help_shows_defaults_as_every_command_and_a_config_file_still_wins(tmp_path):
    """train's flags show their TrainConfig defaults as other commands do ([default: 16], not '(16)'), and a value
    the command line did not give stays None, so a --config file's value is not overridden by a shown default."""
    from typer.testing import CliRunner

    from lmembed.cli.app import app

    shown = " ".join(CliRunner().invoke(app, ["train", "--help"], env={"COLUMNS": "200"}).output.split())
    assert "LoRA rank. [default: 16]" in shown and "(16)" not in shown
    config = tmp_path / "train.yaml"
    config.write_text("lora_r: 4\n")
    captured = {}

    def keep(config_file, options):
        captured.update(options)
        raise SystemExit(0)

    import lmembed.cli.train as train_module

    original = train_module.build_config
    train_module.build_config = keep
    try:
        CliRunner().invoke(app, ["train", "--config", str(config), "-o", str(tmp_path / "run")])
    finally:
        train_module.build_config = original
    # not given: None, so the file's value (or TrainConfig's) stands (tests/cli/test_bad_input.py: train-loss-option)
    assert captured["lora_r"] is None and captured["lr"] is None and captured["output"] is not None
