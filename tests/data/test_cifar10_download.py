"""``dataset=cifar10`` end to end against a local server: torchvision's own download, checksum
check and extraction of a small archive in CIFAR-10's format, our loading, and a 2-epoch run.

The archive is made here: CIFAR-10's ``cifar-10-batches-py`` folder of pickled batches
(``data`` ``(n, 3072)`` uint8 rows, channel-major; ``labels``) and ``batches.meta``, as a
``.tar.gz``. A ``http.server`` on 127.0.0.1 serves it; the test points torchvision's
``CIFAR10`` class attributes (its URL and md5 checksums) at it, nothing else.
"""

from __future__ import annotations

import functools
import hashlib
import http.server
import importlib.util
import io
import pickle
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from support import REPO_ROOT
from support.grab_run import run_job_here
from torchvision.datasets import CIFAR10

from grab_exp.data import cifar10 as ours
from grab_exp.data import load_cifar10
from grab_exp.data.cifar10 import check_cifar10, on_disk, unreachable
from grab_exp.data.jpeg_archive import class_names, decode_split, read_encoded_images

CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
PER_BATCH = 20  # examples in each of the 5 training batches and the test batch (2 per class)
PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")


def _batch(seed: int) -> tuple[np.ndarray, list[int]]:
    """``(PER_BATCH, 3072)`` uint8 images whose mean colour follows their label, and labels."""
    generator = np.random.default_rng(seed)
    labels = [k % len(CLASSES) for k in range(PER_BATCH)]
    noise = generator.integers(0, 64, size=(PER_BATCH, 3072))
    data = (np.array(labels)[:, None] * 20 + noise).astype(np.uint8)
    return data, labels


def _add(archive: tarfile.TarFile, name: str, obj: object) -> str:
    """Pickle ``obj`` into ``cifar-10-batches-py/<name>``; return the file's md5."""
    payload = pickle.dumps(obj)
    info = tarfile.TarInfo(f"{CIFAR10.base_folder}/{name}")
    info.size = len(payload)
    archive.addfile(info, io.BytesIO(payload))
    return hashlib.md5(payload).hexdigest()


def make_cifar10_archive(path: Path) -> dict[str, object]:
    """Write a small CIFAR-10-format ``.tar.gz`` to ``path``; return torchvision's checksums."""
    sums = {}
    with tarfile.open(path, "w:gz") as archive:
        names = [f"data_batch_{k}" for k in range(1, 6)] + ["test_batch"]
        for seed, name in enumerate(names):
            data, labels = _batch(seed)
            sums[name] = _add(archive, name, {"data": data, "labels": labels})
        meta = _add(archive, "batches.meta", {"label_names": CLASSES})
    return {
        "tgz_md5": hashlib.md5(path.read_bytes()).hexdigest(),
        "train_list": [[n, sums[n]] for n in names[:5]],
        "test_list": [["test_batch", sums["test_batch"]]],
        "meta": {**CIFAR10.meta, "md5": meta},
    }


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    """Serves files without a log line per request."""

    def log_message(self, *args: object) -> None:
        """Log nothing."""


@pytest.fixture
def local_cifar10(tmp_path: Path, monkeypatch) -> Iterator[Path]:
    """A local HTTP server of a small CIFAR-10 archive, with torchvision pointed at it;
    yields the (empty) data directory to download into."""
    served = tmp_path / "served"
    served.mkdir()
    sums = make_cifar10_archive(served / CIFAR10.filename)
    handler = functools.partial(QuietHandler, directory=str(served))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    url = f"http://127.0.0.1:{server.server_address[1]}/{CIFAR10.filename}"
    monkeypatch.setattr(CIFAR10, "url", url)
    monkeypatch.setattr(ours, "CIFAR10_URL", url)  # the startup check's copy (no torchvision)
    for name, value in sums.items():
        monkeypatch.setattr(CIFAR10, name, value)
    unreachable.cache_clear()
    try:
        yield tmp_path / "data"
    finally:
        server.shutdown()
        server.server_close()
        unreachable.cache_clear()


def test_the_startup_checks_copy_of_the_release_is_torchvisions():
    assert CIFAR10.url == ours.CIFAR10_URL and CIFAR10.base_folder == ours.BATCHES_FOLDER
    assert list(ours.BATCH_FILES) == [name for name, _ in CIFAR10.train_list + CIFAR10.test_list]


def test_torchvision_downloads_checks_and_extracts_and_we_load_it(local_cifar10):
    check_cifar10(data_dir=local_cifar10)  # the startup check: the server answers
    assert not on_disk(local_cifar10)
    data = load_cifar10(data_dir=local_cifar10, download_timeout_s=10)
    assert on_disk(local_cifar10) and (local_cifar10 / CIFAR10.filename).is_file()
    assert data.train_x.shape == (5 * PER_BATCH, 3, 32, 32) and data.test_x.shape[0] == PER_BATCH
    assert list(data.classes) == CLASSES
    first, labels = _batch(0)
    expected = torch.from_numpy(first[0].reshape(3, 32, 32)).float() / 255 * 2 - 1
    assert torch.allclose(data.train_x[0], expected)
    assert data.train_y[:PER_BATCH].tolist() == labels


def test_a_damaged_download_fails_the_checksum_in_one_line(local_cifar10, monkeypatch):
    monkeypatch.setattr(CIFAR10, "tgz_md5", "0" * 32)
    with pytest.raises(RuntimeError) as error:
        load_cifar10(data_dir=local_cifar10, download_timeout_s=10)
    assert str(error.value).startswith("dataset=cifar10: CIFAR-10 is not in")
    assert "\n" not in str(error.value)


def test_a_two_epoch_run_trains_on_the_downloaded_data(local_cifar10, tmp_path):
    overrides = ["dataset=cifar10", f"dataset.data_dir={local_cifar10}", "model=logreg"]
    overrides += ["epochs=2", "device=cpu", "progress=none", "eval_batch_size=50"]
    final = run_job_here(overrides, tmp_path / "run")
    assert on_disk(local_cifar10)
    assert final["epoch"] == 2 and np.isfinite(final["train/loss"])
    assert (tmp_path / "run" / "metrics.csv").read_text().count("\n") == 3  # header + 2 epochs


def _script(name: str):
    path = REPO_ROOT / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_shipped_script_makes_a_jpeg_archive_of_the_binary_cifar10(local_cifar10, tmp_path):
    """scripts/make_cifar10_jpeg.py: the ImageFolder layout our offline loader reads, with the
    binary release's pixels up to JPEG's loss."""
    binary = load_cifar10(data_dir=local_cifar10, download_timeout_s=10)
    out = tmp_path / "cifar10-jpeg.tar.gz"
    counts = _script("make_cifar10_jpeg").write_archive(out, local_cifar10)
    assert counts == {"train": 5 * PER_BATCH, "test": PER_BATCH}
    encoded = read_encoded_images(out)
    assert class_names(encoded, out) == CLASSES
    train = decode_split(encoded, "train", CLASSES)
    assert torch.bincount(train.labels).tolist() == [5 * PER_BATCH // 10] * 10
    first_airplane = torch.nonzero(binary.train_y == 0)[0, 0]
    original = (binary.train_x[first_airplane] + 1) / 2 * 255  # back to 0..255
    # the images are noise around a colour: JPEG keeps the colour, not the noise
    assert abs(train.images[0].float().mean() - original.mean()) < 2
