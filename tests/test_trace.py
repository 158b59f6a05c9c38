"""A traced step replays the operators it recorded, and refuses one that reads the host.

:class:`~grab_exp.trace.TracedStep` is the CPU's analogue of a CUDA graph; the whole training
step's capture, traced and replayed, is tested in ``tests/runner/training/test_capture.py``.
"""

from __future__ import annotations

import pytest
import torch
from support.helpers import make

from grab_exp.trace import CaptureError, TracedStep


@pytest.mark.parametrize(
    "read",
    [
        lambda x: x * 2 if x.sum() > 0 else x,  # a branch on a tensor
        lambda x: x * x.sum().item(),
        lambda x: x * x.tolist()[0],  # no aten operator: the TorchFunctionMode sees it
        lambda x: torch.from_numpy(x.numpy() * 2),
    ],
    ids=["branch", "item", "tolist", "numpy"],
)
def test_a_host_read_in_a_step_fails_the_capture(read):
    with pytest.raises(CaptureError, match="host"):
        TracedStep(read, (torch.ones(3),))


def test_a_pair_step_replayed_after_an_odd_sized_step_is_refused():
    """Pair balance's lead is the parity of the rows stepped: a captured even step is right at
    every replay, unless an odd-sized step changed the parity in between; that is refused."""
    bal = make("pair", 40, 5)
    z, order = torch.randn(40, 5), bal.order
    bal.step(z[order[0:4]])
    traced = TracedStep(bal.step, (z[order[4:8]],))  # made without a lead
    bal.step(z[order[8:11]])  # odd-sized: the example at 10 now leads
    traced.replay()
    with pytest.raises(ValueError, match="odd-sized step"):
        bal.set_epoch(1)


def test_a_replay_repeats_the_first_steps_python_values():
    """The analogue of a CUDA graph: Python values are baked in, tensors are read anew."""
    counter = {"calls": 0}
    total = torch.zeros(())

    def step(x: torch.Tensor) -> torch.Tensor:
        counter["calls"] += 1
        total.add_(x.sum() * counter["calls"])
        return total

    x = torch.ones(2)
    traced = TracedStep(step, (x,))
    x.fill_(3.0)
    traced.replay()
    assert counter["calls"] == 1  # the replay ran no Python
    assert total.item() == 2.0 + 6.0  # 1 * sum(ones) at the trace, then 1 * sum(3s)
