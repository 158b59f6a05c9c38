"""recursive and recursive_pair give the orders and accumulators recorded before their rewrite.

``tests/support/data/tree_orderings.pt`` holds, for D = 0, 1, 5 (recursive) and b = 8
(recursive_pair), both kernels and ``normalize`` on and off, the orders of 3 epochs and each
epoch's final accumulators, recorded at commit a98284e by the all-node-product implementation
(``tests/support/data/record_tree_orderings.py``, which also makes the gradients fed here).

Tolerances: float64, equal orders and accumulators within 1e-10 relative (of the largest entry);
float32, equal orders and accumulators within 1e-4 relative (single rounding differs in the
order of the sums; these small cases have no near-tie dot products, so the orders agree).
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
from support import DATA_DIR

_spec = importlib.util.spec_from_file_location("record", DATA_DIR / "record_tree_orderings.py")
record = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(record)
RECORDING = torch.load(record.OUT)
RECORDED = RECORDING["cases"]
RTOL = {"float64": 1e-10, "float32": 1e-4}


def test_the_recording_is_of_the_implementation_before_the_rewrite():
    assert RECORDING["commit"].startswith("a98284e")


@pytest.mark.parametrize("key", sorted(RECORDED))
def test_tree_orderings_match_the_recorded_implementation(key):
    case, kernel, normalize, dtype = key.rsplit("-", 3)
    variant, options, step = record.CASES[case]
    got = record.run(
        variant, options, step, kernel, normalize == "normalize1", record.DTYPES[dtype]
    )
    want = RECORDED[key]
    assert torch.equal(got["orders"], want["orders"])
    scale = want["acc"].abs().max()
    assert scale > 0
    assert (got["acc"] - want["acc"]).abs().max() <= RTOL[dtype] * scale
