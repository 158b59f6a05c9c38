#!/usr/bin/env bash
# Every committed benchmark of results/bench/, one after another in one sitting (run it on an
# otherwise idle machine, from the repository root, at a clean commit; ~25 minutes on 2 cores).
# The commands are those of results/bench/README.md's table. OUT=<folder> writes elsewhere.
set -euo pipefail
out="${OUT:-results/bench}"
mkdir -p "$out"
bench() { echo "== $*" >&2; python -m grab_exp.bench "$@"; }
OMP_NUM_THREADS=1 bench epoch --repeats 30 --out "$out/epoch_1t.json"
OMP_NUM_THREADS=2 bench epoch --repeats 30 --out "$out/epoch_2t.json"
bench orderings --repeats 200 --depths 3,5,7,9 --out "$out/orderings.json"
bench projection --out "$out/projection.json"
bench rss --out "$out/rss.json"
OMP_NUM_THREADS=1 bench conv --out "$out/conv.json"
bench vrgd --out "$out/vrgd.json"
bench sweep --settings 1x2,2x1 --rows rr_classic,mean --seeds 0,7 --out "$out/sweep.json"
