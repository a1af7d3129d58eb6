"""docker/ without a Docker engine: the compose file against the Compose Specification's schema,
the images' recipe against the scripts CI runs, the pins against pyproject.toml, and the GPU
discovery script against a FAKE nvidia-smi (this machine has no GPU)."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
DOCKER = REPO / "docker"
sys.path.insert(0, str(REPO / "scripts"))

import fetch_compose_schema  # noqa: E402
import versions  # noqa: E402

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}")


def dotenv() -> dict[str, str]:
    values = {}
    for line in (DOCKER / ".env").read_text().splitlines():
        if line and not line.startswith("#"):
            key, value = line.split("=", 1)
            values[key] = value
    return values


def interpolate(text: str, env: dict[str, str]) -> tuple[str, set[str]]:
    """Compose's ${VAR} / ${VAR:-default} substitution; returns the text and the names left undefined."""
    missing = set()

    def sub(match):
        name, default = match.group(1), match.group(2)
        if name in env:
            return env[name]
        if default is None:
            missing.add(name)
            return ""
        return default

    return _VAR.sub(sub, text), missing


def compose() -> dict:
    text, missing = interpolate((DOCKER / "compose.yaml").read_text(), dotenv())
    assert not missing, f"compose.yaml uses variables that docker/.env does not define: {sorted(missing)}"
    return yaml.safe_load(text)


def test_env_file_is_what_pyproject_says():
    assert (DOCKER / ".env").read_text() == versions.docker_env(), (
        "docker/.env is stale: run `python3 scripts/versions.py --docker-env > docker/.env`")
    env = dotenv()
    assert env["HVD_HOROVOD_VERSION"] == versions.build_pins()["horovod"]
    assert env["HVD_TORCH_VERSION"] == versions.build_pins()["torch"]


def test_compose_file_is_valid_against_the_compose_specification():
    import jsonschema

    path = fetch_compose_schema.schema_path()
    if not path.exists():
        pytest.fail(f"the Compose Specification schema is not in {path}: run `make setup` (it fetches the "
                    "pinned copy from the npm registry) or `python3 scripts/fetch_compose_schema.py`")
    schema = json.loads(path.read_text())
    validator = jsonschema.Draft201909Validator(schema)
    errors = sorted(validator.iter_errors(compose()), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{'/'.join(map(str, e.path))}: {e.message}" for e in errors)


def test_the_stack_has_every_service_the_deployment_needs():
    services = compose()["services"]
    for name in ("postgres", "minio", "spark-master", "spark-worker-1", "spark-worker-2", "airflow-init",
                 "airflow-apiserver", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer"):
        assert name in services, name
    for worker in ("spark-worker-1", "spark-worker-2"):
        spec = services[worker]
        assert spec["build"]["args"]["HVD_GPU_OPERATIONS"] == "NCCL"
        devices = spec["deploy"]["resources"]["reservations"]["devices"]
        assert devices[0]["capabilities"] == ["gpu"] and len(devices[0]["device_ids"]) == 1  # one GPU each
        opts = spec["environment"]["SPARK_WORKER_OPTS"]
        assert "spark.worker.resource.gpu.discoveryScript=/opt/hvd/docker/spark/gpu_discovery.sh" in opts
    env = services["airflow-scheduler"]["environment"]
    spark_conn = json.loads(env["AIRFLOW_CONN_SPARK_DEFAULT"])
    assert (spark_conn["host"], spark_conn["port"]) == ("spark://spark-master", 7077)
    assert json.loads(env["AIRFLOW_CONN_HOROVOD_DEFAULT"])["conn_type"] == "horovod"
    assert env["HVD_EXAMPLE_STORAGE"].startswith("s3://")  # the example DAGs read it, unchanged
    defaults = (DOCKER / "spark" / "conf" / "spark-defaults.conf").read_text()
    assert re.search(r"^spark\.task\.resource\.gpu\.amount\s+1$", defaults, re.M)
    assert re.search(r"^spark\.dynamicAllocation\.enabled\s+false$", defaults, re.M)


def test_images_are_built_by_the_same_scripts_ci_runs():
    dockerfile = (DOCKER / "Dockerfile").read_text()
    args = set(re.findall(r"^ARG (\w+)", dockerfile, re.M))
    for name, service in compose()["services"].items():
        if "build" in service:
            assert service["build"]["dockerfile"] == "docker/Dockerfile", name
            assert set(service["build"]["args"]) <= args, (name, set(service["build"]["args"]) - args)
    # The environment is made by scripts/setup.sh, which `make test` (CI) runs first.
    assert re.search(r"^RUN .*scripts/setup\.sh", dockerfile, re.M | re.S)
    assert "test: setup" in (REPO / "Makefile").read_text()
    setup = (REPO / "scripts" / "setup.sh").read_text()
    build = (REPO / "scripts" / "build_horovod.sh").read_text()
    for knob in ("HVD_GPU_OPERATIONS", "TORCH_INDEX_URL", "HVD_EXTRAS", "HVD_FLAVOUR", "HVD_WHEEL_CACHE", "PYTHON"):
        assert knob in dockerfile and (knob in setup or knob in build), knob
    assert "scripts/build_horovod.sh" in setup and "HOROVOD_GPU_OPERATIONS=$gpu_ops" in build
    # Every file the images copy exists.
    for source in re.findall(r"^COPY (\S+)", dockerfile, re.M):
        assert (REPO / source).exists(), source


def run_discovery(tmp_path, gpus_listed, **env):
    """Run docker/'s discovery script with a FAKE nvidia-smi that lists ``gpus_listed`` (None: absent)."""
    path = "/usr/bin:/bin"
    if gpus_listed is not None:
        fake = tmp_path / "bin"
        fake.mkdir(exist_ok=True)
        (fake / "nvidia-smi").write_text("#!/bin/sh\n" + (f"printf '{gpus_listed}'\n" if gpus_listed != "fail"
                                                           else "echo 'NVIDIA-SMI has failed' >&2; exit 9\n"))
        (fake / "nvidia-smi").chmod(0o755)
        path = f"{fake}:{path}"
    return subprocess.run([str(DOCKER / "spark" / "gpu_discovery.sh")], capture_output=True, text=True,
                          env={"PATH": path, **env})


def test_discovery_script_reports_every_gpu_in_sparks_format(tmp_path):
    done = run_discovery(tmp_path, "0\\n1\\n2\\n3\\n")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"name": "gpu", "addresses": ["0", "1", "2", "3"]}


def test_discovery_script_honours_cuda_visible_devices(tmp_path):
    done = run_discovery(tmp_path, "0\\n1\\n2\\n3\\n", CUDA_VISIBLE_DEVICES="3,1")
    assert json.loads(done.stdout)["addresses"] == ["1", "3"]


@pytest.mark.parametrize("listed, says", [(None, "nvidia-smi not found"), ("fail", "nvidia-smi failed"),
                                          ("", "no GPU visible")])
def test_discovery_script_fails_clearly_without_gpus(tmp_path, listed, says):
    done = run_discovery(tmp_path, listed)
    assert done.returncode != 0 and done.stdout == ""
    assert says in done.stderr


def test_example_dags_take_their_storage_from_the_environment():
    """The stack sets HVD_EXAMPLE_STORAGE; the DAGs must read it rather than hard-code a path."""
    for dag in ("airflow_provider_hvd/examples/digits_dag.py", "dags/hvd_scheduled_retraining.py"):
        assert "HVD_EXAMPLE_STORAGE" in (REPO / dag).read_text(), dag
