"""Shared base of the per-layer tests (like opacus's ``GradSampleHooks_test``).

:func:`check_layer` runs the hook path on a small float64 model containing the layer under test
and checks its per-sample gradients AND the ``param.grad`` mean against a slow per-example loop
of ordinary ``backward()`` calls, with and without the reused buffer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.nn import functional as F

from grab_exp.per_sample import HookedPerSample

ATOL, RTOL = 1e-12, 1e-10


@dataclass
class LayerCase:
    """A model containing the layer under test, and its input.

    Attributes:
        make_model: builds the model (float32; the harness seeds and converts it).
        input_shape: one example's input shape.
        fallback: names of the layers expected to use the torch.func fallback.
        integer_input: the input is class indices below ``input_high`` (e.g. for Embedding).
    """

    make_model: Callable[[], nn.Module]
    input_shape: tuple[int, ...]
    fallback: set[str] = field(default_factory=set)
    integer_input: bool = False
    input_high: int = 10


def make_input(case: LayerCase, rows: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``x (B, *input_shape)`` and labels ``y (B,)`` in ``[0, 3)``."""
    g = torch.Generator().manual_seed(seed)
    if case.integer_input:
        x = torch.randint(0, case.input_high, (rows, *case.input_shape), generator=g)
    else:
        x = torch.randn(rows, *case.input_shape, generator=g, dtype=torch.float64)
    return x, torch.randint(0, 3, (rows,), generator=g)


def per_example_loop(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict:
    """Reference ``name -> (B, *shape)``: one ordinary backward per example (trainable only)."""
    rows: dict[str, list[torch.Tensor]] = {
        n: [] for n, p in model.named_parameters() if p.requires_grad
    }
    for i in range(len(x)):
        model.zero_grad(set_to_none=True)
        F.cross_entropy(model(x[i : i + 1]), y[i : i + 1]).backward()
        for name, g in rows.items():
            g.append(model.get_parameter(name).grad.clone())
    model.zero_grad(set_to_none=True)
    return {name: torch.stack(g) for name, g in rows.items()}


def build(case: LayerCase) -> nn.Module:
    """The case's model, seeded, in float64, with lazy layers materialized."""
    torch.manual_seed(0)
    model = case.make_model().double()
    model(make_input(case, 2, seed=99)[0])  # materialize lazy layers
    return model


def check_layer(case: LayerCase, rows: int = 5) -> HookedPerSample:
    """Assert the hook path equals the per-example loop; return the hooked object (no buffer)."""
    model = build(case)
    x, y = make_input(case, rows, seed=1)
    expected = per_example_loop(model, x, y)
    hooked = HookedPerSample(model, F.cross_entropy)
    assert set(hooked.registry.fallbacks) == case.fallback
    loss, grads = hooked(x, y)
    grads = grads.as_dict()
    assert list(grads) == list(expected)
    for name, want in expected.items():
        got = grads[name]
        assert got.shape == want.shape, name
        torch.testing.assert_close(got, want, atol=ATOL, rtol=RTOL, msg=name)
        torch.testing.assert_close(
            model.get_parameter(name).grad, want.mean(0), atol=ATOL, rtol=RTOL, msg=name
        )
    torch.testing.assert_close(loss, F.cross_entropy(model(x), y).detach(), atol=ATOL, rtol=0)
    _check_buffer(case, model.state_dict(), x, y, grads)
    return hooked


def _check_buffer(case: LayerCase, state: dict, x: torch.Tensor, y: torch.Tensor, fresh: dict):
    """The reused buffer gives the fresh tensors exactly; when it is used, as one (B, d)."""
    model = build(case)
    model.load_state_dict(state)
    reused = HookedPerSample(model, F.cross_entropy, reuse_buffer=True)
    _, grads = reused(x, y)
    assert all(torch.equal(g, fresh[n]) for n, g in grads.as_dict().items())
    if reused.grad_buffer.buffer is not None:
        assert grads.dense().matrix.data_ptr() == reused.grad_buffer.buffer.data_ptr()
