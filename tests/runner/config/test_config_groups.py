"""Every option of every config group under ``conf/`` composes and instantiates.

The options are globbed (``conf/<group>/*.yaml``, nested groups such as ``hydra/launcher``
included), so a new YAML is covered without touching this file; a ``_target_`` of a group
that has no instantiation check here fails until one is added. Also: every YAML key is
commented, presets are ``# @package _global_``, the launcher configs compose, Table 1's
sweep is the report's 7 rows x 3 seeds, and LeNet has 62,006 parameters.
"""

from __future__ import annotations

import importlib.util
import socket
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import InstantiationException
from hydra.plugins.launcher import Launcher
from hydra.utils import get_class, instantiate
from omegaconf import OmegaConf
from support.fake_data import write_image_folder, write_mnist
from support.grab_run import (
    ARCHIVE,
    CONF_DIR,
    cifar10_in_place,
    compose_config,
    group_options,
    option_override,
)
from torch import nn
from torch.nn import functional as F

from grab_exp.__main__ import user_error_line
from grab_exp.balance import Ordering
from grab_exp.data import ArrayData
from grab_exp.data.download import unreachable
from grab_exp.data.vision import DATASETS
from grab_exp.runner.config.check import validate_config

GROUP_OPTIONS = group_options()
PRESET_GROUPS = ("experiment", "row", "arm")  # whole-run presets, merged at the root
# the deliverables of the runner issue (more options may exist; these must)
REQUIRED_OPTIONS = {
    "model": {"lenet", "mlp", "logreg"},
    "dataset": {"cifar10", "cifar10_jpeg", "synthetic"},
    "optimizer": {"sgd", "adam"},
    "balance": {"rr", "so", "fixed", "mean", "pair", "batch", "recursive", "recursive_pair"},
    "pipeline": {"functional", "classic"},
    "logger": {"local", "wandb"},
    "experiment": {"table1", "smoke", "vrgd_large_batch"},
    "arm": {"sgd_momentum", "vr_momentum", "adam", "vr_adam"},
    "row": {"rr_classic", "rr", "mean", "pair", "batch", "recursive", "recursive_pair"},
    "hydra/launcher": {"joblib_local", "slurm"},
}
TABLE1_ROWS = ["rr_classic", "rr", "mean", "pair", "batch", "recursive", "recursive_pair"]
TABLE1_SEEDS = [0, 7, 42]
LENET_PARAMETERS = 62_006
PLUGIN_LAUNCHERS = {  # option -> (plugin module, launcher class)
    "joblib": ("hydra_plugins.hydra_joblib_launcher", "JoblibLauncher"),
    "joblib_local": ("hydra_plugins.hydra_joblib_launcher", "GrabJoblibLauncher"),  # stops
    "submitit_slurm": ("hydra_plugins.hydra_submitit_launcher", "SlurmLauncher"),
    "slurm": ("hydra_plugins.hydra_submitit_launcher", "SlurmLauncher"),
}


def option_id(group_option: tuple[str, str]) -> str:
    return "/".join(group_option)


def options_of(*groups: str) -> list[tuple[str, str]]:
    return [(g, o) for g, o in GROUP_OPTIONS if g in groups]


def target_options() -> list[tuple[str, str]]:
    """Options whose own YAML has a top-level ``_target_``."""
    return [
        (g, o)
        for g, o in GROUP_OPTIONS
        if "_target_" in (yaml.safe_load((CONF_DIR / g / f"{o}.yaml").read_text()) or {})
    ]


def group_node(cfg, group: str):
    """The composed node of ``group``: ``cfg.model``, ``cfg.hydra.launcher``, ..."""
    return OmegaConf.select(cfg, group.replace("/", "."))


def plugin_installed(option: str) -> bool:
    return importlib.util.find_spec(PLUGIN_LAUNCHERS[option][0]) is not None


# ---------------------------------------------------------------- the glob itself


def test_every_group_folder_is_globbed_with_its_required_options():
    found: dict[str, set[str]] = {}
    for group, option in GROUP_OPTIONS:
        found.setdefault(group, set()).add(option)
    for group, required in REQUIRED_OPTIONS.items():
        assert required <= found.get(group, set()), f"conf/{group}: missing {required}"
    folders = {p.parent.relative_to(CONF_DIR).as_posix() for p in CONF_DIR.rglob("*.yaml")}
    assert folders - {"."} == set(found)


# ---------------------------------------------------------------- composition


@pytest.mark.parametrize("group_option", GROUP_OPTIONS, ids=option_id)
def test_every_option_composes(group_option):
    group, option = group_option
    if option in PLUGIN_LAUNCHERS and not plugin_installed(option):
        pytest.skip(f"launcher plugin absent: pip install -e '.[launchers]' ({option})")
    cfg = compose_config([option_override(group, option)], hydra=True)
    assert cfg.hydra.runtime.choices[group] == option
    if group not in PRESET_GROUPS:
        # the option's keys land under its group, with the YAML's values
        own = OmegaConf.load(CONF_DIR / group / f"{option}.yaml")
        node = group_node(cfg, group)
        for key in own:
            if key != "defaults" and not OmegaConf.is_interpolation(own, key):
                assert node[key] == own[key], f"{group}/{option}: {key}"


# a valid run needs gradient-free orderings with the classic pipeline
RUN_COMPANIONS = {
    ("pipeline", "classic"): ["balance=rr"],
    ("arm", "sgd_momentum"): ["balance=rr"],  # the plain arms run the classic pipeline
    ("arm", "adam"): ["balance=rr"],
}


@pytest.mark.parametrize(
    "group_option",
    [go for go in GROUP_OPTIONS if go[0] not in ("hydra/launcher",)],
    ids=option_id,
)
def test_every_option_gives_a_valid_run_config(group_option, tmp_path):
    """Each option, with the defaults for the rest, passes the runner's validation."""
    group, option = group_option
    extra = RUN_COMPANIONS.get(group_option, [])
    cfg = compose_config([option_override(group, option), *extra])
    if get_class(cfg.balance._target_).__module__.startswith("grab_exp.distributed"):
        cfg = compose_config([option_override(group, option), *extra, "distributed=true"])
    if "archive" in cfg.dataset:
        cfg.dataset.archive = str(tmp_path)  # an existing path: validation only checks it exists
    cifar10_in_place(cfg, tmp_path / "cifar10")
    if group == "dataset" and option in MADE_DATA:
        make_data(option, cfg, tmp_path)
    elif (
        group == "dataset"
        and "name" in cfg.dataset  # torchvision's, by download
        and (reason := unreachable(DATASETS[option][1], 5.0))
    ):
        pytest.skip(
            f"dataset={option} would be downloaded, and its server is out of reach here "
            f"({reason}); the offline line is tested in test_every_target_instantiates"
        )
    validate_config(cfg)


# ---------------------------------------------------------------- instantiation


def check_model(model, cfg) -> None:
    assert isinstance(model, nn.Module)
    if cfg.model.get("_target_", "").endswith("WordLM"):  # tokens in, a word's logits each
        vocabulary = model.head.out_features
        tokens = torch.randint(0, vocabulary, (4, 7))
        assert model(tokens).shape == (4, 7, vocabulary)
        return
    x = torch.randn(4, 3, 32, 32)
    assert model(x).shape == (4, 10)


def check_optimizer(factory) -> None:
    model = nn.Linear(3, 2)
    optimizer = factory(model.parameters())
    assert isinstance(optimizer, torch.optim.Optimizer)
    assert [p for g in optimizer.param_groups for p in g["params"]] == list(model.parameters())


def check_balance(factory, cfg) -> None:
    n, d = 4 * cfg.batch_size, 6
    cls = get_class(cfg.balance._target_)
    if issubclass(cls, Ordering) and not cls.distributed:
        ordering = factory(n=n, d=d, seed=0, device="cpu")
        assert sorted(ordering.order.tolist()) == list(range(n))
        grads = torch.randn(n, d)
        for start in range(0, n, cfg.batch_size):  # one whole epoch in the run's mini-batches
            ordering.step(grads[ordering.order[start : start + cfg.batch_size]])
        ordering.set_epoch(1)
        assert sorted(ordering.order.tolist()) == list(range(n))
        return
    from grab_exp.distributed import DistributedOrdering, SimulatedComm, split_shards

    assert issubclass(cls, DistributedOrdering), f"{cls} is no ordering"
    shards = split_shards(n, 2, seed=0).shards
    ordering = factory(shards=shards, d=d, comm=SimulatedComm(2), seed=0, device="cpu")
    assert sorted(ordering.orders.flatten().tolist()) == sorted(shards.flatten().tolist())


def check_pipeline(factory) -> None:
    torch.manual_seed(0)
    model = instantiate(compose_config().model)
    pipeline = factory(model=model, loss_fn=F.cross_entropy)
    x, y = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))
    loss, grads = pipeline(x, y)
    assert loss.dim() == 0 and torch.isfinite(loss)
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    if type(pipeline).provides_per_sample:
        grads = grads.as_dict()  # name -> (B, *shape)
        assert {name: g.shape for name, g in grads.items()} == {
            name: (8, *p.shape) for name, p in model.named_parameters()
        }
        mean = {name: g.mean(0) for name, g in grads.items()}
        for name, p in model.named_parameters():
            torch.testing.assert_close(p.grad, mean[name], rtol=1e-4, atol=1e-6)
    else:
        assert grads is None


def refuse_connections(*args, **kwargs):
    raise ConnectionRefusedError(111, "Connection refused (test: offline)")


#: the dataset options whose data a test makes on disk (fake_data), for torchvision's readers
MADE_DATA = ("mnist", "fashion_mnist", "image_folder", "text", "arrays")


def make_data(option: str, cfg, tmp_path) -> None:
    """Write ``option``'s data into ``tmp_path`` and point ``cfg.dataset`` at it."""
    if option in ("mnist", "fashion_mnist"):
        folder = "MNIST" if option == "mnist" else "FashionMNIST"
        write_mnist(tmp_path / option / folder / "raw", {"train": 30, "test": 20})
        cfg.dataset.data_dir = str(tmp_path)
    elif option == "image_folder":
        write_image_folder(tmp_path / "images", ("ant", "bee"), per_class=3)
        cfg.dataset.root = str(tmp_path / "images")
    elif option == "arrays":  # CIFAR-shaped values in [-1, 1], 10 classes
        g = np.random.default_rng(0)
        for split in ("train", "test"):
            x, y = g.uniform(-1, 1, size=(20, 3, 32, 32)), np.arange(20) % 10
            np.savez(tmp_path / f"{split}.npz", x=x, y=y)
            cfg.dataset[split] = str(tmp_path / f"{split}.npz")
    else:  # text
        (tmp_path / "corpus.txt").write_text("a b c d e f g\n" * 400)
        cfg.dataset.path = str(tmp_path / "corpus.txt")


def check_made_dataset(option: str, cfg, tmp_path) -> ArrayData:
    """The loaders of data a test can make on disk, read by torchvision's readers."""
    make_data(option, cfg, tmp_path)
    data = instantiate(cfg.dataset)
    shapes = {"mnist": (1, 28, 28), "fashion_mnist": (1, 28, 28), "image_folder": (3, 32, 32)}
    shapes["arrays"] = (3, 32, 32)
    if option == "text":
        assert data.train_x.shape[1:] == (cfg.dataset.seq_len,) == data.train_y.shape[1:]
    else:
        assert data.train_x.shape[1:] == shapes[option] and data.train_x.dtype == torch.float32
        assert -1.0 <= data.train_x.min() < 0 < data.train_x.max() <= 1.0
    return data


def check_dataset(option: str, cfg, monkeypatch, tmp_path) -> None:
    if option in MADE_DATA:
        check_made_dataset(option, cfg, tmp_path)
        return
    if option in ("cifar100", "svhn"):  # offline, nothing on disk: the one line
        monkeypatch.setattr(socket, "create_connection", refuse_connections)
        cfg.dataset.data_dir = str(tmp_path)
        with pytest.raises(InstantiationException) as info:
            instantiate(cfg.dataset)
        assert user_error_line(info.value).startswith(f"dataset={option}: not in {tmp_path}")
        return
    if option == "cifar10":
        monkeypatch.setattr(socket, "create_connection", refuse_connections)
        cfg.dataset.data_dir = str(tmp_path / "cifar10")
        with pytest.raises(InstantiationException) as info:
            instantiate(cfg.dataset)
        cause = info.value.__cause__
        assert isinstance(cause, RuntimeError)
        assert "\n" not in str(cause) and "dataset=cifar10_jpeg" in str(cause)
        assert user_error_line(info.value) == str(cause)  # what the CLI prints after "error: "
        return
    if "archive" in cfg.dataset and not ARCHIVE.is_file():
        pytest.skip(f"CIFAR-10 JPEG archive absent: {ARCHIVE}")
    data = instantiate(cfg.dataset)
    assert isinstance(data, ArrayData)
    assert data.train_x.shape[1:] == (3, 32, 32) and data.train_x.dtype == torch.float32
    assert data.test_x.shape[1:] == (3, 32, 32) and data.num_classes == 10
    assert len(data.train_y) == len(data.train_x) and len(data.test_y) == len(data.test_x)
    if option == "cifar10_jpeg":
        assert (len(data.train_y), len(data.test_y)) == (50_000, 10_000)
        assert -1.0 <= data.train_x.min() < 0 < data.train_x.max() <= 1.0  # normalized 0.5/0.5


def check_loss(loss) -> None:
    """The per-sample contract: the batch loss is the mean of the examples' own losses, and
    ``total`` their sum."""
    g = torch.Generator().manual_seed(0)
    if loss.perplexity:  # a language model's (B, T, V) logits and (B, T) next tokens
        out, y = torch.randn(6, 5, 11, generator=g), torch.randint(0, 11, (6, 5), generator=g)
    else:
        out, y = torch.randn(6, 4, generator=g), torch.randint(0, 4, (6,), generator=g)
    each = torch.stack([loss(out[i : i + 1], y[i : i + 1]) for i in range(len(y))])
    torch.testing.assert_close(loss(out, y), each.mean())
    torch.testing.assert_close(loss.total(out, y), each.sum())


def check_launcher(option: str, node) -> None:
    if option in PLUGIN_LAUNCHERS and not plugin_installed(option):
        pytest.skip(f"launcher plugin absent: pip install -e '.[launchers]' ({option})")
    launcher = instantiate(node)
    assert isinstance(launcher, Launcher)
    if option in PLUGIN_LAUNCHERS:
        assert type(launcher).__name__ == PLUGIN_LAUNCHERS[option][1]
        plugin = PLUGIN_LAUNCHERS[option][0].rsplit(".", 1)[-1]
        assert any(
            c.__module__.startswith(f"hydra_plugins.{plugin}") for c in type(launcher).__mro__
        )


@pytest.mark.parametrize("group_option", target_options(), ids=option_id)
def test_every_target_instantiates(group_option, monkeypatch, tmp_path):
    group, option = group_option
    cfg = compose_config([option_override(group, option)], hydra=group.startswith("hydra/"))
    node = group_node(cfg, group)
    if group == "hydra/launcher":
        check_launcher(option, node)
        return
    sizes = {"num_classes": 11, "in_features": 3 * 32 * 32}  # the data's, where left to it
    left = {key: size for key, size in sizes.items() if node.get(key, 0) is None}
    built = None if group == "dataset" else instantiate(node, **left)
    if group == "model":
        check_model(built, cfg)
    elif group == "optimizer":
        check_optimizer(built)
    elif group == "balance":
        check_balance(built, cfg)
    elif group == "pipeline":
        check_pipeline(built)
    elif group == "dataset":
        check_dataset(option, cfg, monkeypatch, tmp_path)
    elif group == "loss":
        check_loss(built)
    else:
        pytest.fail(f"conf/{group}: no instantiation check for this group; add one here")


def test_lenet_has_62006_parameters_through_the_composed_config():
    cfg = compose_config(["model=lenet"])
    model = instantiate(cfg.model)
    assert sum(p.numel() for p in model.parameters()) == LENET_PARAMETERS
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) == LENET_PARAMETERS


# ---------------------------------------------------------------- comments and packages


def _keys(node: yaml.Node):
    """Every mapping key node under ``node`` (nested mappings and lists included)."""
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            yield key, value
            yield from _keys(value)
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            yield from _keys(item)


def uncommented_keys(text: str) -> list[str]:
    """``line: key`` of every YAML key with neither a same-line ``#`` comment nor a comment
    line directly above it."""
    lines = text.splitlines()
    root = yaml.compose(text)
    missing = []
    for key, value in _keys(root) if root is not None else ():
        row = key.start_mark.line
        if value.start_mark.line == row and value.end_mark.line == row and value.value != "":
            rest = lines[row][value.end_mark.column :]  # after a value on the key's line
        else:
            rest = lines[row][key.end_mark.column :].lstrip().removeprefix(":")
        same_line = rest.strip().startswith("#")
        above = row > 0 and lines[row - 1].strip().startswith("#")
        if not (same_line or above):
            missing.append(f"{row + 1}: {key.value}")
    return missing


def test_comment_checker_finds_uncommented_keys():
    text = (
        "# header\n"
        "a: 1  # commented\n"
        "b: '# not a comment'\n"
        "\n"
        "c:\n"
        "  # above\n"
        "  d: [1, 2]  # list\n"
        "  e: x#y\n"
        "f:\n"
        "  - g: 1  # in a list\n"
        "  - h: 2\n"
    )
    assert uncommented_keys(text) == ["3: b", "5: c", "8: e", "9: f", "11: h"]


ALL_YAMLS = sorted(CONF_DIR.rglob("*.yaml"))


@pytest.mark.parametrize("path", ALL_YAMLS, ids=lambda p: p.relative_to(CONF_DIR).as_posix())
def test_every_yaml_key_has_a_comment(path: Path):
    assert uncommented_keys(path.read_text()) == []


@pytest.mark.parametrize("group_option", options_of(*PRESET_GROUPS), ids=option_id)
def test_presets_are_global_packages(group_option):
    group, option = group_option
    first = (CONF_DIR / group / f"{option}.yaml").read_text().splitlines()[0]
    assert first.strip() == "# @package _global_"


# ---------------------------------------------------------------- launchers


@pytest.mark.parametrize("option", ["joblib_local", "slurm", "joblib", "submitit_slurm"])
def test_launcher_configs_compose(option):
    if not plugin_installed(option):
        pytest.skip(f"launcher plugin absent: pip install -e '.[launchers]' ({option})")
    cfg = compose_config([f"hydra/launcher={option}"], hydra=True)
    module, cls = PLUGIN_LAUNCHERS[option]
    if option == "joblib_local":  # grab_exp's subclass of the plugin's launcher (it stops)
        module = "hydra_plugins.grab_exp_plugins"
    assert cfg.hydra.launcher._target_.startswith(module) and cfg.hydra.launcher._target_.endswith(
        cls
    )
    if option == "joblib_local":
        assert cfg.hydra.launcher.n_jobs == 2
    if option == "slurm":
        assert cfg.hydra.launcher.max_num_timeout == 0 and cfg.hydra.launcher.gpus_per_node == 1


def test_default_launcher_is_basic():
    cfg = compose_config(hydra=True)
    assert cfg.hydra.runtime.choices["hydra/launcher"] == "basic"


# ---------------------------------------------------------------- Table 1


def table1_sweep() -> dict[str, list[str]]:
    """Table 1's sweep as Hydra expands it: override key -> values."""
    params = compose_config(["experiment=table1"], hydra=True).hydra.sweeper.params
    parsed = OverridesParser.create().parse_overrides([f"{k}={v}" for k, v in params.items()])
    return {o.get_key_element(): list(o.sweep_string_iterator()) for o in parsed}


def test_table1_sweeps_the_seven_rows_times_three_seeds():
    sweep = table1_sweep()
    assert set(sweep) == {"row", "seed"}
    assert sweep["row"] == TABLE1_ROWS
    assert sorted(int(s) for s in sweep["seed"]) == TABLE1_SEEDS
    assert set(sweep["row"]) == {o for g, o in GROUP_OPTIONS if g == "row"}
    assert len(sweep["row"]) * len(sweep["seed"]) == 21


@pytest.mark.parametrize("row", TABLE1_ROWS)
def test_table1_rows_follow_the_report_protocol(row, tmp_path):
    cfg = compose_config(["experiment=table1", f"row={row}"], hydra=True)
    choices = cfg.hydra.runtime.choices
    assert (choices.model, choices.dataset, choices.optimizer) == ("lenet", "cifar10", "sgd")
    assert (cfg.epochs, cfg.batch_size, cfg.name) == (100, 16, "table1")
    assert (cfg.optimizer.lr, cfg.optimizer.momentum, cfg.optimizer.weight_decay) == (
        0.001,
        0.9,
        0.01,
    )
    variant, pipeline = (row.removesuffix("_classic"), "classic" if "classic" in row else None)
    assert choices.balance == variant
    assert choices.pipeline == (pipeline or "functional")
    if row == "recursive":
        assert cfg.balance.depth == 5
    run_cfg = compose_config(["experiment=table1", f"row={row}"])
    cifar10_in_place(run_cfg, tmp_path)  # no download: validation checks the rest
    validate_config(run_cfg)


def test_table1_from_a_clone_composes_its_21_jobs_on_torchvisions_cifar10(tmp_path):
    """``-m experiment=table1 epochs=1 dataset.subset=...``: every job on torchvision's CIFAR-10
    (no archive of ours), each valid once the data is there."""
    params = compose_config(["experiment=table1"], hydra=True).hydra.sweeper.params
    jobs = [
        ["experiment=table1", "epochs=1", "dataset.subset=1000", f"row={row}", f"seed={seed}"]
        for row in params.row.split(",")
        for seed in str(params.seed).split(",")
    ]
    assert len(jobs) == 21
    for overrides in jobs:
        cfg = compose_config(overrides)
        assert cfg.dataset._target_ == "grab_exp.data.load_cifar10" and "archive" not in cfg.dataset
        assert (cfg.epochs, cfg.dataset.subset) == (1, 1000)
        cifar10_in_place(cfg, tmp_path)  # no download here: validation checks the rest
        validate_config(cfg)
