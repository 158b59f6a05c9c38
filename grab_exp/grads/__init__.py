"""A batch's per-sample gradients, the one type that ``per_sample`` returns and ``balance`` reads:
:class:`BatchGrads` (:mod:`~grab_exp.grads.batch`), column blocks that are dense matrices, a
Linear layer's factors (:mod:`~grab_exp.grads.linear`) or an Embedding's compact rows
(:mod:`~grab_exp.grads.embedding`), each with the ``GradRows`` operations
(:mod:`~grab_exp.grads.rows`)."""

from grab_exp.grads.batch import BatchGrads, as_batch_grads, flatten_grads
from grab_exp.grads.embedding import EmbeddingRows, compact_pays
from grab_exp.grads.linear import FactorBias, LinearFactors, factor_pays
from grab_exp.grads.rows import DenseRows, GradRows

__all__ = [
    "BatchGrads",
    "DenseRows",
    "EmbeddingRows",
    "FactorBias",
    "GradRows",
    "LinearFactors",
    "as_batch_grads",
    "compact_pays",
    "factor_pays",
    "flatten_grads",
]
