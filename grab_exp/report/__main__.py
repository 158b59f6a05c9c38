"""``python -m grab_exp.report COMMAND ...``: see :mod:`grab_exp.report.cli`."""

import sys

from grab_exp.report.cli import main

if __name__ == "__main__":
    sys.exit(main())
