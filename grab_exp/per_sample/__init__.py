"""Per-sample gradients: the ``torch.func`` path, the hook path and the training pipelines.

* :mod:`~grab_exp.per_sample.functional`: whole-model ``vmap(grad)`` (any model);
  :class:`PerSampleGradients` is the three-line integration for a user's own loop.
* :mod:`~grab_exp.per_sample.hooks`: one backward pass; per-layer closed forms from the
  :mod:`~grab_exp.per_sample.rules` registry, and a per-layer ``torch.func`` fallback
  (:mod:`~grab_exp.per_sample.fallback`) for trainable layers without a rule.
* :mod:`~grab_exp.per_sample.compiled`: the same through ``torch.compile``.
* :mod:`~grab_exp.per_sample.pipeline`: :class:`ClassicPipeline` / :class:`FunctionalPipeline`,
  what a training step of the runner calls (``method``: :data:`METHODS`).
"""

from grab_exp.per_sample.compiled import COMPILE_MODES
from grab_exp.per_sample.functional import (
    RANDOMNESS_CHOICES,
    PerSampleGradients,
    accumulate_mean,
    per_sample_grads,
)
from grab_exp.per_sample.hooks import (
    HookedPerSampleGradients,
    UnsupportedModelError,
    check_supported,
)
from grab_exp.per_sample.pipeline import (
    METHODS,
    ClassicPipeline,
    FunctionalPipeline,
    hooks_supported,
)

__all__ = [
    "COMPILE_MODES",
    "METHODS",
    "RANDOMNESS_CHOICES",
    "ClassicPipeline",
    "FunctionalPipeline",
    "HookedPerSampleGradients",
    "PerSampleGradients",
    "UnsupportedModelError",
    "accumulate_mean",
    "check_supported",
    "hooks_supported",
    "per_sample_grads",
]
