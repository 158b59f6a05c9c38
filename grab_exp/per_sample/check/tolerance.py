"""What every check takes as rounding, per dtype (float16 and bfloat16: the loose values). The
float64 values allow float32 rounding (~1e-7): float64 models compute parts in float32 (HF's
``LlamaRMSNorm``), whatever their dtype."""

from __future__ import annotations

import torch

#: the identity at the parameters: a wrong row is off by order 1; float32 sums of per-example
#: gradients against a batched backward differ by up to about 1e-3 in a ResNet-18's deeper convs
TOLERANCE = {torch.float64: 1e-5, torch.float32: 1e-2}
LOOSE_TOLERANCE = 5e-2
#: the same at a layer's outputs (and the mixing check's outputs), where both sides come from one
#: backward scaled per example: rounding only, so rows swapped between two examples whose weights
#: differ by 1/B show even in float32
OUTPUT_TOLERANCE = {torch.float64: 1e-6, torch.float32: 1e-4}
#: a parameter's difference is relative to at least this share of the largest norm of any
#: (``None``: the loose value, for other dtypes); float64: a gradient that cancels to 0 in exact
#: arithmetic (attention's key bias: softmax ignores a shift of every key) rounds to ~5e-11 of it
FLOOR = {torch.float64: 1e-5, torch.float32: 1e-3, None: 1e-1}
#: losses (sums of B float32 terms, other kernels)
LOSS_TOLERANCE = {torch.float64: 1e-6, torch.float32: 1e-4}
#: the rows' mean against ``param.grad``: one backward's output gradients summed in another order;
#: a floor times its tolerance well above the dtype's epsilon (a gradient that cancels to 0, as a
#: bias before a distance or an InstanceNorm, is rounding of the largest gradient's order)
MEAN_TOLERANCE = {torch.float64: 1e-6, torch.float32: 1e-3}
MEAN_FLOOR = {torch.float64: 1e-5, torch.float32: 1e-3, None: 1e-2}
#: the rounding of ``param.grad`` less what it held before a call, in ``eps |param.grad|`` (a
#: norm's bound: autograd's one addition rounds each entry by at most half a unit in its last place)
HELD_ROUNDING = 0.5


def tolerance(table: dict, dtype: torch.dtype) -> float:
    """``table``'s value for ``dtype``, else :data:`LOOSE_TOLERANCE` (also under ``torch.autocast``,
    whose layers compute in float16 or bfloat16 whatever the tensors' dtype)."""
    return LOOSE_TOLERANCE if autocast_on() else table.get(dtype, LOOSE_TOLERANCE)


def autocast_on() -> bool:
    return torch.is_autocast_enabled("cpu") or torch.is_autocast_enabled("cuda")
