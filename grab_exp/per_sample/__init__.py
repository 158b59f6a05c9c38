"""Per-sample gradients: one interface, four methods, and the training pipelines.

* :mod:`.base`: the interface; :mod:`.pipeline`: :func:`make_per_sample` and the pipelines;
* :mod:`.func` (``vmap(grad)``), :mod:`.loop` (one example at a time), :mod:`.auto` (the hook
  path, then ``func``, then ``loop``), :mod:`.compiled` (``torch.compile`` of ``func``);
* :mod:`.hooks`: ``method=hooks`` / ``factored``, one step over :mod:`.plan` (the layers, the
  probe), :mod:`.recording` (hooks, the one backward), :mod:`.rows` (rows, the reused buffer),
  per layer :mod:`.rules` or :mod:`.fallback`, where the batch is in :mod:`.layout`;
* :mod:`.check`: what every call and each full check verifies, and when;
* :mod:`.modules`: the refusals and what modules do; :mod:`.batchnorm`: BatchNorm to GroupNorm."""

from grab_exp.per_sample.auto import AutoPerSample
from grab_exp.per_sample.base import PerSampleGradients
from grab_exp.per_sample.batchnorm import batchnorm_to_groupnorm
from grab_exp.per_sample.compiled import COMPILE_MODES
from grab_exp.per_sample.func import RANDOMNESS_CHOICES, FuncPerSample
from grab_exp.per_sample.hooks import FactoredPerSample, HookedPerSample, check_supported
from grab_exp.per_sample.loop import LoopPerSample
from grab_exp.per_sample.modules import (
    InputChangedError,
    LossContractError,
    UnsupportedModelError,
    UserCodeError,
)
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
    "InputChangedError",
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
