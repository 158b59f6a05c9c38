#!/usr/bin/env bash
# A dress rehearsal of scripts/gpu_check.sh on a CPU machine, as the GPU machine will run it:
#
#   scripts/gpu_check.sh --rehearse OUTPUT_DIR     (PYTHON: the interpreter whose packages
#                                                   the rehearsal's venv links; python3)
#
# 1. The tree as the device tool sends it: a copy of the tracked and untracked-not-ignored
#    files, plus the carried .whl/ and data/ (made by scripts/gpu_prepare.sh when this tree has
#    no complete .whl/ yet: that needs PyPI).
# 2. The GPU image's Python: a fresh venv whose site-packages hold only what the image holds
#    (IMAGE below and what they require), linked from PYTHON's installed distributions rather
#    than downloaded again (torch is gigabytes); hydra, omegaconf, antlr4 and wandb are absent
#    (checked), so gpu_check.sh installs the bundle the way it will there.
# 3. gpu_check.sh with device=cpu, small sizes and 4 times its time limits (2 shared cores, not
#    16 and a GPU): the gpu tests are collected and skip; the bench, the data cache, Table 1
#    (2 jobs at a time) and its report run for real.
# 4. The device tool's limits on what comes back, asserted on OUTPUT_DIR: at most 8 files, each
#    at most 16 MiB and 64 MiB together, no more than 2 folders down, plain names.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-}"
if [[ -z "$out" ]]; then
    echo "error: OUTPUT_DIR: got nothing; allowed: a folder (--rehearse OUTPUT_DIR)" >&2
    exit 2
fi
mkdir -p "$out" && out="$(cd "$out" && pwd)"
PYTHON="${PYTHON:-python3}"
IMAGE="torch torchvision numpy pandas matplotlib pytest pytest-timeout joblib psutil tqdm pyyaml"
WHEELS=(hydra_core-1.3.2 omegaconf-2.3.0 hydra_joblib_launcher-1.2.0 antlr4_python3_runtime-4.9.3)
scratch="$(mktemp -d /tmp/gpu_rehearsal.XXXXXX)"
started=$SECONDS

# 1. the tree that travels, and what is carried with it
bundled() { for w in "${WHEELS[@]}"; do compgen -G "$repo/.whl/$w-*.whl" >/dev/null || return 1; done; }
bundled && [[ -f "$repo/data/cifar10-jpeg.tar.gz" ]] ||
    PYTHON="$PYTHON" bash "$repo/scripts/gpu_prepare.sh" ${GRAB_ARCHIVE:+"$GRAB_ARCHIVE"}
mkdir "$scratch/tree"
(cd "$repo" && git ls-files -z -co --exclude-standard | tar --null --ignore-failed-read -T - -cf -) |
    tar -xf - -C "$scratch/tree"
cp -r "$repo/.whl" "$repo/data" "$scratch/tree/"

# 2. a venv holding the image's distributions (links into PYTHON's) and nothing else
"$PYTHON" -m venv "$scratch/venv"
venv_python="$scratch/venv/bin/python"
env -u PYTHONPATH "$venv_python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])" |
    { read -r site && echo "$scratch/image" >"$site/gpu_image.pth"; }
"$PYTHON" "$repo/scripts/gpu_rehearsal.py" link "$scratch/image" $IMAGE
env -u PYTHONPATH "$venv_python" -c "import torch, torchvision, numpy, pandas, matplotlib, \
pytest, pytest_timeout, joblib, psutil, tqdm, yaml"
for absent in hydra omegaconf antlr4 wandb; do
    if env -u PYTHONPATH "$venv_python" -c "import $absent" 2>/dev/null; then
        echo "error: the rehearsal's venv holds $absent, which the GPU image lacks" >&2
        exit 1
    fi
done
echo "rehearsal: venv ready in $((SECONDS - started)) s ($scratch/venv)"

# 3. the check, on the CPU, small
rc=0
(cd "$scratch/tree" && env -u PYTHONPATH PYTHON="$venv_python" GPU_CHECK_DEVICE=cpu \
    GPU_CHECK_TIME_SCALE="${GPU_CHECK_TIME_SCALE:-4}" \
    GPU_CHECK_SCRATCH="$scratch/run" TABLE1_SUBSET=512 TABLE1_JOBS=2 \
    TABLE1_ARGS="dataset.test_subset=256" GPU_CHECK_BENCH_ARGS="--repeats 1 --steps 2 --warmup 1 --profile-steps 2 --compare=" \
    bash scripts/gpu_check.sh "$out") || rc=$?

# 4. what would come back
"$PYTHON" "$repo/scripts/gpu_rehearsal.py" limits "$out" || rc=1
echo "rehearsal: $((SECONDS - started)) s, exit $rc; scratch folder $scratch"
exit $rc
