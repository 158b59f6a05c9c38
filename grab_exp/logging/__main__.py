"""``python -m grab_exp.logging upload RUNS...`` (:mod:`grab_exp.report.upload_runs`: an entry
point, above every layer, since the upload reads runs with the report's reader)."""

import sys

from grab_exp.report.upload_runs import main

if __name__ == "__main__":
    sys.exit(main())
