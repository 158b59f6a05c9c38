"""``python -m grab_exp.logging upload RUNS...`` (:mod:`grab_exp.logging.upload`)."""

import sys

from grab_exp.logging.upload import main

if __name__ == "__main__":
    sys.exit(main())
