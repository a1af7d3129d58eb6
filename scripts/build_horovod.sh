#!/usr/bin/env bash
# Build (or reuse) a horovod wheel from the PyPI sdist against the torch that is
# installed in $PYTHON's environment, and print the wheel's path on stdout.
#
# One recipe for every place horovod is built: scripts/setup.sh on a laptop or CI,
# and docker/ for the GPU workers (HVD_GPU_OPERATIONS=NCCL).
#
# horovod 0.28.1 (its last release) hard-codes C++14; torch >= 2.1 headers need
# C++17. Raising CMAKE_CXX_STANDARD to 17 in *both* CMakeLists.txt files builds;
# raising only the torch one fails at link time with a duplicate definition of
# gloo::rendezvous::Store::kDefaultTimeout (measured, see docs/architecture.md).
#
# Environment:
#   PYTHON               interpreter whose environment has torch (default: python3)
#   HVD_WHEEL_CACHE      cache folder (default: ~/.cache/airflow-provider-hvd/wheels)
#   HVD_GPU_OPERATIONS   empty for a CPU build, NCCL for GPU workers
#   HVD_BUILD_JOBS       parallel compile jobs (default: number of cores)
#   HVD_WITH_TENSORFLOW  1: also build horovod's TensorFlow plugin, against the TensorFlow
#                        installed in $PYTHON's environment (setup.sh's HVD_FLAVOUR=tensorflow)
#
# The TensorFlow plugin (horovod 0.28.1 was last tested with TF 2.12) builds against
# TF 2.21 once one optional source is left out: horovod/tensorflow/xla_mpi_ops.cc, the
# XLA custom-call ops (used only with HOROVOD_ENABLE_XLA_OPS=1), whose TF 2.2x headers
# include highwayhash/ headers that the TensorFlow wheel does not ship. Measured, see
# docs/architecture.md.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
PYTHON=${PYTHON:-python3}
HOROVOD_VERSION=$(python3 "$here/versions.py" horovod)
cache=${HVD_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/airflow-provider-hvd/wheels}
gpu_ops=${HVD_GPU_OPERATIONS:-}
jobs=${HVD_BUILD_JOBS:-$(nproc)}
with_tf=${HVD_WITH_TENSORFLOW:-0}
tf_version=""

torch_version=$("$PYTHON" -c 'import torch; print(torch.__version__)') || {
    echo "build_horovod: torch is not importable by $PYTHON; install torch first" >&2; exit 1; }
py_tag=$("$PYTHON" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
flavour=cpu; [ -n "$gpu_ops" ] && flavour=$(echo "$gpu_ops" | tr 'A-Z' 'a-z')
# horovod records the frameworks it was built against: a new torch or TensorFlow needs a
# new wheel, so their versions (torch's with its +cpu/+cu local tag) are part of the key.
frameworks="torch-${torch_version//+/_}"
if [ "$with_tf" = 1 ]; then
    tf_version=$("$PYTHON" -c 'import importlib.metadata as m; print(m.version("tensorflow"))') || {
        echo "build_horovod: HVD_WITH_TENSORFLOW=1 but tensorflow is not installed for $PYTHON; install it first" >&2; exit 1; }
    frameworks="${frameworks}_tf-${tf_version}"
fi
key="horovod-${HOROVOD_VERSION}_${frameworks}_${py_tag}_${flavour}"
dest="$cache/$key"

if ls "$dest"/horovod-*.whl >/dev/null 2>&1; then
    echo "build_horovod: reusing cached wheel in $dest" >&2
    ls "$dest"/horovod-*.whl | head -n1
    exit 0
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "build_horovod: building horovod $HOROVOD_VERSION for torch $torch_version${tf_version:+ and TensorFlow $tf_version} ($py_tag, $flavour); about $([ "$with_tf" = 1 ] && echo 6 || echo 3) minutes on 2 cores" >&2
"$PYTHON" -m pip download -q --no-binary :all: --no-deps --no-build-isolation -d "$work" "horovod==$HOROVOD_VERSION" >&2
tar -xzf "$work"/horovod-"$HOROVOD_VERSION".tar.gz -C "$work"
src="$work/horovod-$HOROVOD_VERSION"
for f in "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"; do
    grep -q 'CMAKE_CXX_STANDARD 14' "$f" || {
        echo "build_horovod: expected 'CMAKE_CXX_STANDARD 14' in $f; the sdist changed, update this recipe" >&2; exit 1; }
    sed -i 's/CMAKE_CXX_STANDARD 14/CMAKE_CXX_STANDARD 17/' "$f"
done

export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1
if [ "$with_tf" = 1 ]; then
    tf_cmake="$src/horovod/tensorflow/CMakeLists.txt"
    xla_line='list(APPEND TF_SOURCES "${PROJECT_SOURCE_DIR}/horovod/tensorflow/xla_mpi_ops.cc")'
    grep -qF "$xla_line" "$tf_cmake" || {
        echo "build_horovod: expected the xla_mpi_ops.cc line in $tf_cmake; the sdist changed, update this recipe" >&2; exit 1; }
    grep -vF "$xla_line" "$tf_cmake" > "$tf_cmake.new" && mv "$tf_cmake.new" "$tf_cmake"
    export HOROVOD_WITH_TENSORFLOW=1
else
    export HOROVOD_WITHOUT_TENSORFLOW=1
fi
export HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1 HOROVOD_CPU_OPERATIONS=GLOO
export MAKEFLAGS="-j$jobs"
if [ -n "$gpu_ops" ]; then export HOROVOD_GPU_OPERATIONS=$gpu_ops; fi

log="$work/build.log"
if ! "$PYTHON" -m pip wheel --no-build-isolation --no-deps -w "$work/out" "$src" >"$log" 2>&1; then
    tail -n 40 "$log" >&2
    cp "$log" "${TMPDIR:-/tmp}/horovod-build-failed.log"
    echo "build_horovod: the horovod build failed; full log in ${TMPDIR:-/tmp}/horovod-build-failed.log" >&2
    exit 1
fi
mkdir -p "$dest.tmp.$$"
cp "$work"/out/horovod-*.whl "$dest.tmp.$$/"
# Publish the cache entry atomically: a half-copied wheel is never reused.
rm -rf "$dest"; mv "$dest.tmp.$$" "$dest"
ls "$dest"/horovod-*.whl | head -n1
