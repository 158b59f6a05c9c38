"""Data of any shape: ArrayData's inputs, and dataset=arrays reading .npz and .csv files."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from grab_exp.data import ArrayData, check_arrays, load_arrays


def _arrays(shape: tuple[int, ...], n: int = 6) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn((n, *shape), generator=g)
    return [x, torch.arange(n) % 3, x[:4].clone(), torch.arange(4) % 3]


@pytest.mark.parametrize("shape", [(5,), (4, 64), (3, 8, 8), (2, 3, 4, 5)])
def test_array_data_takes_float_examples_of_any_shape(shape):
    data = ArrayData(*_arrays(shape), classes=("a", "b", "c"))
    assert data.train_x.shape[1:] == shape


def test_array_data_refuses_what_no_model_can_take():
    x, y, tx, ty = _arrays((5,))
    with pytest.raises(
        ValueError, match=r"train_x must be \(N, \.\.\.\) float32 .* got torch.float64"
    ):
        ArrayData(x.double(), y, tx, ty, ("a", "b", "c"))
    with pytest.raises(ValueError, match=r"train_x must be .* of shape \(6,\)"):
        ArrayData(x[:, 0], y, tx, ty, ("a", "b", "c"))
    with pytest.raises(ValueError, match=r"test_x must be shaped like train_x .* \(M, 4\)"):
        ArrayData(x, y, tx[:, :4], ty, ("a", "b", "c"))
    tokens = torch.zeros(6, 8, dtype=torch.int64)  # (N, T) tokens and (N, T) next tokens: as before
    assert ArrayData(tokens, tokens, tokens, tokens, ("a",)).train_x.dtype == torch.int64


@pytest.fixture
def sequences(tmp_path, monkeypatch):
    """seq_train.npz / seq_test.npz of (N, 4, 16) float64 sequences and int labels, in cwd."""
    monkeypatch.chdir(tmp_path)
    g = np.random.default_rng(0)
    for split, n in (("train", 12), ("test", 6)):
        np.savez(f"seq_{split}.npz", x=g.normal(size=(n, 4, 16)), y=np.arange(n) % 3)
    return tmp_path


def test_npz_sequences_load_as_float32_with_relative_paths_from_the_working_folder(sequences):
    data = load_arrays("seq_train.npz", "seq_test.npz")
    stored = np.load(sequences / "seq_train.npz")
    assert data.train_x.shape == (12, 4, 16) and data.train_x.dtype == torch.float32
    assert torch.equal(data.train_x, torch.from_numpy(stored["x"]).float())
    assert data.train_y.tolist() == stored["y"].tolist()
    assert data.classes == ("0", "1", "2") and data.test_x.shape == (6, 4, 16)
    assert load_arrays("seq_train.npz", "seq_test.npz", subset=6).train_y.bincount().tolist() == [
        2,
        2,
        2,
    ]


def test_csv_tables_take_named_columns_and_class_names(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rows = {"a": [0.5, 1.0, 2.0, 3.0], "note": ["x", "y", "z", "w"], "b": [1, 2, 3, 4]}
    pd.DataFrame({**rows, "kind": ["well", "sick", "well", "sick"]}).to_csv("t.csv", index=False)
    pd.DataFrame({"a": [1.0], "note": ["q"], "b": [5], "kind": ["sick"]}).to_csv(
        "v.csv", index=False
    )
    data = load_arrays("t.csv", "v.csv", y="kind", columns=["a", "b"])
    assert data.classes == ("sick", "well")
    assert data.train_y.tolist() == [1, 0, 1, 0] and data.test_y.tolist() == [0]
    assert data.train_x.tolist() == [[0.5, 1.0], [1.0, 2.0], [2.0, 3.0], [3.0, 4.0]]
    with pytest.raises(ValueError, match=r"^dataset.columns: .*t.csv's feature column 'note' is"):
        load_arrays("t.csv", "v.csv", y="kind")  # every other column: 'note' is text
    with pytest.raises(ValueError, match=r"^dataset.y: .*t.csv has no column 'label'; its col"):
        load_arrays("t.csv", "v.csv", y="label")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"train": "nope.npz"}, r"^dataset.train: no file at /.*/nope.npz \(from 'nope.npz'\)$"),
        ({"train": None}, r"^dataset.train: got null; allowed: a .npz or .csv file$"),
        ({"test": "seq_train.txt"}, r"^dataset.test: .*seq_train.txt is not a .npz or .csv file$"),
        ({"x": "inputs"}, r"^dataset.x: .*seq_train.npz has no array 'inputs'; it holds x, y$"),
    ],
)
def test_every_bad_setting_is_one_line_naming_it(sequences, options, message):
    (sequences / "seq_train.txt").write_text("1 2 3")
    settings = {"train": "seq_train.npz", "test": "seq_test.npz", **options}
    with pytest.raises((ValueError, FileNotFoundError), match=message):
        load_arrays(**settings)


def test_the_startup_check_refuses_missing_files_and_mixed_formats_without_reading(sequences):
    check_arrays("seq_train.npz", "seq_test.npz")
    (sequences / "t.csv").write_text("a,y\n1,0\n")
    with pytest.raises(ValueError, match=r"^dataset.test: t.csv is not of dataset.train's format"):
        check_arrays("seq_train.npz", "t.csv")


def test_inputs_that_do_not_match_their_labels_or_each_other_are_refused(sequences):
    np.savez("short.npz", x=np.zeros((5, 4, 16)), y=np.zeros(6, dtype=np.int64))
    with pytest.raises(ValueError, match=r"^dataset.x: .*short.npz holds inputs of shape \(5, 4,"):
        load_arrays("short.npz", "seq_test.npz")
    np.savez("wide.npz", x=np.zeros((6, 4, 17)), y=np.zeros(6, dtype=np.int64))
    with pytest.raises(ValueError, match=r"^dataset.test: .*wide.npz's examples are \(4, 17\)"):
        load_arrays("seq_train.npz", "wide.npz")
    np.savez("soft.npz", x=np.zeros((6, 4, 16)), y=np.full(6, 0.5))
    with pytest.raises(ValueError, match=r"^dataset.y: .*soft.npz holds float64 labels"):
        load_arrays("seq_train.npz", "soft.npz")
