#!/usr/bin/env bash
# Every committed benchmark of results/bench/, one after another in one sitting (run it on an
# otherwise idle machine, from the repository root, at a clean commit; ~35 minutes on 2 cores).
# The commands are those of results/bench/README.md's table. OUT=<folder> (relative to the
# repository root) writes elsewhere. BEFORE=<commit>: also run the epoch benchmarks (right after
# each of ours) and the orderings benchmark of that commit, from a temporary git worktree, into
# $OUT/before/ (its commit in $OUT/before/commit.txt): a before/after from the same sitting.
# The 1-thread epoch run times the captured steps too (--captured yes: the traced replay on a CPU).
set -euo pipefail
out="${OUT:-results/bench}"
mkdir -p "$out"
bench() { echo "== $*" >&2; python -m grab_exp.bench "$@"; }
before() {  # the same benchmark at $BEFORE (its own options, --out last), if asked for
  [[ -z "${BEFORE:-}" ]] && return 0
  echo "== (at $BEFORE) $*" >&2
  local file="${*: -1}"  # written in the worktree under the same relative path, then copied
  (cd "$worktree" && mkdir -p "$(dirname "$file")" && PYTHONPATH="$worktree" python -m grab_exp.bench "$@")
  cp "$worktree/$file" "$file"
}
if [[ -n "${BEFORE:-}" ]]; then
  worktree="$(mktemp -d)/before"
  git worktree add --detach -q "$worktree" "$BEFORE"
  trap 'git worktree remove --force "$worktree"' EXIT
  mkdir -p "$out/before"
  git rev-parse "$BEFORE" > "$out/before/commit.txt"
fi
OMP_NUM_THREADS=1 bench epoch --repeats 30 --captured yes --out "$out/epoch_1t.json"
OMP_NUM_THREADS=1 before epoch --repeats 30 --out "$out/before/epoch_1t.json"
OMP_NUM_THREADS=2 bench epoch --repeats 30 --out "$out/epoch_2t.json"
OMP_NUM_THREADS=2 before epoch --repeats 30 --out "$out/before/epoch_2t.json"
bench orderings --repeats 200 --depths 3,5,7,9 --out "$out/orderings.json"
before orderings --repeats 200 --out "$out/before/orderings.json"
bench projection --out "$out/projection.json"
bench rss --out "$out/rss.json"
OMP_NUM_THREADS=1 bench conv --out "$out/conv.json"
bench vrgd --out "$out/vrgd.json"
bench sweep --settings 1x2,2x1 --rows rr_classic,mean --seeds 0,7 --out "$out/sweep.json"
OMP_NUM_THREADS=1 bench epoch --unchecked --warmup 64 --repeats 60 --compare '' --profile-steps 0 --out "$out/epoch_check_1t.json"
OMP_NUM_THREADS=1 bench per_sample --unchecked --out "$out/per_sample.json"
OMP_NUM_THREADS=1 bench epoch --repeats 30 --compare '' --out "$out/epoch_limits_1t.json"
