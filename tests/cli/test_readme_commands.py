"""Every training command the READMEs show composes, and every report command parses.

The commands are read from the fenced ``bash`` blocks of ``README.md``, ``CONTRIBUTING.md``,
``docs/*.md`` and ``results/**/README.md``
(backslash continuations joined, comments dropped, placeholders such as ``<folder>`` or
``n_jobs=N`` replaced by example values), so the documentation cannot drift from
``conf/``: a ``python -m grab_exp ...`` or ``torchrun ... -m grab_exp ...`` line is composed with
Hydra's compose API with each of its swept values (``-m``) and each of its preset's own swept
values, and validated; a ``python -m grab_exp.report ...`` line is parsed by the report's parser.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from support.grab_run import ARCHIVE, REPO_ROOT, cifar10_in_place, compose_config, run_cli

from grab_exp.report.cli import COMMANDS
from grab_exp.report.cli import parser as report_parser
from grab_exp.runner.config.check import validate_config

#: docs/your-experiment.md's commands need the files the page writes first: they run, with
#: them, in tests/cli/test_your_experiment_page.py
READMES = [
    REPO_ROOT / "README.md",
    REPO_ROOT / "CONTRIBUTING.md",
    *sorted(p for p in (REPO_ROOT / "docs").glob("*.md") if p.name != "your-experiment.md"),
    *sorted((REPO_ROOT / "results").rglob("README.md")),
]
FENCE = re.compile(r"```bash\n(.*?)```", re.DOTALL)


def _commands(readme: Path) -> list[str]:
    commands = []
    for block in FENCE.findall(readme.read_text(encoding="utf-8")):
        joined = block.replace("\\\n", " ")
        for line in joined.splitlines():
            line = line.split(" # ", 1)[0].strip()
            if line and not line.startswith("#"):
                commands.append(line)
    return commands


def _after(words: list[str], module: str) -> list[str] | None:
    """The arguments after ``-m <module>`` (None if the command does not run it)."""
    for i in range(len(words) - 1):
        if words[i] == "-m" and words[i + 1] == module:
            return words[i + 2 :]
    return None


PLACEHOLDER = re.compile(r"<[^>]*>")  # hydra.sweep.dir=<fresh temporary folder>
LETTER = re.compile(r"=([A-Z])$")  # hydra.launcher.n_jobs=N


def _train_args(command: str) -> list[str] | None:
    """The overrides of a training command; placeholders become example values."""
    args = _after(shlex.split(PLACEHOLDER.sub("placeholder", command)), "grab_exp")
    return None if args is None else [LETTER.sub("=1", arg) for arg in args]


TRAIN = [(r.name, c) for r in READMES for c in _commands(r) if _train_args(c) is not None]
REPORT = [
    (r.name, c)
    for r in READMES
    for c in _commands(r)
    if _after(shlex.split(c), "grab_exp.report") is not None
]


def _each_value(choices: list[list[str]]) -> list[list[str]]:
    """Jobs in which every swept value occurs at least once (the others at their first value):
    what can go wrong is one value, and the sum of the lists is far cheaper than their product."""
    first = [values[0] for values in choices]
    jobs = [first]
    for i, values in enumerate(choices):
        jobs += [[*first[:i], value, *first[i + 1 :]] for value in values[1:]]
    return jobs


def _sweeps(args: list[str]) -> list[list[str]]:
    """The command line's sweep: ``k=a,b`` values expanded (``-m`` dropped)."""
    choices = []
    for arg in args:
        key, _, value = arg.partition("=")
        if "," in value and not key.startswith("hydra.") and "[" not in value:
            choices.append([f"{key}={v}" for v in value.split(",")])
        elif arg != "-m":
            choices.append([arg])
    return _each_value(choices)


def _preset_jobs(overrides: list[str]) -> list[list[str]]:
    """The jobs of the preset's own sweep (``hydra.sweeper.params``) on top of ``overrides``."""
    cfg = compose_config(overrides, hydra=True)
    params = cfg.hydra.sweeper.get("params") or {}
    given = {o.split("=", 1)[0].lstrip("+~") for o in overrides}  # the command line's win
    swept = [
        [f"{k}={v.strip()}" for v in str(values).split(",")]
        for k, values in params.items()
        if k.lstrip("+~") not in given
    ]
    return [[*overrides, *job] for job in _each_value(swept)] if swept else [overrides]


def test_the_readmes_show_training_and_report_commands():
    assert len(TRAIN) >= 10 and len(REPORT) >= 3


@pytest.mark.parametrize(("readme", "command"), TRAIN, ids=[c for _, c in TRAIN])
def test_every_training_command_composes_and_validates(readme, command, tmp_path):
    args = _train_args(command)
    multirun = "-m" in args
    for job in _sweeps(args):
        for overrides in _preset_jobs(job) if multirun else [job]:
            cfg = compose_config(overrides, hydra=True)
            if "archive" in cfg.dataset:
                if not ARCHIVE.is_file():
                    continue  # a user's clone without the data: composing is all we can check
                cfg.dataset.archive = str(ARCHIVE)  # the reader's own archive: here, ours
            cifar10_in_place(cfg, tmp_path)  # no download: validation checks the rest
            validate_config(cfg)


@pytest.mark.parametrize(("readme", "command"), REPORT, ids=[c for _, c in REPORT])
def test_every_report_command_parses(readme, command):
    args = _after(shlex.split(command), "grab_exp.report")
    if args[0] not in COMMANDS:
        args = ["table1", *args]
    parsed = report_parser().parse_args(args)
    assert parsed.out


def test_the_real_command_composes_the_distributed_shorthand(tmp_path):
    args = ["distributed=true", "distributed.workers=8", "distributed.timeout_s=30"]
    result = run_cli([*args, "balance=cd_grab", "--cfg", "job"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert "enabled: true" in result.stdout and "workers: 8" in result.stdout
    assert "timeout_s: 30" in result.stdout
