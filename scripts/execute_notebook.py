#!/usr/bin/env python
"""Execute a notebook in place from a clean kernel with nbclient, keeping its outputs.

Example (after the real results land in ``results/table1/runs``)::

    python scripts/execute_notebook.py notebooks/reproduce_figures.ipynb

``--results DIR`` sets ``GRAB_RESULTS_DIR`` for the kernel (the notebook's run folder).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

DEFAULT_NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "reproduce_figures.ipynb"


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
        output: Where to write the executed notebook (default: in place).
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
    client = NotebookClient(
        notebook,
        timeout=timeout,
        kernel_name=kernel,
        resources={"metadata": {"path": str(notebook_path.parent)}},
    )
    client.execute()
    nbformat.write(notebook, Path(output) if output else notebook_path)
    return notebook


def main(argv: list[str] | None = None) -> int:
    """Command line: ``execute_notebook.py [NOTEBOOK] [--results DIR] [--output FILE]``."""
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("notebook", nargs="?", default=str(DEFAULT_NOTEBOOK))
    cli.add_argument("--results", help="run folder (sets GRAB_RESULTS_DIR)")
    cli.add_argument("--output", help="write here instead of in place")
    cli.add_argument("--timeout", type=int, default=600, help="seconds per cell")
    args = cli.parse_args(argv)
    execute(args.notebook, args.results, args.output, args.timeout)
    print(f"executed {args.output or args.notebook}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
