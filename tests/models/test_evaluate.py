"""Whole-split evaluation: the same numbers as a plain per-batch loop in the default layout."""

from __future__ import annotations

import torch
from torch.nn import functional as F

from grab_exp.models.evaluate import evaluate
from grab_exp.models.lenet import LeNet
from grab_exp.models.mlp import MLP


def _reference(model, x, y, batch_size):
    model.eval()
    with torch.no_grad():
        logits = torch.cat([model(x[s : s + batch_size]) for s in range(0, len(x), batch_size)])
    loss = F.cross_entropy(logits.double(), y, reduction="mean")
    return loss, (logits.argmax(1) == y).double().mean()


def test_lenet_evaluation_equals_the_default_layout_loop():
    torch.manual_seed(0)
    model = LeNet().double()
    x = torch.randn(70, 3, 32, 32, dtype=torch.float64)  # 70: a last partial batch
    y = torch.randint(0, 10, (70,))
    loss, acc = evaluate(model, x, y, batch_size=32)
    assert model.training  # the mode is restored
    ref_loss, ref_acc = _reference(model, x, y, 32)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-12, atol=0)
    assert acc == ref_acc


def test_non_image_inputs_keep_their_layout():
    torch.manual_seed(0)
    model = MLP(in_features=12, hidden=(8,), num_classes=3).double()
    x, y = torch.randn(10, 12, dtype=torch.float64), torch.randint(0, 3, (10,))
    loss, acc = evaluate(model, x, y, batch_size=4)
    ref_loss, ref_acc = _reference(model, x, y, 4)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-12, atol=0)
    assert acc == ref_acc
