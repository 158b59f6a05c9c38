#!/usr/bin/env bash
# The day a GPU is lent: every check that needs one, in under 8 minutes, into one folder.
#
#   scripts/gpu_check.sh OUTPUT_DIR      (or: OUT=OUTPUT_DIR scripts/gpu_check.sh)
#
# Each check is one `check NAME SECONDS COMMAND...` line below: its output goes to
# OUTPUT_DIR/NAME.log, its status to OUTPUT_DIR/checks.txt; a failed check does not stop the
# others, and the script exits 1 when any failed. Add a check (say, another bench's rows) as
# one more line; keep the time limits summing to under 480 s.
set -uo pipefail
out="${1:-${OUT:-}}"
if [[ -z "$out" ]]; then
    echo "error: OUTPUT_DIR: got nothing; allowed: a folder, as the argument or in \$OUT" >&2
    exit 2
fi
mkdir -p "$out"
out="$(cd "$out" && pwd)"
cd "$(dirname "$0")/.."
# the offline CIFAR-10 JPEG archive every real-data check reads (README: "Getting CIFAR-10")
archive="${ARCHIVE:-../shared/data/cifar10-jpeg.tar.gz}"
failed=0

check() {  # check NAME SECONDS COMMAND...
    local name=$1 limit=$2
    shift 2
    local started=$SECONDS
    timeout "$limit" "$@" >"$out/$name.log" 2>&1
    local rc=$?
    local verdict="ok"
    ((rc == 0)) || { verdict="FAILED (exit $rc$( ((rc == 124)) && echo ", over ${limit} s"))"; failed=1; }
    printf '%-14s %-28s %4d s  %s\n' "$name" "$verdict" $((SECONDS - started)) "$*" |
        tee -a "$out/checks.txt"
}

nvidia-smi >"$out/nvidia-smi.txt" 2>&1
python -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name())" \
    >"$out/torch.txt" 2>&1

# every test marked gpu (sync-free steps and epochs, device handling, determinism)
check gpu_tests 230 python -m pytest -m gpu -q -p no:cacheprovider --junitxml="$out/gpu_tests.xml"
# decode the CIFAR-10 archive once into its tensor cache, so the 7 jobs below only read it
check cifar10_cache 40 python -c "from grab_exp.data import load_cifar10_jpeg; load_cifar10_jpeg('$archive')"
# Table 1's 7 rows, 1 epoch of real CIFAR-10, device=cuda, the rows in parallel on the one GPU
check table1 140 python -m grab_exp -m experiment=table1 dataset=cifar10_jpeg \
    dataset.archive="$archive" epochs=1 seed=0 device=cuda progress=none \
    hydra/launcher=joblib_local hydra.launcher.n_jobs=7 hydra.sweep.dir="$out/table1"
check table1_report 30 python -m grab_exp.report table1 "$out/table1" --out "$out/report"
# the GPU epoch bench: every row's step time, stage breakdown and peak step memory
check epoch_bench 30 python -m grab_exp.bench epoch --device cuda --repeats 5 --steps 10 \
    --warmup 3 --out "$out/bench_epoch.json"

exit $failed
