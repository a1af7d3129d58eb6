"""Every run option is defined once (runner/defaults.OPTIONS); each place that offers one comes from
that definition, and a place that drifts from it fails here, naming the option."""

import inspect
import json
from pathlib import Path

import pytest

from airflow_provider_hvd.runner import defaults

REPO = Path(__file__).resolve().parent.parent
TABLE_START = "<!-- options table: generated from runner/defaults.py"
TABLE_END = "<!-- end of options table -->"


def test_horovodrunner_takes_every_option_with_its_default_and_documents_it():
    from airflow_provider_hvd import HorovodRunner

    parameters = inspect.signature(HorovodRunner).parameters
    for name, option in defaults.OPTIONS.items():
        assert name in parameters, f"HorovodRunner has no argument {name}"
        assert parameters[name].kind is inspect.Parameter.KEYWORD_ONLY
        assert parameters[name].default == option.default, (name, parameters[name].default, option.default)
    assert defaults.param_doc() in HorovodRunner.__doc__


def test_the_operator_takes_every_option_templated_unset_by_default_and_documents_it():
    from airflow_provider_hvd.operators.horovod_runner import HorovodRunnerOperator

    parameters = inspect.signature(HorovodRunnerOperator.__init__).parameters
    for name in defaults.OPTIONS:
        assert name in parameters and parameters[name].default is None, f"operator argument {name}"
        assert name in HorovodRunnerOperator.template_fields, f"{name} is not templated"
    assert defaults.param_doc() in HorovodRunnerOperator.__doc__
    op = HorovodRunnerOperator(task_id="t", python_callable=print, np=2,
                               **{name: option.default for name, option in defaults.OPTIONS.items()
                                  if option.default is not None})
    assert all(getattr(op, name) == option.default for name, option in defaults.OPTIONS.items()
               if option.default is not None)


def test_the_connection_form_has_a_field_per_option_from_its_definition():
    from airflow_provider_hvd.get_provider_info import CONN_FIELDS

    for name, option in defaults.OPTIONS.items():
        field = CONN_FIELDS[name]
        assert field["label"] == option.label and field["schema"] == option.schema
        assert field["description"].startswith(option.help.replace("`", "")), name


def test_the_spark_application_takes_exactly_the_options_and_parses_them_as_the_runner_checks_them():
    from airflow_provider_hvd.runner import spark_app

    texts = {"driver_log_verbosity": "log_callback_only", "launcher": "gloo", "mpi_args": "-x A",
             "start_timeout": "60", "stall_timeout": "none", "timeout": "3600", "slot_wait_timeout": "0",
             "timeline_interval": "2.5", "timeline_live_bytes": "65536", "max_restarts": "1"}
    assert set(texts) == set(defaults.OPTIONS)
    parsed = spark_app.parse_args(["--payload", "p", "--result", "r", "--np", "2", "--options", json.dumps(texts)])
    assert parsed.options == {"driver_log_verbosity": "log_callback_only", "launcher": "gloo", "mpi_args": ("-x", "A"),
                              "start_timeout": 60.0, "stall_timeout": None, "timeout": 3600.0,
                              "slot_wait_timeout": 0.0, "timeline_interval": 2.5, "timeline_live_bytes": 65536,
                              "max_restarts": 1}
    for name, value in parsed.options.items():  # what the application hands HorovodRunner, as it checks it
        assert defaults.OPTIONS[name].check(value) == value
    with pytest.raises(SystemExit):
        spark_app.parse_args(["--payload", "p", "--result", "r", "--np", "2", "--options", '{"lanucher": "gloo"}'])


def test_the_readmes_options_table_is_the_definitions():
    readme = (REPO / "README.md").read_text()
    table = readme[readme.index(TABLE_START):readme.index(TABLE_END)].split("\n", 1)[1].strip()
    assert table == defaults.readme_table(), (
        "README.md's options table drifted from runner/defaults.OPTIONS; print the right one with "
        ".venv/bin/python -c 'from airflow_provider_hvd.runner.defaults import readme_table; print(readme_table())'")
