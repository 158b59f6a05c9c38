"""Datasets: synthetic data, stratified subsets, the CIFAR-10 JPEG archive and its cache,
the offline failure of torchvision's CIFAR-10, and every conf/dataset/*.yaml."""

from __future__ import annotations

import itertools
import logging
import socket
import tarfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import OmegaConf
from PIL import Image
from torch.utils._python_dispatch import TorchDispatchMode

from grab_exp.data import (
    ArrayData,
    array_data_from_uint8,
    load_cifar10,
    load_cifar10_jpeg,
    make_synthetic,
    normalize_images,
    stratified_subset,
    take_subsets,
)
from grab_exp.data.cifar10_jpeg import DEFAULT_ARCHIVE, load_or_decode, resolve_archive
from grab_exp.data.jpeg_archive import _decode_with_pil, _decode_with_torchvision
from grab_exp.data.paths import repo_root
from grab_exp.data.subset import uint8_subsets
from grab_exp.data.tensor_cache import file_sha256
from grab_exp.models import LogReg

ARCHIVE = repo_root() / DEFAULT_ARCHIVE
#: the CIFAR-10 loaders' and the synthetic set's configs (the others: tests/data/test_text.py and
#: tests/runner/config/test_config_groups.py, on data made on disk)
CIFAR_SHAPED = ("cifar10", "cifar10_jpeg", "synthetic")
DATASET_FILES = sorted((repo_root() / "conf" / "dataset").glob("*.yaml"))
DATASET_CONFIGS = [path for path in DATASET_FILES if path.stem in CIFAR_SHAPED]
# the standard CIFAR-10 label order, which is alphabetical
CIFAR10_CLASSES = [
    *("airplane", "automobile", "bird", "cat", "deer"),
    *("dog", "frog", "horse", "ship", "truck"),
]
needs_archive = pytest.mark.skipif(
    not ARCHIVE.is_file(), reason=f"CIFAR-10 JPEG archive absent: {ARCHIVE}"
)


# ---------------------------------------------------------------- synthetic


def test_synthetic_shapes_types_and_balance():
    data = make_synthetic(num_train=300, num_test=100)
    assert data.train_x.shape == (300, 3, 32, 32) and data.test_x.shape == (100, 3, 32, 32)
    assert data.train_x.dtype == torch.float32 and data.train_y.dtype == torch.int64
    assert data.train_x.min() >= -1 and data.train_x.max() <= 1
    assert torch.bincount(data.train_y).tolist() == [30] * 10
    assert data.num_classes == 10


def test_synthetic_is_reproducible_under_its_seed():
    first, again, other = make_synthetic(seed=3), make_synthetic(seed=3), make_synthetic(seed=4)
    for name in ("train_x", "train_y", "test_x", "test_y"):
        assert torch.equal(getattr(first, name), getattr(again, name))
    assert not torch.equal(first.train_x, other.train_x)


def test_synthetic_is_learnable_by_logistic_regression():
    data = make_synthetic()
    torch.manual_seed(0)
    model = LogReg()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    generator = torch.Generator().manual_seed(0)
    for _ in range(3):  # 3 epochs of 128 SGD steps with batch 16
        for batch in torch.randperm(len(data.train_y), generator=generator).view(-1, 16):
            loss = F.cross_entropy(model(data.train_x[batch]), data.train_y[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    with torch.no_grad():
        accuracy = (model(data.test_x).argmax(1) == data.test_y).float().mean().item()
    assert accuracy > 0.5  # chance is 0.1


# ---------------------------------------------------------------- subsets


def labels_with_counts(counts: list[int]) -> torch.Tensor:
    labels = torch.cat([torch.full((n,), c) for c, n in enumerate(counts)])
    return labels[torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))]


def subset_of(labels: torch.Tensor, k: int, seed: int) -> torch.Tensor:
    return stratified_subset(labels, k, torch.Generator().manual_seed(seed))


def test_stratified_subset_balances_classes_exactly():
    labels = labels_with_counts([50] * 10)
    chosen = subset_of(labels, 100, seed=0)
    assert torch.bincount(labels[chosen], minlength=10).tolist() == [10] * 10
    assert torch.equal(chosen, torch.sort(chosen).values) and len(set(chosen.tolist())) == 100


def test_stratified_subset_spreads_a_remainder_one_per_class():
    labels = labels_with_counts([50] * 10)
    counts = torch.bincount(labels[subset_of(labels, 103, seed=1)]).tolist()
    assert sorted(counts) == [10] * 7 + [11] * 3


def test_stratified_subset_gives_small_classes_everything():
    labels = labels_with_counts([3, 40, 40])
    counts = torch.bincount(labels[subset_of(labels, 33, seed=0)]).tolist()
    assert counts == [3, 15, 15]


def test_stratified_subset_is_seeded():
    labels = labels_with_counts([50] * 10)
    assert torch.equal(subset_of(labels, 100, seed=5), subset_of(labels, 100, seed=5))
    assert not torch.equal(subset_of(labels, 100, seed=5), subset_of(labels, 100, seed=6))


@pytest.mark.parametrize("bad_size", [0, 501, 2.5, True])
def test_stratified_subset_rejects_bad_sizes(bad_size):
    with pytest.raises(ValueError, match="subset size"):
        subset_of(labels_with_counts([50] * 10), bad_size, seed=0)


def test_take_subsets_names_the_setting_on_bad_sizes():
    data = make_synthetic(num_train=100, num_test=50)
    with pytest.raises(ValueError, match=r"^dataset\.subset: got 101; allowed: null or an"):
        take_subsets(data, subset=101)
    with pytest.raises(ValueError, match=r"^dataset\.test_subset: got 0;"):
        take_subsets(data, test_subset=0)


def test_take_subsets_keeps_pairs_aligned():
    data = make_synthetic(num_train=200, num_test=100)
    smaller = take_subsets(data, subset=50, test_subset=20, seed=1)
    assert (len(smaller.train_y), len(smaller.test_y)) == (50, 20)
    assert torch.bincount(smaller.train_y).tolist() == [5] * 10
    matches = (data.train_x[:, None] == smaller.train_x[None]).flatten(2).all(2)
    assert torch.equal(data.train_y[matches.float().argmax(0)], smaller.train_y)


# ---------------------------------------------------------------- ArrayData


def test_normalize_maps_bytes_to_minus_one_one():
    pixels = torch.tensor([0, 255, 51], dtype=torch.uint8).view(1, 3, 1, 1)
    assert normalize_images(pixels).flatten().tolist() == pytest.approx([-1.0, 1.0, -0.6])


def test_array_data_moves_between_devices_and_checks_shapes():
    data = make_synthetic(num_train=20, num_test=10)
    moved = data.to("meta")
    assert moved.train_x.device.type == "meta" and moved.classes == data.classes
    with pytest.raises(ValueError, match="train_y"):
        ArrayData(data.train_x, data.train_y[:-1], data.test_x, data.test_y, data.classes)


# ---------------------------------------------------------------- CIFAR-10 from the JPEG archive


@pytest.fixture(scope="module")
def jpeg_cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("jpeg_cache")


@pytest.fixture(scope="module")
def cifar10_jpeg(jpeg_cache_dir) -> ArrayData:
    """The whole archive, decoded once for this module into an empty cache directory."""
    if not ARCHIVE.is_file():
        pytest.skip(f"CIFAR-10 JPEG archive absent: {ARCHIVE}")
    return load_cifar10_jpeg(archive=DEFAULT_ARCHIVE, cache_dir=jpeg_cache_dir)


@needs_archive
def test_cifar10_jpeg_has_the_standard_splits_and_classes(cifar10_jpeg):
    assert cifar10_jpeg.train_x.shape == (50_000, 3, 32, 32)
    assert cifar10_jpeg.test_x.shape == (10_000, 3, 32, 32)
    assert list(cifar10_jpeg.classes) == CIFAR10_CLASSES
    assert torch.bincount(cifar10_jpeg.train_y).tolist() == [5_000] * 10
    assert torch.bincount(cifar10_jpeg.test_y).tolist() == [1_000] * 10


@needs_archive
def test_cifar10_jpeg_is_normalized_to_minus_one_one(cifar10_jpeg):
    assert cifar10_jpeg.train_x.dtype == torch.float32
    assert cifar10_jpeg.train_x.min().item() == -1.0 and cifar10_jpeg.train_x.max().item() == 1.0
    assert cifar10_jpeg.test_x.min().item() >= -1.0 and cifar10_jpeg.test_x.max().item() <= 1.0


@needs_archive
def test_cifar10_jpeg_order_is_class_then_file_name(cifar10_jpeg):
    assert torch.equal(cifar10_jpeg.train_y, torch.arange(10).repeat_interleave(5_000))
    with tarfile.open(ARCHIVE) as archive:
        names = archive.getnames()
        # (split, index in the split, class, position within the class)
        for split, index, class_name, position in (
            ("train", 12_345, "bird", 2_345),
            ("test", 9_999, "truck", 999),
        ):
            file_name = sorted(n for n in names if n.startswith(f"{split}/{class_name}/"))[position]
            pixels = torch.from_numpy(np.array(Image.open(archive.extractfile(file_name))))
            expected = normalize_images(pixels.permute(2, 0, 1)[None])[0]
            assert torch.equal(getattr(cifar10_jpeg, f"{split}_x")[index], expected)


@needs_archive
def test_pil_and_torchvision_decoders_agree():
    with tarfile.open(ARCHIVE) as archive:
        files = (member for member in archive if member.isfile())
        encoded = [archive.extractfile(member).read() for member in itertools.islice(files, 200)]
    assert torch.equal(
        torch.stack(_decode_with_pil(encoded)), torch.stack(_decode_with_torchvision(encoded))
    )


@needs_archive
def test_cifar10_jpeg_second_load_reads_the_cache(cifar10_jpeg, jpeg_cache_dir, caplog):
    cache_files = list(jpeg_cache_dir.glob("cifar10-jpeg-*.pt"))
    assert len(cache_files) == 1 and cache_files[0].stat().st_size > 60_000 * 3 * 32 * 32
    with caplog.at_level(logging.INFO, logger="grab_exp.data.cifar10_jpeg"):
        again = load_cifar10_jpeg(archive=ARCHIVE, cache_dir=jpeg_cache_dir)
    assert "read cached tensors" in caplog.text and "decoded" not in caplog.text
    for name in ("train_x", "train_y", "test_x", "test_y"):
        assert torch.equal(getattr(again, name), getattr(cifar10_jpeg, name))
    assert again.classes == cifar10_jpeg.classes


@needs_archive
def test_cifar10_jpeg_cache_is_keyed_by_the_archive_checksum(jpeg_cache_dir):
    (name,) = [path.name for path in jpeg_cache_dir.glob("cifar10-jpeg-*.pt")]
    assert name == f"cifar10-jpeg-{file_sha256(ARCHIVE)[:16]}.pt"
    assert load_or_decode(ARCHIVE, jpeg_cache_dir)["classes"] == CIFAR10_CLASSES


@needs_archive
def test_cifar10_jpeg_subset_is_stratified(jpeg_cache_dir, cifar10_jpeg):
    small = load_cifar10_jpeg(cache_dir=jpeg_cache_dir, subset=1_000, test_subset=200)
    assert torch.bincount(small.train_y).tolist() == [100] * 10
    assert torch.bincount(small.test_y).tolist() == [20] * 10


@needs_archive
def test_a_forged_or_truncated_cache_is_decoded_again_with_a_warning(
    cifar10_jpeg, jpeg_cache_dir, tmp_path, caplog
):
    (good,) = jpeg_cache_dir.glob("cifar10-jpeg-*.pt")
    cache = tmp_path / good.name  # the right name, the wrong content
    forged = torch.load(good, weights_only=True)
    forged["train_images"].zero_()
    forged["train_labels"].fill_(3)  # all one class: test accuracy would be trivially learnt
    torch.save(forged, cache)
    for problem in ("train labels are not 5000 per class", "unreadable ("):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="grab_exp.data.cifar10_jpeg"):
            data = load_cifar10_jpeg(archive=ARCHIVE, cache_dir=tmp_path)
        assert f"decoded-data cache {cache}: {problem}" in caplog.text
        assert "decoding the archive again" in caplog.text
        assert torch.equal(data.train_x, cifar10_jpeg.train_x)
        assert torch.equal(data.train_y, cifar10_jpeg.train_y)
        cache.write_bytes(cache.read_bytes()[: cache.stat().st_size // 2])  # then: truncated


@needs_archive
@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_a_damaged_archive_is_named_in_one_line(tmp_path, damage):
    archive = tmp_path / "cifar10-jpeg.tar.gz"
    data = ARCHIVE.read_bytes()
    archive.write_bytes(data[: len(data) // 2] if damage == "truncated" else b"not a tar" * 99)
    with pytest.raises(ValueError) as raised:
        load_cifar10_jpeg(archive=archive, cache_dir=tmp_path)
    message = str(raised.value)
    assert message.startswith(f"dataset.archive: {archive} is damaged or not a CIFAR-10 JPEG")
    assert "\n" not in message
    assert list(tmp_path.glob("*.pt")) == []  # nothing cached from it


def test_missing_archive_names_the_setting_and_path(tmp_path):
    missing = tmp_path / "nowhere" / "cifar10-jpeg.tar.gz"
    with pytest.raises(FileNotFoundError) as raised:
        load_cifar10_jpeg(archive=missing, cache_dir=tmp_path)
    message = str(raised.value)
    assert message.startswith("dataset.archive: ") and str(missing) in message
    assert "\n" not in message


def test_relative_archive_paths_resolve_from_the_repo_root(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # as after Hydra changes directory
    with pytest.raises(FileNotFoundError, match=str(repo_root() / "no-such.tar.gz")):
        resolve_archive("no-such.tar.gz")


# ---------------------------------------------------------------- torchvision CIFAR-10 offline


def cifar10_host_reachable() -> bool:
    try:
        socket.create_connection(("www.cs.toronto.edu", 443), timeout=3).close()
    except OSError:
        return False
    return True


def load_within(seconds: float, **settings) -> BaseException | None:
    """Run the cifar10 loader in a daemon thread; return its error, failing if it runs too long."""
    outcome: dict[str, BaseException | None] = {}

    def attempt() -> None:
        try:
            instantiate(settings) if "_target_" in settings else load_cifar10(**settings)
            outcome["error"] = None
        except BaseException as error:  # the error itself is what the test inspects
            outcome["error"] = error

    worker = threading.Thread(target=attempt, daemon=True)
    worker.start()
    worker.join(seconds)
    assert "error" in outcome, f"cifar10 loader still running after {seconds} s"
    return outcome["error"]


def assert_offline_error(error: BaseException | None) -> None:
    if isinstance(error, InstantiationException):  # hydra wraps the loader's error
        error = error.__cause__
    assert isinstance(error, RuntimeError), f"expected RuntimeError, got {error!r}"
    message = str(error)
    assert "cifar10_jpeg" in message and "\n" not in message
    assert error.__cause__ is not None


@pytest.mark.skipif(cifar10_host_reachable(), reason="online: the offline failure cannot occur")
def test_cifar10_offline_fails_in_one_line_naming_cifar10_jpeg(tmp_path):
    started = time.perf_counter()
    assert_offline_error(load_within(120, data_dir=tmp_path / "empty", download_timeout_s=5))
    assert time.perf_counter() - started < 120


# ---------------------------------------------------------------- conf/dataset/*.yaml


def test_dataset_config_group_has_the_cifar_shaped_datasets():
    assert set(CIFAR_SHAPED) <= {path.stem for path in DATASET_FILES}


@pytest.mark.parametrize("config_path", DATASET_CONFIGS, ids=lambda path: path.stem)
def test_every_dataset_config_instantiates(config_path, tmp_path, jpeg_cache_dir):
    config = OmegaConf.load(config_path)
    assert {"_target_", "subset"} <= set(config)
    if config_path.stem == "cifar10":
        if cifar10_host_reachable():
            pytest.skip("online: the offline failure cannot occur (and would download 170 MB)")
        config.data_dir, config.download_timeout_s = str(tmp_path / "empty"), 5
        assert_offline_error(load_within(120, **OmegaConf.to_container(config)))
        return
    if config_path.stem == "cifar10_jpeg":
        if not ARCHIVE.is_file():
            pytest.skip(f"CIFAR-10 JPEG archive absent: {ARCHIVE}")
        config.cache_dir, config.subset, config.test_subset = str(jpeg_cache_dir), 500, 100
    data = instantiate(config)
    assert isinstance(data, ArrayData)
    assert data.train_x.shape[1:] == (3, 32, 32) and data.num_classes == 10


@pytest.mark.parametrize(("subset", "test_subset"), [(None, None), (37, None), (None, 11), (50, 9)])
def test_uint8_subsets_equal_the_subsets_of_the_converted_dataset(subset, test_subset):
    """Bit for bit the old order (convert all, then select), for every combination of sizes."""
    g = torch.Generator().manual_seed(3)
    tensors = [
        torch.randint(0, 256, (120, 3, 4, 4), generator=g, dtype=torch.uint8),
        torch.randint(0, 10, (120,), generator=g),
        torch.randint(0, 256, (40, 3, 4, 4), generator=g, dtype=torch.uint8),
        torch.randint(0, 10, (40,), generator=g),
    ]
    classes = [str(k) for k in range(10)]
    old = take_subsets(array_data_from_uint8(*tensors, classes=classes), subset, test_subset, 5)
    new = uint8_subsets(tensors, classes, subset, test_subset, 5)
    for name in ("train_x", "train_y", "test_x", "test_y"):
        assert torch.equal(getattr(new, name), getattr(old, name)), name
    with pytest.raises(ValueError, match=r"^dataset\.test_subset: got 41; allowed"):
        uint8_subsets(tensors, classes, 10, 41)


class FloatConversions(TorchDispatchMode):
    """Counts the uint8 elements converted to float32 inside the block."""

    def __init__(self) -> None:
        super().__init__()
        self.elements = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func.overloadpacket is torch.ops.aten._to_copy and args[0].dtype == torch.uint8:
            self.elements += out.numel() if out.dtype == torch.float32 else 0
        return out


@needs_archive
def test_the_jpeg_loader_converts_only_the_kept_images(tmp_path):
    """A job on 1,000 + 200 examples converts those (the loader converted all 60,000 first),
    and its dataset equals the subset of the whole converted one."""
    whole = load_cifar10_jpeg(ARCHIVE, cache_dir=tmp_path)  # decodes once into the cache
    with FloatConversions() as counted:
        part = load_cifar10_jpeg(ARCHIVE, cache_dir=tmp_path, subset=1000, test_subset=200)
    assert counted.elements == (1000 + 200) * 3 * 32 * 32
    expected = take_subsets(whole, 1000, 200)
    for name in ("train_x", "train_y", "test_x", "test_y"):
        assert torch.equal(getattr(part, name), getattr(expected, name)), name
