"""``method=loop``: one example at a time, the fail-closed last resort (``auto`` takes it last).

Example ``i``'s row is the gradient of its own loss ``loss_fn(model(x[i:i+1]), y[i:i+1])``, the
definition, so any model that runs on one example is right; ``param.grad`` is one plain backward
of the batch, which every call compares with the rows' mean. Cost: ``B`` passes of one example."""

from __future__ import annotations

import torch
from torch import nn

from grab_exp.grads import BatchGrads, as_batch_grads
from grab_exp.per_sample.base import PerSampleGradients
from grab_exp.per_sample.check.loss import loss_of
from grab_exp.per_sample.check.mean import GradSnapshot, dense
from grab_exp.per_sample.check.registrations import hooks_taken
from grab_exp.per_sample.check.rounding import judged_rounding
from grab_exp.per_sample.check.state import draws_since, generator_states, kept_state
from grab_exp.per_sample.layout import Inputs, batch_size, call_model, take
from grab_exp.per_sample.modules import UnsupportedModelError, label, random_modules

__all__ = ["LoopPerSample"]


class LoopPerSample(PerSampleGradients):
    """Per-sample gradients by a loop over the examples; ``check_every=0`` also turns off the
    comparison of the rows' mean with ``param.grad`` (the only check it needs)."""

    method = "loop"
    rows_rounding = staticmethod(judged_rounding)  # float64's examples average to its step's

    def check(self) -> None:
        if drawing := random_modules(self.model):
            where = label(drawing[0], self.model.get_submodule(drawing[0]))
            raise UnsupportedModelError(
                f"{where} draws random numbers in training mode: method=loop's forwards of one "
                "example would draw other masks than the batch's; put it in eval mode, or use "
                "method=hooks (the batch's own masks) or func with randomness='different'"
            )
        super().check()

    def _compute(self, x: Inputs, y) -> tuple[torch.Tensor, BatchGrads]:
        params = self.state.trainable()
        grads = as_batch_grads(self._rows(x, y, params, batch_size(x)))  # {name: (B, *shape)}
        with GradSnapshot(params.values()) as snapshot, torch.enable_grad():
            start = generator_states()
            loss = loss_of(self.loss_fn, call_model(self.model, x), y)  # the batch's own step
            drew, elsewhere = draws_since(start)
            if drew or elsewhere:
                func = "" if elsewhere else " or func with randomness='different'"
                raise UnsupportedModelError(
                    "the model draws random numbers in its forward outside Dropout modules "
                    "(torch.randn_like, F.dropout, numpy's or Python's random): method=loop's "
                    "forwards of one example would draw other numbers than the batch's; use "
                    f"method=hooks (the batch's own draws){func}"
                )
            if loss.requires_grad:
                loss.backward()
            self.verify_and_check((x, y), grads, params, snapshot, None, None)
        return loss.detach(), grads

    def _rows(self, x: Inputs, y, params: dict[str, nn.Parameter], batch: int):
        """``{name: (B, *shape)}``: example ``i``'s gradient of its own loss in row ``i``
        (sparse gradients densified; zeros where the example does not reach a parameter), with
        the parameters' gradient hooks taken away: they run in the batch's backward alone, as in
        a plain step, where one that changes the gradient makes the rows' mean differ."""
        tensors, examples = list(params.values()), [()] * batch
        for i in range(batch):
            with kept_state(self.model), torch.enable_grad():  # buffers and RNG put back
                loss = loss_of(self.extra_loss, call_model(self.model, take(x, [i])), take(y, [i]))
                if loss.requires_grad:  # else no trainable parameter reached it
                    with hooks_taken(p._backward_hooks for p in tensors):
                        examples[i] = torch.autograd.grad(loss, tensors, allow_unused=True)
        return {  # a lazy parameter has its shape once an example ran
            n: torch.stack([dense(grads[k] if grads else None, p) for grads in examples])
            for k, (n, p) in enumerate(params.items())
        }
