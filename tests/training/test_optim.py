"""The optimisation step every training loop shares: a loss or gradient that is not finite stops the run before
any weight changes (the weights of the step before are kept)."""

import math

import pytest
import torch

from lmembed.training.metrics_log import MetricsLog
from lmembed.training.optim import DivergedError, OptimisationStep


class _Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 2)
        self.changed = 0

    def named_trainable_parameters(self):
        return self.named_parameters()

    def weights_changed(self) -> None:
        self.changed += 1


def _step(tmp_path, model: _Model) -> OptimisationStep:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    return OptimisationStep(
        model,
        optimizer,
        scheduler,
        max_grad_norm=1.0,
        metrics=MetricsLog(tmp_path / "m.jsonl", True),
        log_every=1,
        total_steps=3,
    )


def _backward(model: _Model, scale: float):
    def run():
        loss = model.linear(torch.ones(1, 4)).sum() * scale
        loss.backward()
        return loss.detach(), {}

    return run


def test_a_finite_step_updates_the_weights_and_is_recorded(tmp_path):
    model = _Model()
    before = model.linear.weight.detach().clone()
    record = _step(tmp_path, model)(1, _backward(model, 1.0))
    assert math.isfinite(record["loss"]) and model.changed == 1
    assert not torch.equal(before, model.linear.weight)


@pytest.mark.parametrize(("scale", "what"), [(float("nan"), "loss is nan"), (float("inf"), "loss is -?inf")])
def test_a_loss_that_is_not_finite_stops_before_any_weight_changes(tmp_path, scale, what):
    model = _Model()
    step = _step(tmp_path, model)
    step(1, _backward(model, 1.0))
    kept = {name: p.detach().clone() for name, p in model.named_parameters()}
    with pytest.raises(DivergedError, match=f"step 2: the {what}"):
        step(2, _backward(model, scale))
    assert all(torch.equal(kept[name], p) for name, p in model.named_parameters())
    assert model.changed == 1 and all(p.grad is None for p in model.parameters())
    assert [r["step"] for r in step.metrics.records] == [1]


def test_a_gradient_that_is_not_finite_stops_before_any_weight_changes(tmp_path):
    model = _Model()
    kept = model.linear.weight.detach().clone()

    def run():
        loss = model.linear(torch.ones(1, 4)).sum()
        loss.backward()
        model.linear.weight.grad[0, 0] = float("inf")  # a finite loss whose gradient overflowed
        return loss.detach(), {}

    with pytest.raises(DivergedError, match="step 1: the gradient norm is inf"):
        _step(tmp_path, model)(1, run)
    assert torch.equal(kept, model.linear.weight) and model.changed == 0
