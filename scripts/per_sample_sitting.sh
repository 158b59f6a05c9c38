#!/usr/bin/env bash
# The per-sample cost before and after a change (issue 49), both in one process per round: the
# per_sample benchmark with the code of $BEFORE (default d72f4c7, the commit before issue 49's
# redesign) as its --baseline (that commit's grab_exp, from a temporary git worktree, copied as
# the package grab_exp_before), timed interleaved with the checkout's against one plain step.
# ROUNDS processes (default 3), REPEATS timed steps per method (default 10), MODELS and METHODS
# (comma-separated; default all models, auto). Run it on an otherwise idle machine from the
# repository root at a clean commit (~4 minutes a round on 2 cores with METHODS=auto; OUT
# relative to the root). Every round's file goes to $OUT/$SITTING/round_<k>.json (default
# SITTING=per_sample_sitting), the before commit to before_commit.txt.
# `python scripts/results_numbers.py` reads them.
set -euo pipefail
out="${OUT:-results/bench}"  # relative to the repository root (the files record it)
before_commit="$(git rev-parse "${BEFORE:-d72f4c7}")"
rounds="${ROUNDS:-3}"
repeats="${REPEATS:-10}"
models="${MODELS:-lenet,resnet18_gn,lstm_lm,transformer}"
methods="${METHODS:-auto}"
sitting="$out/${SITTING:-per_sample_sitting}"
rm -rf "$sitting"
mkdir -p "$sitting"
echo "$before_commit" > "$sitting/before_commit.txt"
scratch="$(mktemp -d)"
git worktree add --detach -q "$scratch/before" "$before_commit"
trap 'git worktree remove --force "$scratch/before"; rm -rf "$scratch"' EXIT
cp -r "$scratch/before/grab_exp" "$scratch/grab_exp_before"
python - "$scratch/grab_exp_before" <<'PY'
import pathlib, re, sys  # every import of the copy names the copy
for path in pathlib.Path(sys.argv[1]).rglob("*.py"):
    path.write_text(re.sub(r"\bgrab_exp\b", "grab_exp_before", path.read_text()))
PY
export OMP_NUM_THREADS=1 PYTHONPATH="$scratch${PYTHONPATH:+:$PYTHONPATH}"
# glibc's malloc gives an allocation above its mmap threshold fresh pages, which the kernel
# zeroes at first touch, on every call; what those page faults cost varied between processes
# (results/bench/per_sample_sitting_default_malloc/: rounds of one code far apart). Memory from
# the heap, kept between calls (ALLOCATOR=default: glibc's defaults).
if [ "${ALLOCATOR:-heap}" = heap ]; then
  export MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=4294967296
fi
for k in $(seq 1 "$rounds"); do
  echo "== round $k" >&2
  python -m grab_exp.bench per_sample --unchecked --baseline grab_exp_before --models "$models" \
    --methods "$methods" --repeats "$repeats" --out "$sitting/round_$k.json"
done
