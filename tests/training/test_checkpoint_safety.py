"""Checkpoints hold no pickle: optimizer, scheduler and RNG state are safetensors + JSON, read back exactly, and a
checkpoint folder someone else planted (the old pickled format, or a malformed state) is refused on ``--resume``
naming the file, without running anything in it."""

from __future__ import annotations

import json
import random
import zipfile

import numpy as np
import pytest
import torch
from safetensors.torch import load_file as safetensors_load
from safetensors.torch import save as safetensors_bytes
from typer.testing import CliRunner

from conftest import build_tokenizer, tiny_model
from helpers import flat, write_jsonl
from lmembed import Embedder, EmbeddingConfig
from lmembed.cli.app import app
from lmembed.training import checkpoint as ckpt

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class Payload:
    """Unpickling this runs ``exec``, which creates ``marker``."""

    def __init__(self, marker) -> None:
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({str(self.marker)!r}, 'w').close()",))


def test_optimizer_scheduler_and_rng_states_round_trip_without_pickle(tmp_path):
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(3, 4)), torch.nn.Parameter(torch.randn(5))]
    optimizer = torch.optim.AdamW(params, lr=1e-3, betas=(0.8, 0.95))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5)
    for _ in range(2):
        for p in params:
            p.grad = torch.randn_like(p)
        optimizer.step()
        scheduler.step()
    for name, state in (("optimizer", optimizer.state_dict()), ("scheduler", scheduler.state_dict())):
        path = tmp_path / f"{name}.safetensors"
        ckpt.write_state(path, state)
        assert not zipfile.is_zipfile(path)  # not torch.save's pickle archive
        back = ckpt.read_state(path)
        assert back.keys() == state.keys()
        assert json.dumps(back, default=repr, sort_keys=True) == json.dumps(state, default=repr, sort_keys=True)
    back = ckpt.read_state(tmp_path / "optimizer.safetensors")
    assert back["param_groups"][0]["betas"] == (0.8, 0.95)  # tuples stay tuples
    assert list(back["state"]) == [0, 1]  # integer keys stay integers
    torch.testing.assert_close(back["state"][1]["exp_avg_sq"], optimizer.state_dict()["state"][1]["exp_avg_sq"])

    state = ckpt.capture_rng()
    ckpt.write_state(tmp_path / "rng.safetensors", state)
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    ckpt.restore_rng(ckpt.check_rng(ckpt.read_state(tmp_path / "rng.safetensors"), tmp_path))
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected


@pytest.fixture
def run(tmp_path):
    """A saved tiny model, training rows, and the command line of a 2-step run that checkpoints every step."""
    tok = build_tokenizer()
    model_dir = tmp_path / "model"
    Embedder.from_model(
        tiny_model("llama", len(tok)), tok, EmbeddingConfig(pooling="mean"), use_cache=False, show_progress=False
    ).save(model_dir)
    rows = [{"query": "the cat sat", "positive": "a cat on a mat"}, {"query": "a dog", "positive": "the dog sat"}] * 2
    data = write_jsonl(tmp_path / "rows.jsonl", rows)
    output = tmp_path / "run"
    return command(model_dir, data, output), output


def command(model_dir, data, output) -> list[str]:
    args = ["train", "-m", str(model_dir), "--data", str(data), "-o", str(output), "--batch-size", "2"]
    return [*args, "--save-every", "1", "--lr", "1e-3", "--warmup-steps", "1", "--lora-dropout", "0.1"]


def train(args: list[str], steps: int, *extra: str):
    return CliRunner().invoke(app, [*args, "--steps", str(steps), *extra])


def test_resume_refuses_an_old_pickled_checkpoint_without_running_it(run, tmp_path):
    args, output = run
    assert train(args, 2).exit_code == 0
    step = output / "checkpoints" / "step-0000002"
    assert sorted(p.name for p in step.iterdir()) == [
        "optimizer.safetensors",
        "rng-rank0.safetensors",
        "scheduler.safetensors",
        "state.json",
        "trainable.safetensors",
    ]
    marker = tmp_path / "ran"
    (step / "optimizer.safetensors").unlink()
    torch.save({"state": {}, "param_groups": [], "payload": Payload(marker)}, step / "optimizer.pt")
    result = train(args, 3, "--resume")
    assert result.exit_code == 2, result.output
    assert f"{step / 'optimizer.pt'}: this checkpoint was written by an older lmembed as pickles" in result.output
    assert "weights_only" not in result.output and "Traceback" not in result.output
    assert not marker.exists()


def test_resume_refuses_a_malformed_state_naming_the_file(run):
    args, output = run
    assert train(args, 2).exit_code == 0
    step = output / "checkpoints" / "step-0000002"
    forged = {"format": 1, "state": {"object": "os.system"}}
    (step / "scheduler.safetensors").write_bytes(safetensors_bytes({}, metadata={ckpt.STATE_KEY: json.dumps(forged)}))
    _record_sha256(step, "scheduler.safetensors")  # a forgery that rewrites state.json too passes the checksum ...
    result = train(args, 3, "--resume")
    assert result.exit_code == 2, result.output
    # ... and is refused by what the state holds, nothing in it run
    assert f"{step / 'scheduler.safetensors'}: the state holds a value lmembed does not store" in result.output


def _record_sha256(step, name: str) -> None:
    info = json.loads((step / ckpt.STATE_FILE).read_text())
    info[ckpt.FILES_KEY][name] = ckpt.sha256_file(step / name)
    (step / ckpt.STATE_FILE).write_text(json.dumps(info))


@pytest.mark.parametrize("name", ["trainable.safetensors", "optimizer.safetensors", "rng-rank0.safetensors"])
def test_a_file_changed_after_its_checkpoint_was_written_is_refused(run, name):
    """Every file of a checkpoint is covered by the sha256 its state.json records: one byte changed in any of them
    (a damaged disk, a copy cut short, a hand edit) is refused naming the file and the field, before it is read."""
    args, output = run
    assert train(args, 2).exit_code == 0
    step = output / "checkpoints" / "step-0000002"
    info = json.loads((step / ckpt.STATE_FILE).read_text())
    assert set(info[ckpt.FILES_KEY]) == {p.name for p in step.iterdir()} - {ckpt.STATE_FILE}
    data = bytearray((step / name).read_bytes())
    data[-1] ^= 0x01  # the last byte: tensor data, so the file still parses
    (step / name).write_bytes(bytes(data))
    result = train(args, 3, "--resume")
    assert result.exit_code == 2, result.output
    said = " ".join(result.output.split())
    assert f"{step / name}: its sha256 is not the one" in said and f"(files.{name})" in said, said


def test_a_checkpoint_file_linked_out_of_its_folder_is_refused(run, tmp_path):
    args, output = run
    assert train(args, 2).exit_code == 0
    step = output / "checkpoints" / "step-0000002"
    outside = tmp_path / "elsewhere.safetensors"
    (step / "optimizer.safetensors").rename(outside)
    (step / "optimizer.safetensors").symlink_to(outside)
    result = train(args, 3, "--resume")
    assert result.exit_code == 2, result.output
    assert "files.optimizer.safetensors" in " ".join(result.output.split()), result.output


def test_a_checkpoint_from_before_checksums_still_resumes_with_a_warning(run, caplog):
    args, output = run
    assert train(args, 2).exit_code == 0
    step = output / "checkpoints" / "step-0000002"
    info = json.loads((step / ckpt.STATE_FILE).read_text())
    del info[ckpt.FILES_KEY]
    (step / ckpt.STATE_FILE).write_text(json.dumps(info))
    with caplog.at_level("WARNING", logger="lmembed.training.checkpoint"):
        result = train(args, 3, "--resume")
    assert result.exit_code == 0, result.output
    assert any("written without checksums" in r.getMessage() for r in caplog.records)
    latest = output / "checkpoints" / "step-0000003"
    assert ckpt.FILES_KEY in json.loads((latest / ckpt.STATE_FILE).read_text())  # the next one has them


@pytest.mark.parametrize(
    ("rng", "message"),
    [
        ({"python": (3, (1, 2), None), "numpy": None, "torch": None}, "'python' is not a Mersenne Twister state"),
        ("not a dict", "expected the python, numpy and torch generators"),
    ],
)
def test_a_malformed_rng_state_is_refused(tmp_path, rng, message):
    path = tmp_path / "rng-rank0.safetensors"
    ckpt.write_state(path, rng)
    with pytest.raises(ckpt.CheckpointError, match=message):
        ckpt.check_rng(ckpt.read_state(path), path)


def test_a_resumed_run_continues_exactly(run, tmp_path):
    args, output = run
    other = command(tmp_path / "model", tmp_path / "rows.jsonl", tmp_path / "straight")  # same run, uninterrupted
    assert train(other, 3).exit_code == 0
    assert train(args, 2).exit_code == 0
    result = train(args, 3, "--resume")
    assert result.exit_code == 0, result.output

    def losses(folder):
        return [json.loads(line)["loss"] for line in (folder / "metrics.jsonl").read_text().splitlines()]

    assert losses(output) == losses(tmp_path / "straight")


def test_a_resume_on_data_changed_since_the_checkpoint_is_refused(run, tmp_path):
    """The checkpoint records the digest of the rows trained on: a data file rewritten while the run was stopped
    (same path) is refused naming the checkpoint and ``data_digest``; it resumed on the new rows without a word."""
    args, _ = run
    assert train(args, 2).exit_code == 0
    write_jsonl(tmp_path / "rows.jsonl", [{"query": "a bird", "positive": "the bird sang"}] * 4)
    result = train(args, 3, "--resume")
    assert result.exit_code == 2, result.output
    said = " ".join(result.output.replace("│", " ").split())
    assert "data_digest: the training rows are not the ones this run was trained on up to step 2" in said
    assert "step-0000002" in said


def test_a_damaged_latest_checkpoint_names_the_earlier_one_to_resume_from(run, tmp_path):
    """The refusal named the damaged file, but not that the checkpoint before it was whole nor how to resume from
    it; it now says both, and doing what it says resumes."""
    args, output = run
    assert train(args, 2).exit_code == 0
    step = output / "checkpoints" / "step-0000002"
    data = bytearray((step / "trainable.safetensors").read_bytes())
    data[-1] ^= 0x01
    (step / "trainable.safetensors").write_bytes(bytes(data))
    result = train(args, 3, "--resume")
    assert result.exit_code == 2, result.output
    said = " ".join(result.output.split())
    assert "earlier checkpoints (step-0000001)" in said and "move step-0000002 out of" in said, said
    assert "to resume from step-0000001" in said, said
    step.rename(tmp_path / "set-aside")
    resumed = train(args, 3, "--resume")
    assert resumed.exit_code == 0, resumed.output
    assert (output / "checkpoints" / "step-0000003").is_dir()


def _forge_state(step, name: str, change) -> None:
    """Rewrite the state in ``name`` through ``change`` and re-record its sha256, as someone forging it would."""
    state = ckpt.read_state(step / name)
    change(state)
    (step / name).unlink()
    ckpt.write_state(step / name, state)
    _record_sha256(step, name)


def _set_group(key, value):
    def change(state):
        state["param_groups"][0][key] = value

    return change


def _set_moment(state):
    state["state"][0]["exp_avg"] = torch.zeros(2, 2)


def _set_params(state):
    state["param_groups"][0]["params"] = [10**6]


def _set_sched(key, value):
    def change(state):
        state[key] = value

    return change


def _set_base_lrs_nan(state):
    state["base_lrs"] = [float("nan")] * len(state["base_lrs"])


def _set_lambda(state):
    state["lr_lambdas"][0]["warmup"] = "x"


def _set_total(state):
    state["lr_lambdas"][0]["total"] = 0


@pytest.mark.parametrize(
    ("name", "change", "said"),
    [
        ("optimizer.safetensors", _set_group("lr", float("inf")), "param_groups[0].lr=inf"),
        ("optimizer.safetensors", _set_group("lr", "0.1"), "param_groups[0].lr='0.1'"),
        ("optimizer.safetensors", _set_group("lr", -1.0), "param_groups[0].lr=-1.0 is out of range"),
        ("optimizer.safetensors", _set_group("betas", "x"), "param_groups[0].betas='x'"),
        ("optimizer.safetensors", _set_group("betas", (0.9, 1.5)), "param_groups[0].betas=(0.9, 1.5) is out of range"),
        ("optimizer.safetensors", _set_group("eps", 0.0), "param_groups[0].eps=0.0 is out of range"),
        ("optimizer.safetensors", _set_moment, "state[0].exp_avg has shape (2, 2)"),
        ("optimizer.safetensors", _set_params, "param_groups[0].params are not the parameters"),
        ("scheduler.safetensors", _set_lambda, "lr_lambdas="),
        ("scheduler.safetensors", _set_total, "lr_lambdas[0]"),
        ("scheduler.safetensors", _set_sched("last_epoch", 10**30), "last_epoch=10"),
        ("scheduler.safetensors", _set_sched("last_epoch", 1e30), "last_epoch="),
        ("scheduler.safetensors", _set_base_lrs_nan, "base_lrs=[nan"),
    ],
)
def test_a_forged_optimizer_or_scheduler_setting_is_refused(run, name, change, said):
    """An optimizer or scheduler state whose hashes were re-recorded is checked against this run's own: a learning
    rate of inf trained to non-finite weights with exit 0, other values ended in internal errors (exit 1)."""
    args, output = run
    assert train(args, 2).exit_code == 0
    step = output / "checkpoints" / "step-0000002"
    _forge_state(step, name, change)
    result = train(args, 3, "--resume")
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.replace("│", " ").split())
    assert f"{step / name}:" in text.replace(" ", "") or f"{step / name}" in text, text
    assert said in text, text
    assert "internal error" not in text


@pytest.mark.parametrize(
    ("field", "value", "said"),
    [("step", 10**12, "step=1000000000000 is past"), ("world_size", 0, "world_size=0")],
)
def test_a_forged_checkpoint_step_or_world_size_is_refused(run, field, value, said):
    args, output = run
    assert train(args, 2).exit_code == 0
    step = output / "checkpoints" / "step-0000002"
    info = json.loads((step / ckpt.STATE_FILE).read_text())
    info[field] = value
    (step / ckpt.STATE_FILE).write_text(json.dumps(info))
    result = train(args, 3, "--resume")
    assert result.exit_code == 2, result.output
    assert said in " ".join(result.output.replace("│", " ").split())


def test_a_trainable_tensor_of_the_wrong_shape_names_the_file(run):
    args, output = run
    assert train(args, 2).exit_code == 0
    step = output / "checkpoints" / "step-0000002"
    tensors = safetensors_load(step / "trainable.safetensors")
    first = next(iter(tensors))
    tensors[first] = torch.zeros(3, 3)
    (step / "trainable.safetensors").write_bytes(safetensors_bytes(tensors))
    _record_sha256(step, "trainable.safetensors")
    result = train(args, 3, "--resume")
    assert result.exit_code == 2, result.output
    text = "".join(result.output.replace("│", " ").split())
    assert f"{step / 'trainable.safetensors'}:checkpointdoesnotmatch" in text, result.output


@pytest.mark.parametrize("name", ["/etc/passwd", "../../rows.jsonl", "absent.safetensors"])
def test_a_recorded_file_that_is_not_a_file_of_the_checkpoint_is_refused(run, name):
    """``files`` naming something outside the checkpoint folder (or nothing) was ignored; it is refused by name."""
    args, output = run
    assert train(args, 2).exit_code == 0
    step = output / "checkpoints" / "step-0000002"
    info = json.loads((step / ckpt.STATE_FILE).read_text())
    info[ckpt.FILES_KEY][name] = "0" * 64
    (step / ckpt.STATE_FILE).write_text(json.dumps(info))
    result = train(args, 3, "--resume")
    assert result.exit_code == 2, result.output
    assert repr(name) in result.output or name in result.output


def test_a_checkpoint_of_another_format_is_refused_naming_the_field(run):
    """``state.json`` carried no format: a checkpoint written by a newer lmembed resumed silently, however it was laid
    out."""
    args, output = run
    assert train(args, 2).exit_code == 0
    state_file = output / "checkpoints" / "step-0000002" / "state.json"
    state = json.loads(state_file.read_text())
    assert state["format"] == ckpt.CHECKPOINT_FORMAT
    state_file.write_text(json.dumps({**state, "format": 99}))
    result = train(args, 3, "--resume")
    assert result.exit_code == 2, result.output
    assert f"{state_file}: format: 99; this lmembed reads checkpoints of format 1" in flat(result.output)
