"""A user's own arrays from files: a ``.npz`` of named arrays, or a ``.csv`` table.

Each split is a file of its own (``dataset.train``, ``dataset.test``), both of one format:

- ``.npz``: the inputs under the name ``dataset.x``, ``(N, ...)`` numbers (any shape: table rows,
  sequences, images), and the labels under ``dataset.y``, ``(N,)`` integer classes or class
  names (a token stream is ``dataset=text``'s).
- ``.csv``: a header row; the label column ``dataset.y`` (integer classes or class names) and the
  feature columns ``dataset.columns`` (``null``: every other column), numbers only.

Inputs become float32. Class names become labels in sorted order over both
splits; integer labels keep their values, with ``"0" .. "C-1"`` as names (``C`` the largest
label plus one). A relative path is taken from the folder the command ran in.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from grab_exp.data.arrays import ArrayData
from grab_exp.data.subset import take_subsets

FORMATS = (".npz", ".csv")


def resolve_split(setting: str, path: str | os.PathLike[str] | None) -> Path:
    """``path`` made absolute against the working directory, checked to be a file of a known
    format (one line naming ``dataset.<setting>`` and where it looked, if not)."""
    if path is None:
        raise ValueError(f"dataset.{setting}: got null; allowed: a .npz or .csv file")
    resolved = Path(path).expanduser().absolute()
    if resolved.suffix.lower() not in FORMATS:
        raise ValueError(f"dataset.{setting}: {resolved} is not a .npz or .csv file")
    if not resolved.is_file():
        raise FileNotFoundError(f"dataset.{setting}: no file at {resolved} (from {path!r})")
    return resolved


def check_arrays(
    train: str | os.PathLike[str] | None = None,
    test: str | os.PathLike[str] | None = None,
    **_options: object,
) -> None:
    """Startup check: both files exist and share one format (nothing is read)."""
    paths = [resolve_split(setting, path) for setting, path in (("train", train), ("test", test))]
    if paths[0].suffix.lower() != paths[1].suffix.lower():
        raise ValueError(
            f"dataset.test: {paths[1].name} is not of dataset.train's format ({paths[0].name})"
        )


def _read_npz(path: Path, x: str, y: str) -> tuple[np.ndarray, np.ndarray]:
    with np.load(path, allow_pickle=False) as arrays:
        for setting, name in (("x", x), ("y", y)):
            if name not in arrays.files:
                raise ValueError(
                    f"dataset.{setting}: {path} has no array {name!r}; it holds "
                    f"{', '.join(arrays.files) or 'none'}"
                )
        return arrays[x], arrays[y]


def _read_csv(path: Path, y: str, columns: list[str] | None) -> tuple[np.ndarray, np.ndarray]:
    import pandas as pd

    table = pd.read_csv(path)
    features = list(columns) if columns is not None else [c for c in table.columns if c != y]
    missing = [name for name in (y, *features) if name not in table.columns]
    if missing:
        setting = "dataset.y" if y in missing else "dataset.columns"
        raise ValueError(
            f"{setting}: {path} has no column {missing[0]!r}; its columns: "
            f"{', '.join(map(str, table.columns))}"
        )
    text = [name for name in features if not pd.api.types.is_numeric_dtype(table[name])]
    if text or not features:
        raise ValueError(
            f"dataset.columns: {path}'s feature column {text[0]!r} is not numeric; allowed: "
            f"numeric columns (set dataset.columns to them)"
            if text
            else f"dataset.columns: {path} has no feature column besides {y!r}"
        )
    return table[features].to_numpy(), table[y].to_numpy()


def _read(path: Path, x: str, y: str, columns: list[str] | None) -> tuple[np.ndarray, np.ndarray]:
    if path.suffix.lower() == ".npz":
        return _read_npz(path, x, y)
    return _read_csv(path, y, columns)


def _inputs(values: np.ndarray, count: int, path: Path) -> torch.Tensor:
    """``(N, ...)`` float32 examples, one per label."""
    if values.dtype.kind not in "biuf":
        raise ValueError(f"dataset.x: {path} holds {values.dtype} inputs; allowed: numbers")
    if values.ndim < 2 or len(values) != count:
        raise ValueError(
            f"dataset.x: {path} holds inputs of shape {values.shape} for {count} labels; "
            f"allowed: ({count}, ...), at least one value per example"
        )
    return torch.from_numpy(values.astype(np.float32))


def _labels(
    train: np.ndarray, test: np.ndarray, paths: list[Path]
) -> tuple[torch.Tensor, torch.Tensor, tuple[str, ...]]:
    """Both splits' labels as int64 and the class names (sorted names, or ``"0" .. "C-1"``)."""
    for labels, path in zip((train, test), paths, strict=True):
        if labels.dtype.kind not in "iuUSO" or labels.ndim != 1:
            raise ValueError(
                f"dataset.y: {path} holds {labels.dtype} labels of shape {labels.shape}; "
                "allowed: (N,) integer classes or class names"
            )
    if train.dtype.kind in "iu" and test.dtype.kind in "iu":
        count = int(max(train.max(initial=-1), test.max(initial=-1))) + 1
        names = tuple(str(k) for k in range(count))
        return (
            torch.from_numpy(train.astype(np.int64)),
            torch.from_numpy(test.astype(np.int64)),
            names,
        )
    names = tuple(sorted({str(v) for v in (*train.ravel(), *test.ravel())}))
    index = {name: k for k, name in enumerate(names)}
    encode = np.vectorize(lambda v: index[str(v)], otypes=[np.int64])
    return torch.from_numpy(encode(train)), torch.from_numpy(encode(test)), names


def load_arrays(
    train: str | os.PathLike[str] | None = None,
    test: str | os.PathLike[str] | None = None,
    x: str = "x",
    y: str = "y",
    columns: list[str] | None = None,
    subset: int | None = None,
    test_subset: int | None = None,
    subset_seed: int = 0,
) -> ArrayData:
    """The user's arrays of ``train`` and ``test`` (see the module's docstring).

    Usable as a Hydra ``_target_`` (``conf/dataset/arrays.yaml``).

    Args:
        train: The training split's ``.npz`` or ``.csv`` file.
        test: The test split's file, of the same format.
        x: ``.npz``: the inputs' array name.
        y: ``.npz``: the labels' array name; ``.csv``: the label column.
        columns: ``.csv``: the feature columns (``None``: every column but ``y``).
        subset, test_subset, subset_seed: Stratified, seeded subsets (as ``dataset=synthetic``).

    Returns:
        ``(N, ...)`` float32 inputs with ``(N,)`` int64 labels.

    Raises:
        ValueError, FileNotFoundError: One line naming the setting and the file.
    """
    check_arrays(train, test)
    paths = [resolve_split("train", train), resolve_split("test", test)]
    (train_x, train_y), (test_x, test_y) = (_read(p, x, y, columns) for p in paths)
    train_t, test_t, classes = _labels(train_y, test_y, paths)
    inputs = [
        _inputs(v, len(t), p)
        for v, t, p in ((train_x, train_t, paths[0]), (test_x, test_t, paths[1]))
    ]
    if inputs[0].shape[1:] != inputs[1].shape[1:]:
        raise ValueError(
            f"dataset.test: {paths[1]}'s examples are {tuple(inputs[1].shape[1:])}, those of "
            f"dataset.train {tuple(inputs[0].shape[1:])}; allowed: the same shape"
        )
    data = ArrayData(inputs[0], train_t, inputs[1], test_t, classes)
    return take_subsets(data, subset, test_subset, subset_seed)
