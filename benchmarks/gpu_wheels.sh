#!/usr/bin/env bash
# Wheels for benchmarks/gpu_check.sh on a GPU machine that has PyTorch but no package index:
# every name of benchmarks/gpu_wheels.txt as a wheel for that machine's Python, into one folder
# (default .gpu-wheels/, ignored by git) to copy or carry beside the checkout. Binary wheels come
# from the package index for manylinux x86-64; DeepSpeed, which ships an sdist only, is built
# here into a pure-Python wheel with no prebuilt ops (DS_BUILD_OPS=0, in pip's isolated build
# environment, as `make install` builds it). Idempotent: a wheel already in the folder is kept.
#
# Usage: bash benchmarks/gpu_wheels.sh [DIR]     (or `make gpu-wheels`)
#        GPU_PYTHON=3.11 bash benchmarks/gpu_wheels.sh     for a GPU machine on Python 3.11
set -euo pipefail
cd "$(dirname "$0")/.."
DIR="${1:-.gpu-wheels}"
PYV="${GPU_PYTHON:-3.12}"
PY="${PYTHON:-.venv/bin/python}"
LIST=benchmarks/gpu_wheels.txt
mkdir -p "$DIR"
names=$(grep -v -e '^#' -e '^[[:space:]]*$' "$LIST")
binary=$(echo "$names" | grep -v '^deepspeed==')
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  platforms+=(--platform "$p")
done
# shellcheck disable=SC2086  # one argument per name
"$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version "$PYV" --implementation cp \
  "${platforms[@]}" -d "$DIR" $binary
ds=$(echo "$names" | grep '^deepspeed==')
if ! compgen -G "$DIR/deepspeed-${ds#deepspeed==}-*.whl" >/dev/null; then
  src=$(mktemp -d)
  trap 'rm -rf "$src"' EXIT
  "$PY" -m pip download --quiet --no-deps --no-binary=:all: -d "$src" "$ds"
  DS_BUILD_OPS=0 "$PY" -m pip wheel --quiet --no-deps -w "$DIR" "$src"/deepspeed-*.tar.gz
fi
echo "wheels for Python $PYV in $DIR ($(du -sh "$DIR" | cut -f1)):"
ls -1 "$DIR"
