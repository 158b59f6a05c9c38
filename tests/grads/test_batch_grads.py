"""``BatchGrads`` (grab_exp.grads): every block's operations against the materialized matrix.

A batch's gradients are column blocks, dense, a Linear layer's factors or an Embedding's compact
rows; each block answers the
``GradRows`` operations on its own columns. float64, so every comparison is to rounding.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from grab_exp.grads import (
    BatchGrads,
    DenseRows,
    EmbeddingRows,
    FactorBias,
    LinearFactors,
    as_batch_grads,
    flatten_grads,
)

B = 6
F64 = torch.float64


def mixed_grads() -> BatchGrads:
    """A conv-like dense block, a Linear with bias (factors over T = 2), a dense one, an Embedding's
    compact rows (a token twice in one example, a token of two examples), a Linear without bias:
    the parts a factored hook path returns."""
    g = torch.Generator().manual_seed(0)
    linear = LinearFactors(
        torch.randn(B, 2, 4, generator=g, dtype=F64), torch.randn(B, 2, 3, generator=g, dtype=F64)
    )
    last = LinearFactors(
        torch.randn(B, 1, 3, generator=g, dtype=F64), torch.randn(B, 1, 2, generator=g, dtype=F64)
    )
    tokens = torch.randint(0, 5, (B, 3), generator=g)  # (B, T) of a vocabulary of 5
    tokens[0, 2] = tokens[0, 0]
    parts = {
        "conv.weight": torch.randn(B, 2, 1, 2, generator=g, dtype=F64),
        "fc.weight": linear,
        "fc.bias": FactorBias(linear),
        "norm.weight": torch.randn(B, 3, generator=g, dtype=F64),
        "emb.weight": EmbeddingRows(tokens, torch.randn(B, 3, 2, generator=g, dtype=F64), 5),
        "head.weight": last,
    }
    shapes = {"conv.weight": (2, 1, 2), "fc.weight": (3, 4), "fc.bias": (3,)}
    shapes |= {"norm.weight": (3,), "emb.weight": (5, 2), "head.weight": (2, 3)}
    return BatchGrads.from_parts(parts, {n: torch.Size(s) for n, s in shapes.items()})


def test_blocks_answer_like_the_materialized_matrix():
    grads = mixed_grads()
    # the bias joins its layer's factors; the narrow dense neighbours stay apart (a factor block
    # between them)
    assert [type(b).__name__ for b in grads.blocks] == [
        "DenseRows",
        "LinearFactors",
        "DenseRows",
        "EmbeddingRows",
        "LinearFactors",
    ]
    assert grads.blocks[1].bias and grads.factored and grads.width == 4 + 15 + 3 + 10 + 6
    dense = DenseRows(grads.dense().matrix)  # (B, d)
    parts = grads.as_dict()
    assert list(parts) == list(grads.shapes)
    torch.testing.assert_close(
        torch.cat([p.reshape(B, -1) for p in parts.values()], 1), dense.matrix
    )
    torch.testing.assert_close(parts["fc.bias"], grads.blocks[1].delta.sum(1))
    emb = grads.blocks[3]  # each example's token rows written out one by one
    want = torch.zeros(B, 5, 2, dtype=F64)
    for i, t in itertools.product(range(B), range(3)):
        want[i, emb.tokens[i, t]] += emb.values[i, t]
    torch.testing.assert_close(parts["emb.weight"], want, rtol=0, atol=0)
    g = torch.Generator().manual_seed(1)
    acc = torch.randn(3, grads.width, generator=g, dtype=F64)
    coef = torch.randn(B, 3, generator=g, dtype=F64)
    torch.testing.assert_close(grads.dots(acc), dense.dots(acc))
    torch.testing.assert_close(grads.dots(acc[0]), dense.dots(acc[0]))
    torch.testing.assert_close(grads.gram(), dense.gram())
    for k in (slice(None), 0):  # (K, d) and (d,) accumulators
        got, want = acc[k].clone(), acc[k].clone()
        grads.accumulate(got, coef[:, k])
        dense.accumulate(want, coef[:, k])
        torch.testing.assert_close(got, want)
    for i in range(B):
        row = torch.empty_like(dense.matrix[i])
        grads.write_row(i, row)
        torch.testing.assert_close(row, dense.matrix[i])


def _pair_reference(matrix: torch.Tensor, first: torch.Tensor, lead: int) -> torch.Tensor:
    """``(P, d)`` differences of consecutive rows of ``[first; matrix]`` (from ``first`` when
    ``lead``), written out row by row."""
    rows = [first, *matrix] if lead else list(matrix)
    return torch.stack([rows[i] - rows[i + 1] for i in range(0, len(rows) - 1, 2)])


@pytest.mark.parametrize("lead", [0, 1])
def test_pair_differences_of_blocks_equal_the_dense_ones(lead):
    grads = mixed_grads()
    dense = DenseRows(grads.dense().matrix)
    first = torch.randn(grads.width, dtype=F64) if lead else None
    want = _pair_reference(dense.matrix, first, lead)  # (P, d)
    buffer = torch.empty(B + 1, grads.width, dtype=F64)
    from_dense = dense.pair_diffs(first, lambda rows: buffer[:rows]).matrix
    got = grads.pair_diffs(first, None)
    assert got.rows == want.shape[0] == (B + lead) // 2
    torch.testing.assert_close(from_dense, want, rtol=0, atol=0)
    torch.testing.assert_close(got.dense(torch.empty_like(want)).matrix, want)
    torch.testing.assert_close(got.gram(), want @ want.T)


@pytest.mark.parametrize("i", [0, B - 1])
def test_a_row_is_written_in_place_as_the_dense_row(i):
    grads = mixed_grads()
    out = torch.full((grads.width,), float("nan"), dtype=F64)
    grads.write_row(i, out)
    torch.testing.assert_close(out, grads.dense().matrix[i])


def test_a_dict_and_a_matrix_become_batch_grads_without_copies():
    matrix = torch.randn(B, 7, dtype=F64)  # (B, d)
    views = {"a": matrix[:, :3].view(B, 3), "b": matrix[:, 3:].view(B, 2, 2)}
    joined = as_batch_grads(views)
    assert len(joined.blocks) == 1 and joined.dense().matrix.data_ptr() == matrix.data_ptr()
    assert flatten_grads(matrix, 7).data_ptr() == matrix.data_ptr()
    apart = {n: v.clone() for n, v in views.items()}  # what vmap(grad) returns: one block each
    batch = as_batch_grads(apart)
    assert len(batch.blocks) == 2 and torch.equal(batch.dense().matrix, matrix)
    assert all(torch.equal(batch.as_dict()[n], v) for n, v in views.items())
    with pytest.raises(ValueError, match="different row counts"):
        as_batch_grads({"a": matrix, "b": matrix[:3]})
    with pytest.raises(ValueError, match=r"expected d=8, .* frozen, unfrozen or replaced"):
        flatten_grads(views, 8)


@pytest.mark.parametrize("layout", ["parts", "one matrix", "two matrices"])
def test_accumulate_leaves_the_skipped_parameters_columns_out(layout):
    """``accumulate(acc, coef, skip)``: the other columns as the dense matrix's, the skipped ones
    untouched, whether a skipped parameter is a block of its own or inside a dense block of
    several (a reused buffer's matrix), at its start or further in."""
    grads = mixed_grads()
    matrix = grads.dense().matrix  # (B, d)
    if layout == "one matrix":  # every part a column block of one matrix: one dense block
        widths = [shape.numel() for shape in grads.shapes.values()]
        grads = as_batch_grads(dict(zip(grads.shapes, matrix.split(widths, dim=1), strict=True)))
        assert len(grads.blocks) == 1
    elif layout == "two matrices":  # conv.weight's 4 columns, then the rest
        blocks = [DenseRows(matrix[:, :4]), DenseRows(matrix[:, 4:])]
        grads = BatchGrads(blocks, grads.shapes)
    dense = grads.dense().matrix  # (B, d)
    g = torch.Generator().manual_seed(2)
    acc = torch.randn(grads.width, generator=g, dtype=F64)
    coef = torch.randn(B, generator=g, dtype=F64)
    skip = {"conv.weight", "norm.weight"}
    got, want = acc.clone(), acc + coef @ dense
    grads.accumulate(got, coef, frozenset(skip))
    widths = [s.numel() for s in grads.shapes.values()]
    for name, got_part, want_part, acc_part in zip(
        grads.shapes, got.split(widths), want.split(widths), acc.split(widths), strict=True
    ):
        expected = acc_part if name in skip else want_part
        torch.testing.assert_close(got_part, expected, msg=name)


def test_a_factored_parameter_cannot_be_skipped():
    grads = mixed_grads()
    with pytest.raises(ValueError, match="not dense"):
        grads.accumulate(
            torch.zeros(grads.width, dtype=F64), torch.ones(B, dtype=F64), frozenset({"fc.weight"})
        )


def test_a_difference_of_equal_rows_normalizes_to_zero_not_to_its_rounding():
    """Rows 0 and 1 equal: their difference's norm from the Gram matrix is rounding of the rows'
    (or 0), and normalized it stays zero; the other pairs get unit norm."""
    grads = mixed_grads()
    for block in grads.blocks:  # row 1 := row 0 in every block
        for part in ("matrix", "a", "delta", "values"):
            if hasattr(block, part):
                getattr(block, part)[1] = getattr(block, part)[0]
        if hasattr(block, "tokens"):
            block.tokens[1] = block.tokens[0]
    unit = grads.pair_diffs(None, None).normalized()
    torch.testing.assert_close(unit.gram().diagonal(), torch.tensor([0.0, 1.0, 1.0], dtype=F64))
    acc = torch.zeros(grads.width, dtype=F64)
    unit.accumulate(acc, torch.tensor([1.0, 0.0, 0.0], dtype=F64))
    assert acc.abs().max() == 0


def test_a_batchs_parts_are_freed_with_it():
    """``part_rows`` carried a ``functools.cache`` (moved onto it from ``_column_slices`` by
    7578e90): every call's dense rows stayed alive in its cache, so memory grew by the rows of
    each step (a ResNet-18 with GroupNorm took 24 GB in two benchmark repeats and was killed)."""
    import gc
    import weakref

    parts = {"w": torch.randn(B, 3, 4, dtype=F64), "b": torch.randn(B, 3, dtype=F64)}
    shapes = {n: t.shape[1:] for n, t in parts.items()}
    grads = BatchGrads.from_parts(parts, shapes)
    kept = [weakref.ref(t) for t in parts.values()]
    torch.testing.assert_close(grads.as_dict()["w"], parts["w"])
    del grads, parts
    gc.collect()
    assert all(ref() is None for ref in kept)
