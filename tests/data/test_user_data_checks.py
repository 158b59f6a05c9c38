"""A user's data is checked when it loads, in one line each, before training (issue 52, item 3):
labels within the classes on both splits, finite inputs, non-empty splits, 16-bit images scaled
(other depths refused), text that is not text refused, relative paths taken from the folder the
command ran in, progress for a slow load and SIGTERM honoured during it."""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from support import REPO_ROOT
from support import user_loaders as loaders
from support.grab_run import Job, cli_env, run_in_process

from grab_exp.data import load_image_folder, load_text
from grab_exp.data.checks import DataError, check_loaded
from grab_exp.data.text import check_text
from grab_exp.data.vision import check_image_folder

SETTING = "dataset=mine (my.loader)"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (loaders.bad_label("test", 10, 3), "test_y[3] holds label 10; allowed: 0..9"),
        (loaders.bad_label("train", -1, 7), "train_y[7] holds label -1; allowed: 0..9"),
        (loaders.non_finite("test", float("nan"), 5), "test_x[5] holds nan; allowed: finite"),
        (loaders.non_finite("train", float("inf"), 2), "train_x[2] holds inf; allowed: finite"),
        (loaders.empty("test"), "the test split is empty; allowed: 1 or more examples"),
        (loaders.empty("train"), "the train split is empty; allowed: 1 or more examples"),
    ],
)
def test_loaded_data_that_cannot_train_is_refused_in_one_line(data, message):
    with pytest.raises(DataError) as caught:
        check_loaded(data, SETTING)
    assert str(caught.value).startswith(f"{SETTING}: {message}")
    assert "\n" not in str(caught.value)


def test_a_token_label_outside_the_vocabulary_is_refused():
    tokens = torch.zeros(4, 6, dtype=torch.int64)
    labels = tokens.clone()
    labels[2, 4] = 5
    data = loaders.ArrayData(tokens, labels, tokens, tokens.clone(), classes=("a", "b", "c"))
    with pytest.raises(DataError, match=r"train_y\[2\] holds label 5; allowed: 0\.\.2"):
        check_loaded(data, SETTING)


def test_test_examples_of_another_shape_than_the_training_ones_are_refused_in_one_line():
    images = loaders.images()
    with pytest.raises(ValueError) as caught:  # by ArrayData, when a loader builds it
        dataclasses.replace(images, test_x=images.test_x[:, :1])  # grey test images, RGB train
    assert str(caught.value) == (
        "test_x must be shaped like train_x past dimension 0: train_x is torch.float32 "
        "(N, 3, 32, 32), test_x torch.float32 (M, 1, 32, 32)"
    )


def test_good_data_passes_unchanged():
    data = loaders.images()
    assert check_loaded(data, SETTING) is data


def test_a_bad_label_stops_the_job_before_its_first_epoch(tmp_path):
    run_dir = tmp_path / "run"
    args = ["experiment=smoke", "progress=none", f"hydra.run.dir={run_dir}", "~dataset"]
    args.append("+dataset._target_=support.user_loaders.bad_label")
    done = run_in_process(args, tmp_path, cli_env(OMP_NUM_THREADS="1"))
    assert done.returncode == 1, done.stdout
    errors = [line for line in done.stdout.splitlines() if line.startswith("error:")]
    assert errors == [
        "error: dataset (support.user_loaders.bad_label): test_y[3] holds label 10; allowed: "
        "0..9 (the dataset's 10 classes)"
    ]
    assert "Traceback" not in done.stdout
    assert not (run_dir / "checkpoint.pt").exists()


# ---------------------------------------------------------------- images on disk


def _folder(root: Path, write) -> None:
    """``root/{train,test}/{a,b}/0.png``, each written by ``write(path, k)``."""
    for split in ("train", "test"):
        for k, name in enumerate(("a", "b")):
            (root / split / name).mkdir(parents=True)
            write(root / split / name / "0.png", k)


def _sixteen_bit(path: Path, k: int) -> None:
    values = np.array([[0, 257 * 100, 65535, 257 * (7 + k)]], dtype=np.uint16).repeat(4, 0)
    image = Image.fromarray(values)
    assert image.mode == "I;16"
    image.save(path)


def test_sixteen_bit_grey_images_are_scaled_to_eight_bits(tmp_path, monkeypatch):
    _folder(tmp_path / "data", _sixteen_bit)
    monkeypatch.chdir(tmp_path)  # a relative root is taken from here
    data = load_image_folder(root="data", size=4)
    eight = torch.tensor([0, 100, 255, 7], dtype=torch.float32)
    expected = (eight / 255 - 0.5) / 0.5
    assert torch.equal(data.train_x[0, 0, 0], expected)  # class a, first row, channel 0
    assert torch.equal(data.train_x[0, 2, 3], expected)  # grey: every channel alike
    assert data.train_x[1, 0, 0, 3] == (8 / 255 - 0.5) / 0.5


def test_a_float_image_and_a_corrupt_file_are_refused_naming_the_file(tmp_path):
    _folder(
        tmp_path / "float", lambda p, k: Image.new("F", (4, 4), 0.5).save(p.with_suffix(".tif"))
    )
    with pytest.raises(ValueError, match=r"\.tif is a F-mode image .* allowed: 8-bit images"):
        load_image_folder(root=str(tmp_path / "float"), size=4)
    _folder(tmp_path / "corrupt", lambda p, k: p.write_bytes(b"\x89PNG\r\n\x1a\n" + b"x" * 40))
    with pytest.raises(ValueError, match=r"0\.png is not an image this loader reads") as caught:
        load_image_folder(root=str(tmp_path / "corrupt"), size=4)
    assert "\n" not in str(caught.value)


def test_an_empty_class_folder_is_one_line_naming_it(tmp_path):
    _folder(tmp_path / "data", _sixteen_bit)
    (tmp_path / "data" / "train" / "c").mkdir()
    with pytest.raises(FileNotFoundError, match=r"^dataset\.root: .*/train: .*\bc\b") as caught:
        load_image_folder(root=str(tmp_path / "data"), size=4)
    assert "\n" not in str(caught.value)


def test_a_missing_relative_root_says_where_it_looked(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError) as caught:
        check_image_folder(root="mine")
    assert f"dataset.root: got 'mine' (looked in {tmp_path.resolve() / 'mine'})" in str(
        caught.value
    )


# ---------------------------------------------------------------- text


def test_a_binary_file_is_refused_naming_dataset_path_without_its_bytes(tmp_path):
    binary = tmp_path / "weights.bin"
    binary.write_bytes(bytes(range(256)) * 4096)  # 1 MiB
    with pytest.raises(ValueError) as caught:
        load_text(path=str(binary), seq_len=4)
    message = str(caught.value)
    assert message.startswith(f"dataset.path: {binary} is not ")
    assert len(message) < 300 and "\n" not in message


def test_an_empty_text_file_names_the_file_not_seq_len(tmp_path):
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(ValueError) as caught:
        load_text(path=str(tmp_path / "empty.txt"), seq_len=4)
    assert str(caught.value).startswith(f"dataset.path: {tmp_path / 'empty.txt'} (its train split")
    assert "seq_len" not in str(caught.value)


def test_a_relative_text_path_is_taken_from_the_command_folder(tmp_path, monkeypatch):
    (tmp_path / "corpus.txt").write_text("\n".join(f"w{i} w{i + 1} w{i + 2}" for i in range(40)))
    monkeypatch.chdir(tmp_path)
    assert load_text(path="corpus.txt", seq_len=2).train_x.shape[1] == 2
    with pytest.raises(FileNotFoundError, match=rf"looked for {tmp_path.resolve() / 'nope.txt'}"):
        check_text(path="nope.txt")


# ---------------------------------------------------------------- a slow load


@pytest.mark.slow
def test_a_slow_load_shows_progress_and_sigterm_stops_it(tmp_path):
    run_dir = tmp_path / "run"
    marker = tmp_path / "loading"
    args = ["experiment=smoke", f"hydra.run.dir={run_dir}", "~dataset"]
    args += ["+dataset._target_=support.user_loaders.slow", f"+dataset.marker={marker}"]
    path = os.pathsep.join([str(REPO_ROOT / "tests"), os.environ.get("PYTHONPATH", "")])
    job = Job(args, tmp_path, cli_env(OMP_NUM_THREADS="1", PYTHONPATH=path))
    deadline = time.monotonic() + 120
    while "s so far" not in job.log_path.read_text():  # the first progress line, after 10 s
        assert job.process.poll() is None and time.monotonic() < deadline, job.finish()
        time.sleep(0.2)
    assert marker.exists()
    sent = time.monotonic()
    job.process.send_signal(signal.SIGTERM)
    code, output = job.finish(timeout=30)
    assert code == 128 + signal.SIGTERM, output
    assert time.monotonic() - sent < 10
    assert "loading dataset (support.user_loaders.slow): 10 s so far" in output
