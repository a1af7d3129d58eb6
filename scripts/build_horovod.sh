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
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
PYTHON=${PYTHON:-python3}
HOROVOD_VERSION=$(python3 "$here/versions.py" horovod)
cache=${HVD_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/airflow-provider-hvd/wheels}
gpu_ops=${HVD_GPU_OPERATIONS:-}
jobs=${HVD_BUILD_JOBS:-$(nproc)}

torch_version=$("$PYTHON" -c 'import torch; print(torch.__version__)') || {
    echo "build_horovod: torch is not importable by $PYTHON; install torch first" >&2; exit 1; }
py_tag=$("$PYTHON" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
flavour=cpu; [ -n "$gpu_ops" ] && flavour=$(echo "$gpu_ops" | tr 'A-Z' 'a-z')
# horovod records the torch it was built against: a new torch needs a new wheel,
# so torch's version (with its +cpu/+cu local tag) is part of the key.
key="horovod-${HOROVOD_VERSION}_torch-${torch_version//+/_}_${py_tag}_${flavour}"
dest="$cache/$key"

if ls "$dest"/horovod-*.whl >/dev/null 2>&1; then
    echo "build_horovod: reusing cached wheel in $dest" >&2
    ls "$dest"/horovod-*.whl | head -n1
    exit 0
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "build_horovod: building horovod $HOROVOD_VERSION for torch $torch_version ($py_tag, $flavour); about 6 minutes on 2 cores" >&2
"$PYTHON" -m pip download -q --no-binary :all: --no-deps --no-build-isolation -d "$work" "horovod==$HOROVOD_VERSION" >&2
tar -xzf "$work"/horovod-"$HOROVOD_VERSION".tar.gz -C "$work"
src="$work/horovod-$HOROVOD_VERSION"
for f in "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"; do
    grep -q 'CMAKE_CXX_STANDARD 14' "$f" || {
        echo "build_horovod: expected 'CMAKE_CXX_STANDARD 14' in $f; the sdist changed, update this recipe" >&2; exit 1; }
    sed -i 's/CMAKE_CXX_STANDARD 14/CMAKE_CXX_STANDARD 17/' "$f"
done

export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1
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
