"""``python -m grab_exp.logging upload RUNS...``: finished local runs into W&B, one W&B run each.

A job that trained without ``logger=wandb`` has everything W&B would show in its run directory:
``metrics.csv`` (the history, one step per epoch), ``summary.json`` (its identity, status, wall
time and final row), its config and its files. This puts each finished run there as one W&B run,
grouped and named as the runner names the runs it mirrors (group: the experiment; name:
``<variant>-<pipeline>-seed<k>``), with the run's files attached. W&B keeps its own files in
``--dir`` (default: each run directory's ``wandb/``); offline, ``wandb sync`` uploads them later.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from grab_exp.logging.files import read_json
from grab_exp.logging.local import SUMMARY_FILE, LocalStore
from grab_exp.logging.wandb_logger import WandbLogger

#: the run's own files attached to its W&B run (those that exist)
FILES = ("metrics.csv", "summary.json", ".hydra/config.yaml", ".hydra/overrides.yaml")


def _nested(flat: dict[str, Any]) -> dict[str, Any]:
    """``{"a.b": 1}`` -> ``{"a": {"b": 1}}`` (the recorded flat config as W&B shows configs)."""
    nested: dict[str, Any] = {}
    for key, value in flat.items():
        *parents, leaf = key.split(".")
        node = nested
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return nested


def run_dirs(paths: Sequence[str | Path]) -> list[Path]:
    """Every run directory (a folder with ``summary.json``) at or under ``paths``, sorted."""
    found: set[Path] = set()
    for path in map(Path, paths):
        if not path.exists():
            raise FileNotFoundError(f"{path}: no such file or folder")
        found |= {p.parent for p in path.rglob(SUMMARY_FILE) if ".old" not in p.parent.name}
    if not found:
        raise FileNotFoundError(f"no run directory (a folder with {SUMMARY_FILE}) under {paths}")
    return sorted(found)


def upload_run(
    run_dir: Path, project: str, entity: str | None, mode: str, wandb_dir: Path | None = None
) -> str:
    """Put one finished run into W&B; return the W&B run's id.

    Raises:
        ValueError: the run did not finish (one line; the same command resumes it).
        RuntimeError: W&B failed (its first error, in one line).
    """
    summary = read_json(run_dir / SUMMARY_FILE)
    if summary.get("status") != "finished":
        raise ValueError(
            f"{run_dir}: the run is {summary.get('status')!r}, not finished; the command that "
            "started it resumes it (with logger=wandb it goes to W&B as it trains)"
        )
    identity = summary.get("identity") or {}
    variant, pipeline = identity.get("variant", "run"), identity.get("pipeline", "functional")
    seed = identity.get("seed", summary.get("seed"))
    logger = WandbLogger(
        project=project,
        entity=entity,
        mode=mode,
        group=identity.get("experiment"),
        name=f"{variant}-{pipeline}-seed{seed}",
        tags=("uploaded",),
    )
    flat = (summary.get("config_fingerprint") or {}).get("config") or {}
    config = {**_nested(flat), "identity": identity}
    where = wandb_dir / run_dir.name if wandb_dir else run_dir
    run_id = logger.start(where, config)
    if run_id is None:
        raise RuntimeError(f"{run_dir}: W&B did not open a run ({logger.failure or logger.mode})")
    for row in LocalStore(run_dir, ("epoch",)).read_metrics():
        logger.log(row, int(row["epoch"]))
    logger.save_files(run_dir, [run_dir / name for name in FILES if (run_dir / name).is_file()])
    logger.finish("finished", summary)
    if logger.failure:
        raise RuntimeError(f"{run_dir}: {logger.failure}")
    return run_id


def main(argv: Sequence[str] | None = None) -> int:
    """``upload RUNS... [--project P] [--entity E] [--mode M] [--dir D]``; the exit status."""
    cli = argparse.ArgumentParser(prog="python -m grab_exp.logging", description=__doc__)
    commands = cli.add_subparsers(dest="command", metavar="COMMAND", required=True)
    upload = commands.add_parser("upload", help="finished local runs into W&B, one run each")
    upload.add_argument("runs", nargs="+", help="run directories, or folders holding them")
    upload.add_argument("--project", default="grab-exp", help="W&B project (default grab-exp)")
    upload.add_argument("--entity", default=None, help="W&B user or team (default: the key's)")
    upload.add_argument(
        "--mode",
        default="auto",
        choices=("auto", "online", "offline"),
        help="auto: WANDB_MODE if set, else online with an API key, else offline",
    )
    upload.add_argument(
        "--dir", type=Path, default=None, help="W&B's own files (default: each run directory)"
    )
    args = cli.parse_args(argv)
    try:
        for run_dir in run_dirs(args.runs):
            run_id = upload_run(run_dir, args.project, args.entity, args.mode, args.dir)
            print(f"{run_dir}: W&B run {run_id}")
    except (FileNotFoundError, ValueError, RuntimeError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0
