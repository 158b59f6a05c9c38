"""Per-sample gradients: one interface, four methods, and the training pipelines.

* :mod:`~grab_exp.per_sample.base`: :class:`PerSampleGradients`, the abstract base and its
  contract (``loss, grads = psg(x, y)`` also writes the batch's mean gradient to ``param.grad``);
* :mod:`~grab_exp.per_sample.func`: ``method=func``, whole-model ``vmap(grad)`` (any model);
* :mod:`~grab_exp.per_sample.hooks`: ``method=hooks`` / ``factored``, one backward pass;
  per-layer :mod:`~grab_exp.per_sample.rules`, else the per-layer
  :mod:`~grab_exp.per_sample.fallback`, reading the batch where
  :mod:`~grab_exp.per_sample.layout` found it;
* :mod:`~grab_exp.per_sample.check`: every path's rows and the loss contract, checked on the
  first call, on a schedule and on every new kind of batch (one extra backward, no float64
  copy); :mod:`~grab_exp.per_sample.modules`: BatchNorm, dropout
  and the refusal; :mod:`~grab_exp.per_sample.batchnorm`: BatchNorm to GroupNorm;
* :mod:`~grab_exp.per_sample.loop`: ``method=loop``, one forward and backward per example, the
  fail-closed last resort (every call compares the rows' mean with ``param.grad``);
* :mod:`~grab_exp.per_sample.auto`: ``method=auto``, the hook path or, once a call of it
  refuses the model, ``func``, then ``loop`` (with a warning);
* :mod:`~grab_exp.per_sample.compiled`: ``torch.compile`` of a step's gradients;
* :mod:`~grab_exp.per_sample.pipeline`: :func:`make_per_sample` (method by name, ``auto``
  resolved in one place) and :class:`ClassicPipeline` / :class:`PerSamplePipeline`, what a
  training step of the runner calls.
"""

from grab_exp.per_sample.auto import AutoPerSample
from grab_exp.per_sample.base import PerSampleGradients
from grab_exp.per_sample.batchnorm import batchnorm_to_groupnorm
from grab_exp.per_sample.compiled import COMPILE_MODES
from grab_exp.per_sample.func import RANDOMNESS_CHOICES, FuncPerSample
from grab_exp.per_sample.hooks import FactoredPerSample, HookedPerSample, check_supported
from grab_exp.per_sample.loop import LoopPerSample
from grab_exp.per_sample.modules import LossContractError, UnsupportedModelError, UserCodeError
from grab_exp.per_sample.pipeline import (
    METHODS,
    ClassicPipeline,
    PerSamplePipeline,
    hooks_supported,
    make_per_sample,
    resolve_method,
)

__all__ = [
    "COMPILE_MODES",
    "METHODS",
    "RANDOMNESS_CHOICES",
    "AutoPerSample",
    "ClassicPipeline",
    "FactoredPerSample",
    "FuncPerSample",
    "HookedPerSample",
    "LoopPerSample",
    "LossContractError",
    "PerSampleGradients",
    "PerSamplePipeline",
    "UnsupportedModelError",
    "UserCodeError",
    "batchnorm_to_groupnorm",
    "check_supported",
    "hooks_supported",
    "make_per_sample",
    "resolve_method",
]
