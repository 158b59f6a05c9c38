#!/usr/bin/env python
"""Execute a notebook from a clean kernel with nbclient; write the result to a copy.

Example (writes ``report/reproduce_figures.ipynb``; the tracked notebook is left alone)::

    python scripts/execute_notebook.py notebooks/reproduce_figures.ipynb --output report/

``--output`` is a file or a folder (default ``report/``); ``--in-place`` rewrites the notebook
itself (how the committed outputs are refreshed). ``--results DIR`` sets ``GRAB_RESULTS_DIR``
for the kernel (the notebook's run folder).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from traitlets.config import Config

DEFAULT_NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "reproduce_figures.ipynb"
DEFAULT_OUTPUT = "report"


def execute(
    path: str | os.PathLike[str],
    results: str | None = None,
    output: str | os.PathLike[str] | None = None,
    timeout: int = 600,
    kernel: str = "python3",
) -> nbformat.NotebookNode:
    """Run every cell of the notebook at ``path`` in its own folder; write it to ``output``.

    Args:
        path: The notebook.
        results: Run folder for the notebook (``GRAB_RESULTS_DIR``); default: the notebook's.
        output: Where to write the executed notebook: a file, or an existing folder (it gets
            the notebook's name); default: in place.
        timeout: Seconds per cell.
        kernel: Kernel name.

    Returns:
        The executed notebook.

    Raises:
        nbclient.exceptions.CellExecutionError: a cell failed (nothing is written then).
    """
    notebook_path = Path(path).resolve()
    notebook = nbformat.read(notebook_path, as_version=4)
    if results is not None:
        os.environ["GRAB_RESULTS_DIR"] = str(Path(results).resolve())
    with tempfile.TemporaryDirectory(prefix="grab-kernel-") as sockets:
        client = NotebookClient(
            notebook,
            timeout=timeout,
            kernel_name=kernel,
            resources={"metadata": {"path": str(notebook_path.parent)}},
            config=local_kernel_config(Path(sockets)),
        )
        client.execute()
    nbformat.write(notebook, target(notebook_path, output))
    return notebook


def local_kernel_config(sockets: Path) -> Config:
    """Talk to the kernel over Unix sockets in ``sockets`` (IPC), not over TCP: nothing leaves
    the machine, and the kernel has no "TCP without encryption" warning to print."""
    config = Config()
    config.KernelManager.transport = "ipc"
    config.KernelManager.ip = str(sockets / "kernel")
    return config


def target(notebook: Path, output: str | os.PathLike[str] | None) -> Path:
    """The file to write: ``output`` (a folder gets the notebook's name), else ``notebook``."""
    if output is None:
        return notebook
    out = Path(output)
    if out.is_dir() or out.suffix != ".ipynb":
        out.mkdir(parents=True, exist_ok=True)
        return out / notebook.name
    out.parent.mkdir(parents=True, exist_ok=True)
    return out


def main(argv: list[str] | None = None) -> int:
    """Command line: ``execute_notebook.py [NOTEBOOK] [--output PATH | --in-place]``."""
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("notebook", nargs="?", default=str(DEFAULT_NOTEBOOK))
    cli.add_argument("--results", help="run folder (sets GRAB_RESULTS_DIR)")
    where = cli.add_mutually_exclusive_group()
    where.add_argument(
        "--output", default=DEFAULT_OUTPUT, help="file or folder to write (default: report/)"
    )
    where.add_argument("--in-place", action="store_true", help="rewrite the notebook itself")
    cli.add_argument("--timeout", type=int, default=600, help="seconds per cell")
    args = cli.parse_args(argv)
    output = None if args.in_place else args.output
    execute(args.notebook, args.results, output, args.timeout)
    print(f"executed {args.notebook}; wrote {target(Path(args.notebook).resolve(), output)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
