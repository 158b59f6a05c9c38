"""A token stream from text: windows of ``T`` words and the words one later (language models).

Words are the whitespace-separated tokens of each line, with ``<eos>`` at every line's end (as
PyTorch's word language model example reads WikiText-2). The vocabulary is the training split's
``vocab - 1`` most frequent words (ties: first seen first) after ``<unk>`` (id 0), which stands
for every other word. The stream is cut into windows of ``seq_len`` words; each window's labels
are the same words one position later.
"""

from __future__ import annotations

import io
import os
import urllib.request
import zipfile
from collections import Counter
from pathlib import Path

import torch

from grab_exp.data.arrays import ArrayData
from grab_exp.data.download import (
    DOWNLOAD_ERRORS,
    REACH_TIMEOUT_S,
    reason,
    socket_timeout,
    unreachable,
)
from grab_exp.data.paths import resolve_cache_dir, resolve_from_cwd

WIKITEXT2_URL = "https://wikitext.smerity.com/wikitext-2-v1.zip"
WIKITEXT2_FOLDER = "wikitext-2"  # what the archive extracts to, under the data directory
#: each split's file in a folder: WikiText-2's names, then plain ones
SPLIT_FILES = {
    "train": ("wiki.train.tokens", "train.txt"),
    "test": ("wiki.test.tokens", "test.txt"),
}
UNK, EOS = "<unk>", "<eos>"
ALTERNATIVES = (
    "give dataset.path=PATH (a text file, or a folder with train.txt and test.txt or "
    "WikiText-2's wiki.train.tokens and wiki.test.tokens)"
)


def _words(text: str) -> list[str]:
    return [word for line in text.splitlines() for word in (*line.split(), EOS)]


def _split_texts(path: Path) -> tuple[str, str]:
    """The training and test text of ``path``: a folder's two files, or one file's first 90% of
    lines and the rest.

    Raises:
        FileNotFoundError: a folder without one of its two files (one line).
        ValueError: a file that is not UTF-8 text, or a split without words (one line naming
            the file).
    """
    if path.is_file():
        lines = _read_text(path).splitlines()
        cut = max(1, len(lines) * 9 // 10)
        texts = ("\n".join(lines[:cut]), "\n".join(lines[cut:]))
        for split, text in zip(("train", "test"), texts, strict=True):
            _check_words(text, f"{path} (its {split} split: {SHARES[split]} of its lines)")
        return texts
    texts = []
    for split, names in SPLIT_FILES.items():
        found = [path / name for name in names if (path / name).is_file()]
        if not found:
            raise FileNotFoundError(
                f"dataset.path: {path} has no {split} file ({' or '.join(names)}); " + ALTERNATIVES
            )
        texts.append(_check_words(_read_text(found[0]), str(found[0])))
    return texts[0], texts[1]


SHARES = {"train": "the first 90%", "test": "the last 10%"}


def _read_text(path: Path) -> str:
    """``path``'s UTF-8 text; refused in one line (never its bytes) when it is not text."""
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(
            f"dataset.path: {path} is not UTF-8 text (byte {error.start} is "
            f"0x{data[error.start]:02x}); allowed: a text file, or a folder of them"
        ) from None
    if "\x00" in text:
        raise ValueError(
            f"dataset.path: {path} is not text (it holds NUL bytes, as binary files do); "
            "allowed: a text file, or a folder of them"
        )
    return text


def _check_words(text: str, where: str) -> str:
    if not text.split():
        raise ValueError(f"dataset.path: {where} holds no words; allowed: text with words")
    return text


def _windows(ids: torch.Tensor, seq_len: int, count: int | None) -> tuple[torch.Tensor, ...]:
    """``(n, T)`` windows of ``ids (L,)`` and their next words (the first ``count``)."""
    n = (len(ids) - 1) // seq_len
    n = n if count is None else min(n, count)
    x = ids[: n * seq_len].view(n, seq_len)
    return x, ids[1 : n * seq_len + 1].view(n, seq_len)


def wikitext2_root(data_dir: str | os.PathLike[str] | None) -> Path:
    """Where WikiText-2 is (or is downloaded to): ``<data_dir or ~/.cache/grab_exp>/wikitext-2``."""
    return resolve_cache_dir(data_dir) / WIKITEXT2_FOLDER


def unavailable_error(root: Path, why: str) -> RuntimeError:
    """The one line of a WikiText-2 that is not in ``root`` and cannot be downloaded (the
    startup check's and the download's)."""
    return RuntimeError(
        f"dataset=text: WikiText-2 is not in {root} and could not be downloaded ({why}); "
        + ALTERNATIVES
    )


def _download_wikitext2(root: Path, timeout_s: float) -> None:
    try:
        with socket_timeout(timeout_s), urllib.request.urlopen(WIKITEXT2_URL) as response:
            archive = zipfile.ZipFile(io.BytesIO(response.read()))
    except DOWNLOAD_ERRORS as error:
        raise unavailable_error(root, reason(error)) from error
    root.mkdir(parents=True, exist_ok=True)
    for member in archive.namelist():
        name = Path(member).name
        if name in SPLIT_FILES["train"] + SPLIT_FILES["test"]:
            (root / name).write_bytes(archive.read(member))


def check_text(
    path: str | os.PathLike[str] | None = None,
    data_dir: str | os.PathLike[str] | None = None,
    download_timeout_s: float = 30.0,
    **_loader_options: object,
) -> None:
    """Startup check of ``dataset=text``: the text is on disk, or WikiText-2's server answers.

    Raises:
        FileNotFoundError: ``dataset.path`` does not exist (one line).
        RuntimeError: no ``dataset.path``, WikiText-2 not downloaded and its server silent.
    """
    if path is not None:
        if not (where := resolve_from_cwd(path)).exists():
            raise FileNotFoundError(
                f"dataset.path: no file or folder {path} (looked for {where}); " + ALTERNATIVES
            )
        return
    root = wikitext2_root(data_dir)
    if (root / SPLIT_FILES["train"][0]).is_file():
        return
    why = unreachable(WIKITEXT2_URL, min(download_timeout_s, REACH_TIMEOUT_S))
    if why is not None:
        raise unavailable_error(root, why)


def load_text(
    path: str | os.PathLike[str] | None = None,
    seq_len: int = 35,
    vocab: int | None = 10_000,
    subset: int | None = None,
    test_subset: int | None = None,
    data_dir: str | os.PathLike[str] | None = None,
    download_timeout_s: float = 30.0,
) -> ArrayData:
    """Load a token stream as ``(N, T)`` windows and their next words.

    Usable as a Hydra ``_target_`` (``conf/dataset/text.yaml``).

    Args:
        path: a text file (its first 90% of lines train, the rest test), or a folder with
            ``train.txt`` and ``test.txt`` (or WikiText-2's ``wiki.train.tokens`` and
            ``wiki.test.tokens``); a relative path is taken from the working directory.
            ``None``: WikiText-2, downloaded on first use.
        seq_len: words per window (``T``).
        vocab: the vocabulary's largest size, ``<unk>`` included; ``None`` keeps every training
            word. The model's ``num_classes`` must be the size it comes to (``classes``).
        subset: keep the first this many training windows; ``test_subset`` likewise.
        data_dir: where WikiText-2 is downloaded (``None``: ``~/.cache/grab_exp``).
        download_timeout_s: limit on each network operation of the download.

    Returns:
        ``train_x``/``train_y`` ``(N, T)`` int64, the same for the test split; ``classes`` the
        vocabulary's words (``classes[0]`` is ``<unk>``).
    """
    if seq_len < 1 or (vocab is not None and vocab < 2):
        raise ValueError(f"dataset: got seq_len={seq_len}, vocab={vocab}; allowed: >= 1, >= 2")
    if path is None:
        root = wikitext2_root(data_dir)
        if not (root / SPLIT_FILES["train"][0]).is_file():
            _download_wikitext2(root, download_timeout_s)
        source = root
    else:
        source = resolve_from_cwd(path)
    train_text, test_text = _split_texts(source)
    train_words, test_words = _words(train_text), _words(test_text)
    counts = Counter(w for w in train_words if w != UNK)
    keep = None if vocab is None else vocab - 1
    words = (UNK, *(w for w, _ in counts.most_common(keep)))
    index = {w: i for i, w in enumerate(words)}
    train_ids = torch.tensor([index.get(w, 0) for w in train_words], dtype=torch.int64)
    test_ids = torch.tensor([index.get(w, 0) for w in test_words], dtype=torch.int64)
    train = _windows(train_ids, seq_len, subset)
    test = _windows(test_ids, seq_len, test_subset)
    if not len(train[0]) or not len(test[0]):
        raise ValueError(
            f"dataset.seq_len: got {seq_len}; allowed: fewer words than each split has "
            f"({len(train_ids)} train, {len(test_ids)} test)"
        )
    return ArrayData(*train, *test, classes=words)
