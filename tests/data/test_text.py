"""dataset=text: windows of T words and their next words, against a reading written here."""

from __future__ import annotations

import pytest
import torch

from grab_exp.data import load_text
from grab_exp.data.text import check_text

TRAIN = "the cat sat\nthe dog sat on the cat\n"
TEST = "the bird sat\n"


def _reference(text: str, index: dict[str, int], seq_len: int) -> tuple[torch.Tensor, ...]:
    words = []
    for line in text.splitlines():
        words += [*line.split(), "<eos>"]
    ids = [index.get(w, 0) for w in words]
    n = (len(ids) - 1) // seq_len
    x = [ids[k * seq_len : (k + 1) * seq_len] for k in range(n)]
    y = [ids[k * seq_len + 1 : (k + 1) * seq_len + 1] for k in range(n)]
    return torch.tensor(x), torch.tensor(y)


def test_a_folder_of_two_files_gives_the_windows_and_the_vocabulary(tmp_path):
    (tmp_path / "train.txt").write_text(TRAIN)
    (tmp_path / "test.txt").write_text(TEST)
    data = load_text(tmp_path, seq_len=3, vocab=5)
    # counts: the 3, then cat, sat and <eos> 2 each (first seen first), dog 1, on 1
    assert data.classes == ("<unk>", "the", "cat", "sat", "<eos>")
    index = {w: i for i, w in enumerate(data.classes)}
    x, y = _reference(TRAIN, index, 3)
    assert torch.equal(data.train_x, x) and torch.equal(data.train_y, y)
    x, y = _reference(TEST, index, 3)
    assert torch.equal(data.test_x, x) and torch.equal(data.test_y, y)
    assert data.test_x[0, 1] == 0  # "bird" is not in the training vocabulary: <unk>


def test_one_file_is_split_nine_tenths_to_train(tmp_path):
    lines = [f"w{k} x" for k in range(20)]
    (tmp_path / "corpus.txt").write_text("\n".join(lines))
    data = load_text(tmp_path / "corpus.txt", seq_len=2, vocab=None, subset=4)
    assert len(data.classes) == 1 + 18 + 2  # <unk>, w0..w17, x, <eos>
    assert data.train_x.shape == (4, 2) and data.test_x.shape == (2, 2)  # 6 test words + 0


def test_missing_path_and_bad_sizes_are_one_line(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"^dataset.path: no file or folder"):
        check_text(tmp_path / "absent.txt")
    (tmp_path / "train.txt").write_text(TRAIN)
    with pytest.raises(FileNotFoundError, match=r"^dataset.path: .* has no test file"):
        load_text(tmp_path)
    (tmp_path / "test.txt").write_text(TEST)
    with pytest.raises(ValueError, match=r"^dataset.seq_len: got 50"):
        load_text(tmp_path, seq_len=50)
