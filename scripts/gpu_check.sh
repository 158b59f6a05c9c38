#!/usr/bin/env bash
# The day a GPU is lent: every check that needs one, in about 5 minutes, on the GPU machine as
# it is (python3 with torch, no hydra/omegaconf/wandb, no network).
#
#   scripts/gpu_check.sh [OUTPUT_DIR]              on the GPU machine (default: $OUT)
#   scripts/gpu_check.sh --rehearse OUTPUT_DIR     a dress rehearsal on a CPU machine
#
# Needs, prepared on a networked machine by scripts/gpu_prepare.sh (ignored by git, carried):
# .whl/ (hydra-core, omegaconf, hydra-joblib-launcher and antlr4 wheels, installed into the
# scratch folder with --no-index when hydra is missing) and data/cifar10-jpeg.tar.gz.
#
# Environment: PYTHON (python3), GRAB_ARCHIVE (data/cifar10-jpeg.tar.gz), GPU_CHECK_SCRATCH
# (a new folder under /tmp), GPU_CHECK_BUDGET_S (460, the sum of the limits below: a check
# cut short by it would fail), GPU_CHECK_TIME_SCALE (1: multiplies every limit and the budget;
# the rehearsal's 4), TABLE1_SUBSET (10000 training examples for the Table 1 epoch),
# GPU_CHECK_COMPILE_S (the compile tests' limit; default: from results/gpu/probe.jsonl).
#
# Run scripts/gpu_probe.py first (its own call, about 2 minutes): what it finds decides whether
# this check is worth its 8 minutes, and its cold-compile time sizes the compile tests.
#
# The limits (seconds) and what they rest on; no GPU has measured them yet, so each is the
# review's estimate for a 16-core H200 machine with a margin of about 2x:
#   torch_apis 15 (3 s in the CPU rehearsal), gpu_tests 100 (about 40 tests of a few seconds
#   on 4 workers), epoch_bench 60 (24 rows x 5 repeats x 10 steps of milliseconds, captures and
#   profiles; it rewrites its JSON after every repeat, so the report has times even if it is
#   cut), cifar10_cache 25 (8 s in the rehearsal, 2 cores), table1 90 (7 jobs of one epoch on
#   10,000 examples, each converting only its subset), table1_report 20 (3 s in the rehearsal),
#   compile_tests: 4 cold compiles per xdist worker (6 tests on 4 workers, 2 graphs each) of
#   the probe's measured cold compile, x 1.5, + 20; 150 without a probe (a cold LeNet compile
#   took 42 s on our 2-core CPU).
#
# Checks run in order of value, each with its log, a time limit (SIGINT, then SIGKILL 20 s
# later) and pytest's per-test timeout; a failed check does not stop the others. Everything is
# written under the scratch folder (caches too); after every check OUTPUT_DIR gets 4 files:
# checks.txt (each check, its verdict and time), junit.xml (all tests), bench_epoch.json and
# gpu_check.tar.gz (logs, metrics, summaries and the report; no checkpoints). Exit 1 when a
# check failed, 2 on bad input.
set -uo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"

if [[ "${1:-}" == "--rehearse" ]]; then
    shift
    exec bash "$repo/scripts/gpu_rehearse.sh" "$@"
fi

out="${1:-${OUT:-}}"
if [[ -z "$out" ]]; then
    echo "error: OUTPUT_DIR: got nothing; allowed: a folder, as the argument or in \$OUT" >&2
    exit 2
fi
PYTHON="${PYTHON:-python3}"
archive="${GRAB_ARCHIVE:-data/cifar10-jpeg.tar.gz}"
[[ "$archive" == /* ]] || archive="$repo/$archive"
if [[ ! -f "$archive" ]]; then
    echo "error: GRAB_ARCHIVE: got '$archive' (no such file); allowed: the CIFAR-10 JPEG" \
        ".tar.gz (scripts/gpu_prepare.sh copies it to data/)" >&2
    exit 2
fi
device="${GPU_CHECK_DEVICE:-cuda}"
for setting in GPU_CHECK_BUDGET_S GPU_CHECK_TIME_SCALE TABLE1_SUBSET GPU_CHECK_COMPILE_S; do
    if [[ -n "${!setting:-}" && ! "${!setting}" =~ ^[1-9][0-9]*$ ]]; then
        echo "error: $setting: got '${!setting}'; allowed: a positive integer" >&2
        exit 2
    fi
done
scale="${GPU_CHECK_TIME_SCALE:-1}"
budget=$((${GPU_CHECK_BUDGET_S:-460} * scale))
compile_limit="${GPU_CHECK_COMPILE_S:-$("$PYTHON" "$repo/scripts/gpu_rehearsal.py" compile-limit \
    "$repo/results/gpu/probe.jsonl")}" || exit 2
subset="${TABLE1_SUBSET:-10000}"
mkdir -p "$out" && out="$(cd "$out" && pwd)"
scratch="${GPU_CHECK_SCRATCH:-$(mktemp -d /tmp/gpu_check.XXXXXX)}"
mkdir -p "$scratch"/{logs,junit,cache,config,runs} && cd "$repo" || exit 2

# every cache under the scratch folder: the decoded data, matplotlib, Triton, Inductor
export XDG_CACHE_HOME="$scratch/cache" MPLCONFIGDIR="$scratch/config/matplotlib"
export TRITON_CACHE_DIR="$scratch/cache/triton" TORCHINDUCTOR_CACHE_DIR="$scratch/cache/inductor"
export WANDB_MODE=disabled PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
if ! "$PYTHON" -c "import hydra, omegaconf" 2>/dev/null; then
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --target "$scratch/site" .whl/*.whl >"$scratch/logs/wheels.log" 2>&1 ||
        { echo "error: .whl/: the wheels did not install (see $scratch/logs/wheels.log)" >&2; exit 2; }
    export PYTHONPATH="$PYTHONPATH:$scratch/site"
fi

pytest_args=(-p no:cacheprovider -rA -o junit_family=xunit2)
"$PYTHON" -c "import pytest_timeout" 2>/dev/null && pytest_args+=(--timeout=120)
"$PYTHON" -c "import xdist" 2>/dev/null && [[ "$device" == cuda ]] && pytest_args+=(-n 4)
# the test files that hold gpu tests (other files need packages the GPU machine lacks)
gpu_files=(tests/test_torch_apis.py tests/runner/training/test_sync_free.py
    tests/test_gpu_readiness.py tests/balance/test_device_identity.py
    tests/per_sample/test_per_sample_func.py tests/optim/test_vrgd.py
    tests/runner/training/test_capture.py)

started_all=$SECONDS
failed=0
{
    echo "# scripts/gpu_check.sh $(date -u +%FT%TZ), device=$device, budget ${budget} s"
    "$PYTHON" -c "import sys, torch; print('# python', sys.version.split()[0], '| torch', \
torch.__version__, '| cuda', torch.version.cuda, '|', torch.cuda.get_device_name() \
if torch.cuda.is_available() else 'no GPU')" 2>&1
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null |
        sed 's/^/# /'
    echo "# cpu: $(grep -m1 '^model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | sed 's/^ *//')," \
        "$(nproc 2>/dev/null) cores"
} >"$scratch/checks.txt"

collect() {  # refresh OUTPUT_DIR: checks.txt, junit.xml, bench_epoch.json, gpu_check.tar.gz
    cp "$scratch/checks.txt" "$out/checks.txt"
    "$PYTHON" "$repo/scripts/merge_junit.py" "$out/junit.xml" "$scratch"/junit/*.xml
    [[ -f "$scratch/bench_epoch.json" ]] && cp "$scratch/bench_epoch.json" "$out/"
    tar -czf "$out/gpu_check.tar.gz" -C "$scratch" --exclude='*.pt' --exclude='wandb' logs junit runs checks.txt 2>/dev/null
    true
}

check() {  # check NAME SECONDS COMMAND...: its output to logs/NAME.log, its line to checks.txt
    local name=$1 limit=$(($2 * scale))
    shift 2
    local left=$((budget - (SECONDS - started_all)))
    ((left < limit)) && limit=$left
    local started=$SECONDS rc verdict="ok"
    if ((limit < 5)); then
        rc=124 verdict="NOT RUN (the ${budget} s budget is spent)"
    else
        # with-sigint: a shell that started this script in the background ignores SIGINT, and
        # its children inherit that; the check's own command must stop on timeout's SIGINT
        timeout --signal=INT --kill-after=20 "$limit" "$PYTHON" "$repo/scripts/gpu_rehearsal.py" \
            with-sigint "$@" >"$scratch/logs/$name.log" 2>&1
        rc=$?
        ((rc == 0)) || verdict="FAILED (exit $rc$( ((rc == 124 || rc == 137)) && echo ", over ${limit} s"))"
    fi
    ((rc == 0)) || failed=1
    local shown="${*//$PYTHON/python}"  # no machine's folders in checks.txt
    shown="${shown//$scratch/\$SCRATCH}" && shown="${shown//$repo\//}"
    printf '%-14s %-34s %4d s (limit %3d s)  %s\n' "$name" "$verdict" $((SECONDS - started)) \
        "$limit" "$shown" >>"$scratch/checks.txt"
    collect
}

tests() {  # tests NAME SECONDS PYTEST_ARGS...: one pytest check with its junit XML
    local name=$1 limit=$2
    shift 2
    check "$name" "$limit" "$PYTHON" -m pytest "${pytest_args[@]}" -o junit_suite_name="$name" \
        --junitxml="$scratch/junit/$name.xml" "$@"
}

# 1. the APIs we call exist in this torch; the sync-free steps and the device handling
tests torch_apis 15 tests/test_torch_apis.py
tests gpu_tests 100 -m gpu -k "not compile" "${gpu_files[@]:1}"
# 2. the GPU epoch bench: every row's step time, stage breakdown, peak step memory and a short
#    profile (its backward's operators run in autograd's own thread on CUDA)
check epoch_bench 60 "$PYTHON" -m grab_exp.bench epoch --device "$device" \
    ${GPU_CHECK_BENCH_ARGS:---repeats 5 --steps 10 --warmup 3 --profile-steps 5} \
    --out "$scratch/bench_epoch.json"
# 3. Table 1's 7 rows, 1 epoch of real CIFAR-10 on the device (the archive decoded once first),
#    the rows in parallel; then its report, with the bench's time columns
check cifar10_cache 25 "$PYTHON" -c "from grab_exp.data import load_cifar10_jpeg; \
load_cifar10_jpeg('$archive')"
check table1 90 "$PYTHON" -m grab_exp -m experiment=table1 epochs=1 seed=0 device="$device" \
    dataset=cifar10_jpeg dataset.archive="$archive" dataset.subset="$subset" progress=none \
    hydra/launcher=joblib_local hydra.launcher.n_jobs="${TABLE1_JOBS:-7}" \
    hydra.sweep.dir="$scratch/runs/table1" ${TABLE1_ARGS:-}
check table1_report 20 "$PYTHON" -m grab_exp.report table1 "$scratch/runs/table1" \
    --out "$scratch/runs/report" --bench "$scratch/bench_epoch.json"
# 4. compiled steps: the cold torch.compile builds, last (the longest and the least needed)
tests compile_tests "$compile_limit" -m gpu -k compile "${gpu_files[@]:1}" tests/per_sample/test_compile.py

echo "# total $((SECONDS - started_all)) s" >>"$scratch/checks.txt"
collect
cat "$out/checks.txt"
echo "scratch folder (SCRATCH): $scratch"
exit $failed
