#!/usr/bin/env bash
# On a networked machine: what scripts/gpu_check.sh needs on the GPU machine and that machine
# lacks, into folders of this tree that git ignores (so they travel only when carried).
#
#   scripts/gpu_prepare.sh [ARCHIVE]      (default: ../shared/data/cifar10-jpeg.tar.gz)
#
# .whl/: the CPython 3.12 wheels of hydra-core 1.3.2, omegaconf 2.3.0, hydra-joblib-launcher
# 1.2.0 and antlr4-python3-runtime 4.9.3 (a source archive only: built here with pip wheel;
# Hydra 1.3 breaks on antlr4 4.13), about 0.4 MB. data/cifar10-jpeg.tar.gz: the archive.
# Prints the paths to carry and the command to run there. Needs pip and PyPI (a few seconds).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
archive="${1:-../shared/data/cifar10-jpeg.tar.gz}"
if [[ ! -f "$archive" ]]; then
    echo "error: ARCHIVE: got '$archive' (no such file); allowed: the CIFAR-10 JPEG .tar.gz" >&2
    exit 2
fi
for folder in .whl data; do
    git check-ignore -q "$folder/x" || {
        echo "error: $folder/: not ignored by git; allowed: an ignored folder (.gitignore)" >&2
        exit 2
    }
done
rm -rf .whl && mkdir -p .whl data  # one version of each wheel: two stop the install there
platforms=()
for tag in manylinux_2_28_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64; do
    platforms+=(--platform "$tag")
done
"$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp "${platforms[@]}" -d .whl \
    hydra-core==1.3.2 omegaconf==2.3.0 hydra-joblib-launcher==1.2.0
"$PYTHON" -m pip wheel -q --no-deps -w .whl antlr4-python3-runtime==4.9.3
[[ "$archive" -ef data/cifar10-jpeg.tar.gz ]] || cp -f "$archive" data/cifar10-jpeg.tar.gz
ls -l .whl data
travels=$( (git ls-files -z -co --exclude-standard; find .whl data -type f -print0) |
    du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
echo "carry: [\".whl\", \"data\"]  (the tree with them: $((travels / 1048576)) of 64 MiB)"
echo "run there (timeout_s 360): bash scripts/gpu_check.sh \"\$OUT\""
