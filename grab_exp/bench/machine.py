"""A description of the machine a benchmark ran on, the benchmarks' JSON files, and the
options every benchmark's command line shares."""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
from pathlib import Path

import torch

from grab_exp.logging.provenance import cpu_model

#: what a benchmark runs: the package, its configs and plugins, its dependencies (not the
#: results a sitting rewrites, nor documentation)
CODE = ("grab_exp", "hydra_plugins", "pyproject.toml")

#: the 1-minute load average when the benchmark's command line was built (before it measured)
_load_at_start: float | None = None


def _load_average() -> float | None:
    return round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None


def _commit() -> dict:
    """The git commit of the package's checkout and whether its code (:data:`CODE`, new files
    too) differs from it (both ``None`` outside a git checkout)."""
    root = Path(__file__).resolve().parents[2]

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", *args], cwd=root, capture_output=True, text=True, check=True, timeout=10
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip()

    commit = git("rev-parse", "HEAD")
    status = ("status", "--porcelain", "--untracked-files=all", "--", *CODE)
    changes = git(*status) if commit else None
    return {"commit": commit, "dirty": None if changes is None else bool(changes)}


def describe_machine(device: torch.device) -> dict:
    """CPU, core count, torch threads and version, the GPU name when on CUDA, the load and the
    commit.

    ``load_avg_1m`` (the 1-minute load average when the benchmark started, read by
    :func:`bench_parser` before anything is measured, where the platform has one) shows whether
    other work shared the machine: near 0 on an idle one; the benchmark's own load is not in
    it. ``commit`` and ``dirty`` name the code that ran (``dirty``: files of :data:`CODE`
    differed from the commit, or were new). ``malloc``: the glibc allocator's ``MALLOC_*``
    settings in the environment (``{}``: its defaults).
    """
    info = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "device": str(device),
        "malloc": {k: v for k, v in sorted(os.environ.items()) if k.startswith("MALLOC_")},
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    load = _load_at_start if _load_at_start is not None else _load_average()
    if load is not None:
        info["load_avg_1m"] = load
    info.update(_commit())
    return info


#: where a benchmark writes its JSON unless ``--out`` names another file (``/report/`` is
#: ignored by git; the committed reports in ``results/bench/`` are only written when named)
DEFAULT_OUT_DIR = Path("report") / "bench"


class _HelpWithDefaults(argparse.HelpFormatter):
    """Each option's help ends with its default, where it has one worth showing."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        help_text = action.help or ""
        if action.default in (None, False, [], "", argparse.SUPPRESS) or "%(default" in help_text:
            return help_text
        return f"{help_text} (default: %(default)s)"


def bench_parser(name: str, doc: str | None) -> argparse.ArgumentParser:
    """The parser of ``python -m grab_exp.bench <name>``, with the ``--out`` every one has.

    Args:
        name: The benchmark's name (its JSON is ``report/bench/<name>.json`` by default).
        doc: The benchmark module's docstring (its first line is the description).
    """
    global _load_at_start
    _load_at_start = _load_average()  # every benchmark builds its parser first
    parser = argparse.ArgumentParser(
        prog=f"python -m grab_exp.bench {name}",
        description=(doc or "").strip().splitlines()[0] if doc else None,
        formatter_class=_HelpWithDefaults,
    )
    parser.add_argument(
        "--out",
        default=str(DEFAULT_OUT_DIR / f"{name}.json"),
        help=f"file the JSON report is written to (results/bench/{name}.json replaces the "
        "committed one)",
    )
    return parser


def add_device_option(parser: argparse.ArgumentParser) -> None:
    """``--device``: where the benchmark runs (CUDA when there is one)."""
    parser.add_argument(
        "--device",
        default="cuda" if torch.cuda.is_available() else "cpu",
        help="torch device to run on: cpu, cuda, cuda:<k>",
    )


def bench_report(
    name: str, args, device: torch.device, settings: dict | None = None, **entries
) -> dict:
    """A benchmark's JSON report: ``benchmark`` (``name``), ``settings`` (the options, updated
    with ``settings``), ``machine`` (:func:`describe_machine` of ``device``), then ``entries``
    (``rows``, ...)."""
    report = {"benchmark": name, "settings": {**vars(args), **(settings or {})}}
    return {**report, "machine": describe_machine(device), **entries}


def write_report(path: str | Path, report: dict) -> None:
    """Write a benchmark's report as indented JSON, creating the folder; atomically (a
    temporary file renamed over it), so a killed benchmark leaves its last complete write."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(json.dumps(report, indent=2) + "\n")
    partial.replace(path)
