#!/usr/bin/env bash
# Build (or reuse) wheels of the pinned packages that PyPI ships only as source distributions
# ([tool.airflow-provider-hvd.pins].sdist_only: pyspark, pyspark-client), and print the folder
# that holds them. scripts/setup.sh and the tests that make fresh environments hand it to uv
# and pip as --find-links; for the same version both prefer a wheel to an sdist.
#
# Why: uv keeps what it builds from an sdist under that sdist's HTTP cache entry. Behind a
# registry mirror whose responses fail uv's revalidation (this project's CI machines: uv -v logs
# "Found modified response" for the same file on every install), uv downloads pyspark's 450 MB
# sdist again and builds it again on every install: 25-30 s and 2.3 GB of new uv cache each
# time (measured: two installs in a row, 4.6 GB). A CI run installs it four times (two set-ups,
# the fresh environments of tests/test_packaging.py and test_provider_install.py), and the disk
# filled. With the wheel here, the first install unpacks it once into uv's cache and later ones
# take 0.4 s.
#
# Environment:
#   PYTHON                  interpreter whose pip builds the wheels (default: python3)
#   HVD_SDIST_WHEEL_CACHE   the folder (default: ~/.cache/airflow-provider-hvd/sdist-wheels; not
#                           HVD_WHEEL_CACHE, which docker/ keeps in its images)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
PYTHON=${PYTHON:-python3}
cache=${HVD_SDIST_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/airflow-provider-hvd/sdist-wheels}
mkdir -p "$cache"

for pin in $(python3 "$here/versions.py" sdist_only); do
    name=${pin%%==*}
    version=${pin#*==}
    # A wheel's file name spells the project name with underscores.
    if ls "$cache/${name//-/_}-$version-"*.whl >/dev/null 2>&1; then
        continue
    fi
    echo "build_sdist_wheels: building a wheel of $pin (PyPI has only its sdist)" >&2
    work=$(mktemp -d "$cache/.build.XXXXXX")
    # --no-cache-dir: pip's own cache would hold the sdist and the wheel a second time.
    if ! "$PYTHON" -m pip wheel -q --disable-pip-version-check --no-deps --no-cache-dir -w "$work" "$pin" \
            2> >(grep -v "is ignored: it is neither a file nor a directory" >&2) >&2; then
        rm -rf "$work"
        echo "build_sdist_wheels: pip could not build a wheel of $pin (output above)" >&2
        exit 1
    fi
    # Published with a rename, so a half-written wheel is never taken.
    mv "$work"/*.whl "$cache/"
    rm -rf "$work"
done
echo "$cache"
