"""Device identity after normalizing the index (``cuda`` is ``cuda:0`` when 0 is the current
device; ``cpu:0`` is ``cpu``): factored gradients already on the balance's device stay as they
are, so a Linear layer's bias stays in its layer's factors."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from grab_exp.devices import same_device
from grab_exp.grads.batch import grad_rows
from grab_exp.models import LeNet
from grab_exp.per_sample import FactoredPerSample


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        (torch.device("cpu"), torch.device("cpu", 0), True),
        ("cpu:0", "cpu", True),
        (torch.device("cpu"), torch.device("meta"), False),
        (torch.device("cuda", 1), "cuda:1", True),
        (torch.device("cuda", 0), torch.device("cuda", 1), False),
        (torch.device("cpu"), torch.device("cuda", 0), False),
    ],
)
def test_devices_compare_after_normalizing_the_index(a, b, same):
    assert same_device(a, b) is same


@pytest.mark.parametrize(
    ("device", "asked"),
    [
        ("cpu", torch.device("cpu", 0)),
        pytest.param("cuda", torch.device("cuda"), marks=pytest.mark.gpu),
    ],
)
def test_factored_grads_on_the_balance_device_stay_as_they_are(device, asked):
    torch.manual_seed(0)
    x, y = torch.randn(8, 3, 32, 32, device=device), torch.randint(0, 10, (8,), device=device)
    model = LeNet().to(device)
    _, grads = FactoredPerSample(model, F.cross_entropy)(x, y)
    d = sum(p.numel() for p in model.parameters())
    rows = grad_rows(grads, d, asked, torch.float32)
    assert rows is grads  # not rebuilt: each Linear's bias stays with its factors
    factored = [c.stop - c.start for c, b in zip(rows.columns, rows.blocks, strict=True)]
    assert factored[-3:] == [48000 + 120, 10080 + 84, 840 + 10]  # fc1, fc2, fc3 with biases
