"""``python -m grab_exp [overrides]``: Hydra-composed training (``-m`` for a multirun)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import InstantiationException
from hydra.types import RunMode
from omegaconf import DictConfig

from grab_exp.logging.files import DamagedFileError
from grab_exp.runner.lock import RunDirInUseError
from grab_exp.runner.override_keys import unknown_key_error
from grab_exp.runner.resolvers import register_resolvers
from grab_exp.runner.schema import ConfigError, register_schema
from grab_exp.runner.signals import JobInterrupted, hand_over

register_resolvers()
register_schema()
#: errors whose message is written for users: one ``error: ...`` line, no traceback
USER_ERRORS = (ConfigError, DamagedFileError, RunDirInUseError)
#: command-line shorthands -> the override they stand for
SHORTHANDS = {
    "distributed=true": "distributed.enabled=true",
    "distributed=false": "distributed.enabled=false",
}

PACKAGE_DIR = Path(__file__).resolve().parent


def _raised_by_grab_exp(error: BaseException) -> bool:
    """Whether ``error`` was raised by this package's own code (a message written for users)."""
    tb = error.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    return Path(tb.tb_frame.f_code.co_filename).resolve().is_relative_to(PACKAGE_DIR)


def user_error_line(error: BaseException) -> str | None:
    """The one-line message of a user error, or ``None`` for anything else (keeps its traceback).

    User errors are the :data:`USER_ERRORS` (a bad config, a damaged run file, a run directory
    in use) and an error that a ``_target_`` of this package (e.g. a dataset loader) raised
    itself, which Hydra's ``instantiate`` wraps in an ``InstantiationException``.
    """
    if isinstance(error, USER_ERRORS):
        return str(error)
    cause = error.__cause__
    if (
        isinstance(error, InstantiationException)
        and cause is not None
        and _raised_by_grab_exp(cause)
        and str(cause).strip()
    ):
        return str(cause).strip().splitlines()[0]
    return None


def rerun_effect(run_dir: Path) -> str:
    """What the same command does next: resume from the last whole epoch's checkpoint, or
    start over when no epoch had finished (nothing to resume)."""
    from grab_exp.runner.checkpoint import CHECKPOINT_NAME

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


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> float | None:
    """Train one job; returns the final test accuracy (for sweepers).

    A user error ends the process with one ``error: ...`` line on stderr and exit status 1,
    with or without ``HYDRA_FULL_ERROR``; any other exception keeps Hydra's traceback. SIGTERM
    or SIGINT end it with ``interrupted: <dir>; the same command resumes it`` and status 143
    or 130 (``...; no epoch had finished: the same command starts it over`` when there is no
    checkpoint yet).
    """
    from hydra.core.hydra_config import HydraConfig

    from grab_exp.distributed.comm import end_process
    from grab_exp.runner.lifecycle import run_job  # after Hydra set up logging

    warn_if_sweep_preset_runs_once()
    try:
        final = run_job(cfg)
    except JobInterrupted as stop:
        run_dir = HydraConfig.get().runtime.output_dir
        print(f"interrupted: {run_dir}; {rerun_effect(Path(run_dir))}", file=sys.stderr)
        hand_over(stop)  # submitit's preemption: it requeues the job (and exits)
        end_process(stop.exit_code)
    except Exception as error:
        line = user_error_line(error)
        if line is None:
            raise
        print(f"error: {line}", file=sys.stderr)
        end_process(1)
    return final.get("test/acc")


def expand_shorthands(argv: list[str]) -> list[str]:
    """``argv`` with every :data:`SHORTHANDS` key replaced by its override."""
    return [SHORTHANDS.get(arg.lower(), arg) for arg in argv]


if __name__ == "__main__":
    sys.argv = expand_shorthands(sys.argv)
    if unknown_key := unknown_key_error(sys.argv[1:]):  # before Hydra's "+key=" advice
        sys.exit(f"error: {unknown_key}")
    main()
