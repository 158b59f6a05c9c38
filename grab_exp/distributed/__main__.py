"""``python -m grab_exp.distributed`` (or ``torchrun ... -m grab_exp.distributed``)."""

import sys

from grab_exp.distributed.cli import main

if __name__ == "__main__":
    sys.exit(main())
