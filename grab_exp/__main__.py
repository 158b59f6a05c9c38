"""``python -m grab_exp [overrides]``: Hydra-composed training (``-m`` for a multirun)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from grab_exp.runner.config.schema import register_schema
from grab_exp.runner.launch.override_keys import unknown_key_error, wrong_type_error
from grab_exp.runner.rundir.resolvers import register_resolvers
from grab_exp.runner.training.errors import JobEndError, error_record, user_error_line
from grab_exp.runner.training.signals import JobInterrupted, hand_over

register_resolvers()
register_schema()
__all__ = ["main", "user_error_line"]
#: command-line shorthands -> the override they stand for
SHORTHANDS = {
    "distributed=true": "distributed.enabled=true",
    "distributed=false": "distributed.enabled=false",
}


def rerun_effect(run_dir: Path) -> str:
    """What the same command does next: resume from the last whole epoch's checkpoint, or
    start over when no epoch had finished (nothing to resume)."""
    from grab_exp.runner.rundir.checkpoint import CHECKPOINT_NAME

    if (run_dir / CHECKPOINT_NAME).is_file():
        return "the same command resumes it"
    return "no epoch had finished: the same command starts it over"


def sweep_size(params: dict[str, str]) -> int:
    """How many jobs ``hydra.sweeper.params`` (override -> comma-separated values) describe."""
    size = 1
    for values in params.values():
        size *= len(str(values).split(","))
    return size


def warn_if_sweep_preset_runs_once() -> None:
    """One warning when a preset meant for a multirun (``hydra.sweeper.params``) runs without -m."""
    hydra_cfg = HydraConfig.get()
    params = hydra_cfg.sweeper.get("params") or {}
    if hydra_cfg.mode == RunMode.RUN and params:
        preset = hydra_cfg.runtime.choices.get("experiment")
        logging.getLogger("grab_exp").warning(
            "experiment=%s is a sweep of %d jobs (%s); without -m only this one job runs: "
            "add -m to run them all",
            preset,
            sweep_size(params),
            " x ".join(params),
        )


@hydra.main(config_path="pkg://grab_exp.conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> float | None:
    """Train one job; returns the final test accuracy (for sweepers).

    A user error ends the process with one ``error: ...`` line on stderr and exit status 1,
    with or without ``HYDRA_FULL_ERROR``; any other exception keeps Hydra's traceback. SIGTERM
    or SIGINT end it with ``interrupted: <dir>; the same command resumes it`` and status 143
    or 130 (``...; no epoch had finished: the same command starts it over`` when there is no
    checkpoint yet).
    """
    from hydra.core.hydra_config import HydraConfig

    from grab_exp.distributed.comm import end_finished_rank, end_process
    from grab_exp.runner.rundir.state import mark_job_log_start, remove_refused_job
    from grab_exp.runner.training.job import run_job  # after Hydra set up logging

    mark_job_log_start(HydraConfig.get().runtime.output_dir)  # before this job's first line
    warn_if_sweep_preset_runs_once()
    in_sweep = HydraConfig.get().mode == RunMode.MULTIRUN  # the sweeper reports, not the job
    try:
        final = run_job(cfg)
    except JobInterrupted as stop:
        run_dir = HydraConfig.get().runtime.output_dir
        if in_sweep:
            hand_over(stop)
            raise JobEndError("interrupted", run_dir, stop.signum) from None
        print(f"interrupted: {run_dir}; {rerun_effect(Path(run_dir))}", file=sys.stderr)
        hand_over(stop)  # submitit's preemption: it requeues the job (and exits)
        end_process(stop.exit_code)
    except Exception as error:
        line = user_error_line(error)
        if line is not None:  # refused before the run started: nothing of it stays
            remove_refused_job(HydraConfig.get().runtime.output_dir)
        if in_sweep:
            if line is None:
                logging.getLogger("grab_exp").exception("the job failed")
            raise JobEndError("failed", error_record(error)["message"]) from None
        if line is None:
            raise
        print(f"error: {line}", file=sys.stderr)
        end_process(1)
    if not in_sweep:
        end_finished_rank()
    return final.get("test/acc")


def expand_shorthands(argv: list[str]) -> list[str]:
    """``argv`` with every :data:`SHORTHANDS` key replaced by its override, and ``-m`` /
    ``--multirun`` moved before the overrides (Hydra's parser takes it only there)."""
    argv = [SHORTHANDS.get(arg.lower(), arg) for arg in argv]
    flags = [arg for arg in argv[1:] if arg in ("-m", "--multirun")]
    return argv[:1] + flags + [arg for arg in argv[1:] if arg not in flags]


if __name__ == "__main__":
    sys.argv = expand_shorthands(sys.argv)
    from grab_exp.runner.launch.search_path import (
        missing_config_dir_error,
        unknown_option_error,
        unparsable_yaml_error,
    )

    # before Hydra's traceback of a YAML file, its block of the search path and its "+key=" advice
    args = sys.argv[1:]
    if (
        error := missing_config_dir_error(args)
        or unparsable_yaml_error(args)
        or unknown_option_error(args)
        or unknown_key_error(args)
        or wrong_type_error(args)
    ):
        sys.exit(f"error: {error}")
    main()
