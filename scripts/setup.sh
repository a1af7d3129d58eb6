#!/usr/bin/env bash
# One set-up path for README, CI and docker/: make .venv with Airflow, Spark,
# torch, horovod (built from source, cached) and this package (editable), then
# prove the environment is real. Idempotent: once it has finished, a run with the same
# inputs (this script, pyproject.toml, scripts/, the knobs below) returns at once.
#
#   scripts/setup.sh            # or: make setup
#
# Environment knobs:
#   VENV=.venv                  where the virtual environment lives
#   PYTHON=python3              interpreter that creates it (>= 3.11)
#   HVD_WHEEL_CACHE=...         horovod wheel cache (see scripts/build_horovod.sh)
#   HVD_SDIST_WHEEL_CACHE=...   pyspark's wheel cache (see scripts/build_sdist_wheels.sh)
#   HVD_SKIP_CHECK=1            skip the final environment check
#   HVD_EXTRAS=...              the package's extras (default airflow,examples,bench,test;
#                               docker/ uses airflow,examples,deploy)
#   HVD_FLAVOUR=tensorflow      also install TensorFlow (+ tf-keras) and build horovod's
#                               TensorFlow plugin next to PyTorch's (default: pytorch only;
#                               `make test-tensorflow` uses VENV=.venv-tf HVD_FLAVOUR=tensorflow)
#   HVD_GPU_OPERATIONS=NCCL     build horovod for GPUs (docker/'s GPU workers)
#   TORCH_INDEX_URL=...         take torch from this index (docker/'s CPU images: the CPU wheel)
#   HVD_PREPARE_ONLY=1          stop once the packages and horovod are in $VENV: the slow part,
#                               which writes nothing in the checkout (CI prepares the TensorFlow
#                               environment so while the main tests run; a later run finishes it)
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
step_name=""

# Each step says when it began (seconds into the set-up), so a slow one is seen in CI's log.
step() { step_name=$1; echo "==> [setup] $1  [${SECONDS} s]"; }
fail() { echo "setup FAILED at step '$step_name': $1" >&2; exit 1; }
test_packages=""  # the pid of the test suite's system packages' install, while it runs in the background
trap 'rc=$?; [ -n "$test_packages" ] && wait "$test_packages"
      [ $rc -ne 0 ] && [ -n "$step_name" ] && echo "setup FAILED at step \"$step_name\" (exit $rc); see the output above" >&2' EXIT

as_root() { [ "$(id -u)" = 0 ]; }

# `make test`, `make demo` and CI run the set-up before their own work: what a finished set-up
# wrote is not done again while nothing it was made from has changed.
setup_key=$( { cat scripts/setup.sh scripts/versions.py scripts/build_horovod.sh scripts/build_sdist_wheels.sh \
                   scripts/check_env.py pyproject.toml
               echo "$repo $VENV $PYTHON ${HVD_FLAVOUR:-} ${HVD_EXTRAS:-} ${HVD_GPU_OPERATIONS:-} ${TORCH_INDEX_URL:-} ${HVD_SKIP_CHECK:-}"
             } | sha256sum | cut -d' ' -f1)
done_stamp="$VENV/.setup-done"
if [ "${HVD_PREPARE_ONLY:-0}" != 1 ] && [ -x "$VENV/bin/python" ] && [ "$(cat "$done_stamp" 2>/dev/null)" = "$setup_key" ]; then
    echo "==> [setup] $VENV is set up from this checkout's pyproject.toml and scripts/ (to redo it: rm $done_stamp)"
    exit 0
fi
rm -f "$done_stamp"

# Make sure every command in $3.. exists, installing the Debian packages $2 with apt when
# one is missing: now as root, else stop with the exact command to run.
ensure_commands() {
    local what=$1 pkgs=$2 cmd missing=""
    shift 2
    for cmd in "$@"; do command -v "$cmd" >/dev/null 2>&1 || missing="$missing $cmd"; done
    [ -z "$missing" ] && return 0
    if as_root; then
        echo "    $what missing (${missing# }); installing $pkgs with apt-get"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $pkgs >/dev/null \
            || fail "apt-get could not install $pkgs"
    else
        fail "$what missing (${missing# }) and this user is not root. Run: sudo apt-get update && sudo apt-get install -y $pkgs"
    fi
}

step "check Python and Java"
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
    || fail "$PYTHON is $("$PYTHON" -V 2>&1); Python >= 3.11 is needed. Set PYTHON=/path/to/python3.11"
ensure_commands "Java 17 (Spark needs it) is" openjdk-17-jre-headless java

step "check OpenMPI"
ensure_commands "OpenMPI is" "$("$PYTHON" scripts/versions.py apt)" mpirun mpicxx

step "check build tools"
ensure_commands "horovod's build tools are" "$("$PYTHON" scripts/versions.py apt_build)" cmake g++ make

step "create $VENV"
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV" || fail "could not create $VENV (on Debian: apt-get install python3-venv)"
py="$repo/$VENV/bin/python"
pip_q() { "$py" -m pip install -q --disable-pip-version-check "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2); }

torch_pin=$("$PYTHON" scripts/versions.py torch)
horovod_pin=$("$PYTHON" scripts/versions.py horovod)
flavour=${HVD_FLAVOUR:-pytorch}
case "$flavour" in
    pytorch) with_tf=0 ;;
    tensorflow) with_tf=1 ;;
    *) fail "HVD_FLAVOUR=$flavour is not a flavour: use pytorch (the default) or tensorflow" ;;
esac
extras=${HVD_EXTRAS:-airflow,examples,bench,test}
# This environment trains (it has torch and horovod): the training extra (pyspark) always.
case ",$extras," in *,training,*) ;; *) extras="training,$extras" ;; esac
[ "$with_tf" = 1 ] && case ",$extras," in *,tensorflow,*) ;; *) extras="$extras,tensorflow" ;; esac

test_commands() {
    ensure_commands "PyPy 3.9 (a real worker Python older than 3.11, for the tests), PostgreSQL (Airflow's metadata database in the tests), iproute2 (make cluster's namespaces) or Chromium with chromedriver (the UI test) is" \
        "$("$PYTHON" scripts/versions.py apt_test)" pypy3 pg_ctlcluster ip nsenter unshare chromium chromedriver
}
# The test suite's system packages are mostly download and unpacking: as root they install in the
# background while torch is installed and horovod builds, and their step below waits for them.
test_packages_log=$(mktemp)
case ",$extras," in *,test,*)
    if as_root && [ "${HVD_PREPARE_ONLY:-0}" != 1 ]; then
        (step_name="check the test suite's system packages, in the background"; test_commands) > "$test_packages_log" 2>&1 &
        test_packages=$!
    fi
esac

step "install torch $torch_pin and horovod's build requirements"
# horovod builds without isolation against the torch in this venv, so torch and
# the build's own imports must be in place first.
if [ -n "${TORCH_INDEX_URL:-}" ]; then
    pip_q --index-url "$TORCH_INDEX_URL" "torch==$torch_pin" || fail "pip could not install torch==$torch_pin from $TORCH_INDEX_URL"
fi
pip_q "torch==$torch_pin" numpy cloudpickle psutil pyyaml packaging cffi wheel "setuptools>=68" \
    || fail "pip could not install torch==$torch_pin (the CPU wheel on this machine's disk, or PyPI)"

if [ "$with_tf" = 1 ]; then
    tf_pins=$("$PYTHON" scripts/versions.py extra tensorflow)
    step "install $tf_pins (the TensorFlow flavour)"
    # Before horovod's build: its TensorFlow plugin compiles against these headers.
    pip_q $tf_pins || fail "pip could not install $tf_pins"
elif "$py" -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("tensorflow") is None)' 2>/dev/null; then
    echo "    note: TensorFlow is installed in $VENV but HVD_FLAVOUR is pytorch: horovod is built without its TensorFlow plugin"
fi

step "build or reuse the horovod $horovod_pin wheel ($flavour flavour)"
wheel=$(PYTHON="$py" HVD_WITH_TENSORFLOW=$with_tf scripts/build_horovod.sh) || fail "the horovod build failed (log above). Check that torch==$torch_pin, OpenMPI headers (libopenmpi-dev), cmake and g++ are present"
installed=$("$py" -c 'import importlib.metadata as m; print(m.version("horovod"))' 2>/dev/null || true)
# Reinstall when the wheel differs from what is installed (e.g. torch changed).
stamp="$VENV/.horovod-wheel"
if [ "$installed" != "$horovod_pin" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$wheel" ]; then
    pip_q --force-reinstall --no-deps "$wheel" || fail "pip could not install $wheel"
    echo "$wheel" > "$stamp"
fi
if [ "${HVD_PREPARE_ONLY:-0}" = 1 ]; then
    # What follows writes into the checkout (the editable install's egg-info) and runs Spark.
    step_name=""
    echo "==> [setup] prepared: $VENV holds its packages and horovod; run the set-up again to finish it"
    exit 0
fi

step "install airflow-provider-hvd (editable) with extras $extras"
# The package declares ranges; this project's environments take the exact versions CI proves
# ([tool.airflow-provider-hvd.pins] in pyproject.toml), as pip constraints.
"$PYTHON" scripts/versions.py constraints > "$VENV/constraints.txt"
# uv resolves Airflow's few hundred requirements in seconds where pip took 3.5 minutes of CPU
# (measured on a fresh venv); what is installed is the same. torch and horovod, installed above
# (torch from this machine's local wheel when there is one), already satisfy their pins.
pip_q "uv>=0.5" || fail "pip could not install uv"
# pyspark is an sdist only: built once into a wheel cache, or uv may build it on every set-up
# (scripts/build_sdist_wheels.sh says why).
sdist_wheels=$(PYTHON="$py" scripts/build_sdist_wheels.sh) || fail "could not build the wheels of $("$PYTHON" scripts/versions.py sdist_only)"
# --compile-bytecode: uv, unlike pip, installs no .pyc, and where PYTHONDONTWRITEBYTECODE is set (as on
# the machine this was measured on, one like CI's) none is ever written, so every Airflow, Spark and rank process would compile
# the source it imports, each time: `airflow version` 4.0 s -> 1.7 s, measured.
"$VENV/bin/uv" pip install -q --compile-bytecode -p "$py" -c "$VENV/constraints.txt" --find-links "$sdist_wheels" \
    -e ".[$extras]" || fail "uv could not install the package's dependencies (see pyproject.toml)"
# The editable package's own source, for the same reason (a file edited later is compiled again on import).
"$py" -m compileall -q airflow_provider_hvd >/dev/null || fail "could not compile airflow_provider_hvd"

case ",$extras," in *,test,*)
    step "check the test suite's system packages"
    if [ -n "$test_packages" ]; then
        status=0
        wait "$test_packages" || status=$?
        test_packages=""
        cat "$test_packages_log"
        [ $status -eq 0 ] || exit $status  # its own words, above, say what failed
    else
        test_commands
    fi
    step "fetch the Compose Specification schema (tests/test_deploy.py validates docker/compose.yaml)"
    "$py" scripts/fetch_compose_schema.py >/dev/null \
        || echo "    could not fetch it (offline?): tests/test_deploy.py will say so; the rest of the set-up is fine"
esac

if [ "${HVD_SKIP_CHECK:-0}" != 1 ]; then
    step "check the environment is real (horovod build, Spark barrier stage)"
    HVD_FLAVOUR=$flavour "$py" scripts/check_env.py || fail "the environment check failed (output above)"
fi
step_name=""
rm -f "$test_packages_log"
echo "$setup_key" > "$done_stamp"
echo "==> [setup] done: $VENV is ready (activate with: source $VENV/bin/activate)"
