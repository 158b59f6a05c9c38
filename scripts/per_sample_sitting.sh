#!/usr/bin/env bash
# The per-sample cost before and after a change, alternated in one sitting (issue 49): the
# per_sample benchmark on the per-sample code of $BEFORE (default d72f4c7, the commit before issue
# 49's redesign), from a temporary git worktree, then on the checkout's, ROUNDS times (default 2),
# REPEATS timed steps per method (default 10), MODELS and METHODS (comma-separated; default all).
# Both sides run this checkout's benchmark harness (grab_exp/bench/per_sample.py and machine.py,
# copied into the worktree), so that only the per-sample code differs. Run it on an otherwise
# idle machine from the repository root at a clean commit (~10 minutes a round on 2 cores with
# every method, ~2 with METHODS=auto; OUT relative to the root). Every round's files go to
# $OUT/$SITTING/ (default per_sample_sitting: before_<k>.json, after_<k>.json, the before commit
# in before_commit.txt); with every method, the last round's after file is also
# $OUT/per_sample.json. `python scripts/results_numbers.py` reads them.
set -euo pipefail
out="${OUT:-results/bench}"  # relative to the repository root (the files record it)
before_commit="$(git rev-parse "${BEFORE:-d72f4c7}")"
rounds="${ROUNDS:-2}"
repeats="${REPEATS:-10}"
models="${MODELS:-lenet,resnet18_gn,lstm_lm,transformer}"
methods="${METHODS:-auto,func,loop}"
sitting="$out/${SITTING:-per_sample_sitting}"
rm -rf "$sitting"
mkdir -p "$sitting"
echo "$before_commit" > "$sitting/before_commit.txt"
worktree="$(mktemp -d)/before"
git worktree add --detach -q "$worktree" "$before_commit"
trap 'git worktree remove --force "$worktree"' EXIT
for harness in per_sample machine; do  # one harness for both
  cp "grab_exp/bench/$harness.py" "$worktree/grab_exp/bench/$harness.py"
done
export OMP_NUM_THREADS=1
# glibc's malloc gives an allocation above its mmap threshold fresh pages, which the kernel
# zeroes at first touch, on every call; what those page faults cost varied between processes
# (results/bench/per_sample_sitting_default_malloc/: rounds of one code far apart).
# Both sides take their memory from the heap and keep it (ALLOCATOR=default: glibc's defaults).
if [ "${ALLOCATOR:-heap}" = heap ]; then
  export MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=4294967296
fi
for k in $(seq 1 "$rounds"); do
  echo "== round $k: before ($before_commit)" >&2
  (cd "$worktree" && mkdir -p "$sitting" && PYTHONPATH="$worktree" python -m grab_exp.bench \
    per_sample --unchecked --models "$models" --methods "$methods" --repeats "$repeats" \
    --out "$sitting/before_$k.json")
  cp "$worktree/$sitting/before_$k.json" "$sitting/before_$k.json"
  echo "== round $k: after" >&2
  python -m grab_exp.bench per_sample --unchecked --models "$models" --methods "$methods" \
    --repeats "$repeats" --out "$sitting/after_$k.json"
done
if [ "$methods" = "auto,func,loop" ]; then  # every method: the last round is the full table
  cp "$sitting/after_$rounds.json" "$out/per_sample.json"
fi
