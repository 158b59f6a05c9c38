#!/usr/bin/env python
"""Thin wrapper of ``python -m grab_exp.report`` (see ``--help``).

Example: ``python scripts/make_report.py outputs/table1 --out results/table1``.
"""

import sys

from grab_exp.report.cli import main

if __name__ == "__main__":
    sys.exit(main())
