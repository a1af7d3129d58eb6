"""The runner's layout holds: imports go down only, no cycle, one declared protocol.

Read with the standard library's ``ast`` over the package, lazy imports inside functions
included (the cycle this replaced was a lazy one). See runner/__init__.py for the map.
"""

import ast
import importlib.util
import logging
import time
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "airflow_provider_hvd"
RUNNER = "airflow_provider_hvd.runner"

# What each part of runner/ may import from runner/ (itself always). The entry points
# (run, spark_app, checkpoint, timeline_window) may import anything below them.
ALLOWED = {
    "errors": set(),
    "defaults": set(),
    "common": set(),
    "wire": {"errors"},
    "rank": {"wire", "common", "errors", "defaults"},
    "barrier": {"wire", "common", "errors", "defaults"},
    "driver": {"barrier", "wire", "common", "errors", "defaults"},
}
ENTRY_POINTS = {"run", "spark_app", "checkpoint", "timeline_window", "results"}
AIRFLOW_LAYER = ("airflow", "airflow_provider_hvd.hooks", "airflow_provider_hvd.operators",
                 "airflow_provider_hvd.placements", "airflow_provider_hvd.links", "airflow_provider_hvd.sensors",
                 "airflow_provider_hvd.version_compat", "airflow_provider_hvd.triggers", "airflow_provider_hvd.examples")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def runner_modules() -> dict[str, ast.Module]:
    return {module_name(p): ast.parse(p.read_text(), str(p)) for p in sorted((PACKAGE / "runner").rglob("*.py"))}


def imports_of(tree: ast.Module) -> set[str]:
    """Every module named by an import anywhere in the file (``from a import b``: a, and a.b when b
    is a submodule of ours)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            for alias in node.names:
                candidate = f"{node.module}.{alias.name}"
                if candidate.startswith(RUNNER) and _is_our_module(candidate):
                    found.add(candidate)
    return found


def _is_our_module(name: str) -> bool:
    path = PACKAGE.parent / Path(*name.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def part_of(module: str) -> str:
    """``airflow_provider_hvd.runner.barrier.mpi_run`` -> ``barrier``; the package itself -> ``__init__``."""
    rest = module.removeprefix(RUNNER).lstrip(".")
    return rest.split(".")[0] if rest else "__init__"


def test_imports_go_down_only():
    wrong = []
    for module, tree in runner_modules().items():
        part = part_of(module)
        if part in ENTRY_POINTS or part == "__init__":
            continue
        assert part in ALLOWED, f"{module} is in no layer of the runner: add it to runner/__init__.py's map and here"
        for target in imports_of(tree):
            if target.startswith(RUNNER + ".") and part_of(target) != part and part_of(target) not in ALLOWED[part]:
                wrong.append(f"{module} imports {target}")
    assert not wrong, "imports from a layer above (or beside) the importer:\n" + "\n".join(wrong)


def test_no_import_cycle():
    modules = runner_modules()
    graph = {m: {t for t in imports_of(tree) if t in modules and t != m} for m, tree in modules.items()}
    # A package's own __init__ is imported by its submodules' imports anyway; edges to it are not cycles.
    graph = {m: {t for t in targets if not m.startswith(t + ".")} for m, targets in graph.items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            pytest.fail("import cycle: " + " -> ".join(cycle))


def test_the_runner_imports_nothing_of_airflow():
    wrong = [f"{m} imports {t}" for m, tree in runner_modules().items() for t in imports_of(tree)
             if t == "airflow" or t.startswith(tuple(a + "." for a in AIRFLOW_LAYER)) or t in AIRFLOW_LAYER]
    assert not wrong, "\n".join(wrong)


# ---- the declared protocol -------------------------------------------------------------

def declared():
    from airflow_provider_hvd.runner.wire import messages

    from airflow_provider_hvd.runner.wire import launch

    return messages, {**{name: getattr(messages, name) for name in ("Op", "Role", "Stream", "EventKind")},
                      "LaunchEnv": launch.LaunchEnv}


def test_every_protocol_name_used_is_declared():
    """``Op.LGO`` would only fail when that line runs, maybe mid-run; here it fails at once."""
    _, enums = declared()
    wrong = []
    for module, tree in runner_modules().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in enums:
                if node.attr not in enums[node.value.id].__members__:
                    wrong.append(f"{module}:{node.lineno}: {node.value.id}.{node.attr}")
    assert not wrong, "names no message declares:\n" + "\n".join(wrong)


def test_no_op_role_stream_or_event_is_a_bare_string():
    """Every sender and receiver goes through wire/messages.py: no ``{"op": "log"}``, no
    ``message.get("op") == "stop"``, no ``event.kind == "exited"``."""
    _, enums = declared()
    protocol_keys = {"op", "role", "stream"}
    values = {m.value for name in ("Op", "Role", "Stream", "EventKind") for m in enums[name]}
    wrong = []

    def names_protocol_field(node: ast.AST) -> bool:
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
            return bool(node.args) and isinstance(node.args[0], ast.Constant) and node.args[0].value in protocol_keys
        if isinstance(node, ast.Subscript):
            return isinstance(node.slice, ast.Constant) and node.slice.value in protocol_keys
        return isinstance(node, ast.Attribute) and node.attr in ("kind", "role", "op")

    for module, tree in runner_modules().items():
        if module.endswith("wire.messages"):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Dict):
                for key, value in zip(node.keys, node.values):
                    if isinstance(key, ast.Constant) and key.value in protocol_keys and \
                            isinstance(value, ast.Constant) and isinstance(value.value, str):
                        wrong.append(f"{module}:{node.lineno}: {{{key.value!r}: {value.value!r}}}")
            elif isinstance(node, ast.Compare):
                operands = [node.left, *node.comparators]
                if any(names_protocol_field(o) for o in operands):
                    for o in operands:
                        if isinstance(o, ast.Constant) and o.value in values:
                            wrong.append(f"{module}:{node.lineno}: compared with {o.value!r}")
    assert not wrong, "bare protocol strings (use wire/messages.py):\n" + "\n".join(wrong)


def test_the_modules_processes_start_each_other_by_exist():
    from airflow_provider_hvd.runner.wire import launch

    for name in (launch.RANK_MAIN_MODULE, launch.RSH_AGENT_MODULE):
        assert importlib.util.find_spec(name) is not None, f"python -m {name} would start nothing"


def test_an_undeclared_op_is_refused_loudly_not_ignored(caplog):
    """A peer that sends an op the driver does not know is dropped at once, with a warning
    naming it (before, an unknown op was skipped and the run waited for what never came)."""
    from airflow_provider_hvd.runner.driver.service import DriverService
    from airflow_provider_hvd.runner.wire import channel, payload
    from airflow_provider_hvd.runner.wire.channel import ChannelClosed
    from airflow_provider_hvd.runner.wire.messages import EventKind, Role

    secret = payload.new_secret()
    service = DriverService(secret, b"payload", lambda rank, stream, line: None, host="127.0.0.1")
    try:
        with caplog.at_level(logging.WARNING):
            peer = channel.connect(("127.0.0.1", service.port), secret, {"role": Role.RANK, "rank": 0, "pid": 1})
            peer.send_json({"op": "lgo", "line": "typo"})
            peer.sock.settimeout(5)
            t0 = time.monotonic()
            with pytest.raises((ChannelClosed, ConnectionError)):
                peer.recv()
            assert time.monotonic() - t0 < 2
        assert "'lgo' is not a valid Op" in caplog.text
        kinds = [service.events.get(timeout=1).kind for _ in range(2)]
        assert kinds == [EventKind.RANK_STARTED, EventKind.RANK_CLOSED]
        peer.close()
    finally:
        service.close()


# ---- the Airflow side: one folder per role, imports go one way ----------------------------

PROVIDER = "airflow_provider_hvd"
# What each folder of the Airflow side may import of the package besides itself and the runner
# (hooks talk to outside systems; triggers run in the triggerer on hooks; placements plan, submit
# and follow through hooks and hand deferral to a trigger; operators and sensors tell the story).
AIRFLOW_ALLOWED = {
    "links": set(),
    "hooks": {"version_compat", "get_provider_info"},
    "triggers": {"hooks", "version_compat"},
    "placements": {"hooks", "triggers", "version_compat"},
    "sensors": {"triggers", "version_compat"},
    "operators": {"placements", "hooks", "links", "triggers", "version_compat"},
}
MAX_MODULE_LINES = 300
MAX_FUNCTION_LINES = 50


def provider_modules(folders) -> dict[str, tuple[Path, ast.Module]]:
    return {module_name(p): (p, ast.parse(p.read_text(), str(p)))
            for folder in folders for p in sorted((PACKAGE / folder).rglob("*.py"))}


def test_the_airflow_side_has_one_folder_per_role_and_imports_go_one_way():
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert folders - {"runner", "examples"} == set(AIRFLOW_ALLOWED), (
        "a folder of the Airflow side with no role in AIRFLOW_ALLOWED (say what it may import) or a role gone")
    wrong = []
    for module, (_, tree) in provider_modules(AIRFLOW_ALLOWED).items():
        folder = module.split(".")[1]
        for target in imports_of(tree):
            if not target.startswith(PROVIDER + ".") or target.startswith(RUNNER):
                continue
            part = target.split(".")[1]
            if part != folder and part not in AIRFLOW_ALLOWED[folder]:
                wrong.append(f"{module} imports {target}")
    assert not wrong, "imports against the Airflow side's direction:\n" + "\n".join(wrong)


def test_modules_and_functions_stay_small():
    """A module a reader takes in at once, functions that each do one thing (examples/ aside)."""
    wrong = []
    folders = [p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists() and p.name != "examples"]
    for module, (path, tree) in provider_modules(folders).items():
        lines = len(path.read_text().splitlines())
        if lines > MAX_MODULE_LINES:
            wrong.append(f"{module}: {lines} lines")
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    wrong.append(f"{module}.{node.name}: {length} lines")
    assert not wrong, f"over {MAX_MODULE_LINES} lines a module or {MAX_FUNCTION_LINES} a function:\n" + "\n".join(wrong)


def test_no_two_modules_share_a_file_name_for_different_jobs():
    """A file's name says its job wherever it is found: in the package and in localcluster/. The one
    exception is Airflow's own convention, one integration's module under each role's folder
    (hooks/horovod.py and links/horovod.py; sensors/ and triggers/horovod_artifact.py)."""
    roots = (PACKAGE, PACKAGE.parent / "localcluster")
    seen: dict[str, list[Path]] = {}
    for path in sorted(p for root in roots for p in root.rglob("*.py")):
        if path.name not in ("__init__.py", "__main__.py"):
            seen.setdefault(path.name, []).append(path)

    def airflow_role(path: Path) -> bool:
        return path.parent.parent == PACKAGE and path.parent.name in AIRFLOW_ALLOWED

    shared = {name: [str(p.relative_to(PACKAGE.parent)) for p in paths] for name, paths in seen.items()
              if len(paths) > 1 and not all(airflow_role(p) for p in paths)}
    assert not shared, f"file names used for two jobs: {shared}"
