"""``python -m grab_exp.report COMMAND ...``: every report of the project, one entry point.

Each command is a module with the same functions: ``add_arguments(cli)``, ``load(args)`` (the
runs, through :mod:`grab_exp.report.collect`), ``compute(frame, args)``, ``write(report, args)``
(the written files) and ``run(args)`` (the exit status).

Commands:
  table1       Table 1, the paper side by side and Figures 1-2, from runs or W&B
  vrgd         the VRGD large-batch table and figure (``experiment=vrgd_large_batch``)
  distributed  the table of a data-parallel sweep (``cd_grab``, ``d_grab``, ``d_rr``)

``python -m grab_exp.report COMMAND --help`` lists a command's options. Without a command the
arguments are table1's (``python -m grab_exp.report RUNS... --out DIR``), as before commands.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Sequence

from grab_exp.report import distributed, table1, vrgd
from grab_exp.report.frames import ReportWarning

COMMANDS = {"table1": table1, "vrgd": vrgd, "distributed": distributed}
_HELP = {
    "table1": "Table 1, the paper side by side and Figures 1-2",
    "vrgd": "the VRGD large-batch table and figure",
    "distributed": "the table of a data-parallel sweep",
}


def parser() -> argparse.ArgumentParser:
    """The command-line parser: one sub-parser per command of :data:`COMMANDS`."""
    cli = argparse.ArgumentParser(
        prog="python -m grab_exp.report",
        description="Every report of the project; COMMAND --help lists a command's options.",
        epilog="Without a command the arguments are table1's: "
        "python -m grab_exp.report RUNS... --out DIR.",
    )
    commands = cli.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, module in COMMANDS.items():
        command = commands.add_parser(
            name,
            help=_HELP[name],
            description=module.__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        module.add_arguments(command)
        command.set_defaults(run=module.run)
    return cli


def main(argv: Sequence[str] | None = None) -> int:
    """Run a command; returns the exit status (2: bad arguments; 1: no usable run, a bad input
    file, or a failure, in one ``error:`` line).

    Args:
        argv: The arguments (default: ``sys.argv[1:]``); when the first is neither a command
            nor ``-h``/``--help``, they are table1's.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] not in COMMANDS and argv[0] not in ("-h", "--help"):
        argv.insert(0, "table1")
    args = parser().parse_args(argv)
    with warnings.catch_warnings():
        warnings.simplefilter("always", ReportWarning)
        warnings.showwarning = _show_warning
        try:
            return args.run(args)
        except (FileNotFoundError, ValueError, RuntimeError) as error:
            print(f"error: {error}", file=sys.stderr)
            return 1


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    print(f"warning: {message}", file=sys.stderr)
