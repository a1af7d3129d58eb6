"""What the processes say travels as declared types: a frame's nested records come back as
their types, a record without its fields is refused, and the records a process writes by hand
keep the declared field names."""

import ast
import dataclasses
import json
from pathlib import Path

import pytest

from airflow_provider_hvd.runner.wire.hellos import TaskHello, parse_hello
from airflow_provider_hvd.runner.wire.launch import (
    DAEMON_DIED_MARKER, WORKER_REPORT_MARKER, WorkerReport, find_marked, marker_line)
from airflow_provider_hvd.runner.wire.messages import Exited, Roster, parse
from airflow_provider_hvd.runner.wire.records import DaemonDeath, TaskInfo

ENTRY = Path(__file__).parent.parent / "airflow_provider_hvd" / "runner" / "barrier" / "entry.py"


def over_the_wire(frame: dict) -> dict:
    return json.loads(json.dumps(frame))


def test_a_roster_and_a_task_hello_carry_task_infos_both_ways():
    infos = [TaskInfo(host="10.0.0.1", hostname="a", rsh_port=4001, gpus="0,1"), TaskInfo(host="10.0.0.2")]
    roster = parse(over_the_wire(Roster(tasks=infos).to_wire()))
    assert roster == Roster(tasks=infos) and all(isinstance(t, TaskInfo) for t in roster.tasks)
    hello = parse_hello(over_the_wire(TaskHello(partition=1, info=infos[0]).to_wire()))
    assert hello.info == infos[0]


def test_a_task_info_without_its_host_is_refused_naming_what_is_missing():
    with pytest.raises(ValueError, match="TaskInfo without its fields.*'host'"):
        parse({"op": "roster", "tasks": [{"hostname": "a"}]})
    with pytest.raises(ValueError, match="task info without a host"):
        parse({"op": "roster", "tasks": [{"host": ""}]})
    with pytest.raises(ValueError, match="TaskInfo must be an object"):
        parse_hello({"role": "task", "partition": 0, "info": "10.0.0.1"})


def test_an_exited_report_names_the_daemon_as_a_declared_record():
    death = DaemonDeath(process="mpirun", host="127.0.0.3", signal="SIGSEGV", code=-11)
    exited = parse(over_the_wire(Exited(rank=0, returncode=-11, daemon=death).to_wire()))
    assert exited.daemon == death


def test_marker_lines_carry_their_record_and_anything_else_is_none():
    death = DaemonDeath(host="127.0.0.2", signal="SIGSEGV", code=139)
    text = f"orted: backtrace\n{marker_line(DAEMON_DIED_MARKER, death)}\nORTE was unable to start"
    assert find_marked(DAEMON_DIED_MARKER, DaemonDeath, text) == death
    assert find_marked(DAEMON_DIED_MARKER, DaemonDeath, "no marker here") is None
    assert find_marked(DAEMON_DIED_MARKER, DaemonDeath, DAEMON_DIED_MARKER + "{not json}") is None


def test_the_worker_report_the_barrier_entry_writes_by_hand_has_the_declared_fields():
    """entry.py may use the standard library only (the worker may lack this package), so it
    writes the report as a dict: its keys must be WorkerReport's fields, or the driver would
    read defaults and name neither the host nor the module."""
    written = [node for node in ast.walk(ast.parse(ENTRY.read_text())) if isinstance(node, ast.Dict)
               and any(isinstance(k, ast.Constant) and k.value == "problem" for k in node.keys)]
    assert len(written) == 1, "entry.py writes one worker report"
    keys = {k.value for k in written[0].keys}
    assert keys == {f.name for f in dataclasses.fields(WorkerReport)}
    report = WorkerReport(problem="import", host="10.0.0.2", python="/usr/bin/python3", version="3.11.7",
                          module="torch", detail="No module named 'torch'")
    found = find_marked(WORKER_REPORT_MARKER, WorkerReport, "Traceback ...\nRuntimeError: "
                        + marker_line(WORKER_REPORT_MARKER, report))
    assert found == report
