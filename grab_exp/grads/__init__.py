"""A batch's per-sample gradients, the one type that ``per_sample`` returns and ``balance`` reads:
:class:`BatchGrads` (:mod:`~grab_exp.grads.batch`), column blocks that are dense matrices or a
Linear layer's factors (:mod:`~grab_exp.grads.linear`), each with the ``GradRows`` operations
(:mod:`~grab_exp.grads.rows`)."""

from grab_exp.grads.batch import BatchGrads, as_batch_grads, flatten_grads
from grab_exp.grads.linear import FactorBias, LinearFactors, factor_pays
from grab_exp.grads.rows import DenseRows, GradRows

__all__ = [
    "BatchGrads",
    "DenseRows",
    "FactorBias",
    "GradRows",
    "LinearFactors",
    "as_batch_grads",
    "factor_pays",
    "flatten_grads",
]
