"""The hosts' namespaces: made, entered, and removed leaving nothing behind.

    hvd-switch      br-data: the data network's bridge (no address; the machine's own namespace
                    has no interface on it, so nothing here routes to or from the real network)
    hvd-<host>      lo, eth1 (DATA_NET.<n>/24, a veth to br-data); Spark hosts also eth0
                    (MGMT_NET.<n>/24), a veth whose other end is up in hvd-switch on no bridge:
                    an interface with an address and a route that reaches no other host

Each host's other namespaces (mount, UTS) are held by its holder process (localcluster/holder.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from localcluster.hosts import (
    BRIDGE,
    DATA_IFACE,
    HOST_DIR,
    HOSTS,
    MGMT_IFACE,
    SWITCH_NS,
    Host,
    etc_hosts,
)

REPO = Path(__file__).resolve().parent.parent


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done


def namespaces() -> list[str]:
    """The namespaces of this cluster that exist now."""
    out = ip("-json", "netns", "list", check=False).stdout.strip()
    names = [entry["name"] for entry in json.loads(out)] if out else []
    return [n for n in names if n == SWITCH_NS or n.startswith("hvd-")]


def create(state: Path) -> dict[str, int]:
    """Namespaces, links and holders for every host; returns each host's holder pid."""
    leftover = namespaces()
    if leftover:
        raise RuntimeError(f"namespaces {leftover} exist already: a cluster is up (or was not taken down). "
                           f"Run `make cluster-down` first.")
    (state / "etc-hosts").write_text(etc_hosts())
    Path(HOST_DIR).mkdir(parents=True, exist_ok=True)
    try:
        ip("netns", "add", SWITCH_NS)
        ip("-n", SWITCH_NS, "link", "add", BRIDGE, "type", "bridge")
        ip("-n", SWITCH_NS, "link", "set", BRIDGE, "up")
        holders = {}
        for host in HOSTS:
            _wire(host)
            (state / "hosts" / host.name).mkdir(parents=True, exist_ok=True)
            holders[host.name] = _start_holder(host, state)
        return holders
    except BaseException:
        destroy()
        raise


def _veth(host: Host, kind: str, inside: str) -> str:
    """A veth pair: ``inside`` in the host's namespace, its peer (returned) in the switch's."""
    # Named hvd-*: whatever a failed start leaves in the machine's namespace, destroy() finds.
    outside, temp = f"hvd-{kind}{host.octet}", f"hvd-t{kind}{host.octet}"
    ip("link", "add", outside, "type", "veth", "peer", "name", temp)
    ip("link", "set", outside, "netns", SWITCH_NS)
    ip("link", "set", temp, "netns", host.netns)
    ip("-n", host.netns, "link", "set", temp, "name", inside)
    ip("-n", SWITCH_NS, "link", "set", outside, "up")
    return outside


def _wire(host: Host) -> None:
    ip("netns", "add", host.netns)
    ip("-n", host.netns, "link", "set", "lo", "up")
    if host.management:
        # First, as on real nodes: a tool that takes "the first interface" takes the wrong one.
        _veth(host, "m", MGMT_IFACE)  # its peer belongs to no bridge: nothing answers there
        ip("-n", host.netns, "addr", "add", f"{host.management_address}/24", "dev", MGMT_IFACE)
        ip("-n", host.netns, "link", "set", MGMT_IFACE, "up")
    port = _veth(host, "d", DATA_IFACE)
    ip("-n", SWITCH_NS, "link", "set", port, "master", BRIDGE)
    ip("-n", host.netns, "addr", "add", f"{host.address}/24", "dev", DATA_IFACE)
    ip("-n", host.netns, "link", "set", DATA_IFACE, "up")


def _start_holder(host: Host, state: Path) -> int:
    log = state / "holders" / f"{host.name}.log"
    log.parent.mkdir(exist_ok=True)
    proc = subprocess.Popen(["ip", "netns", "exec", host.netns, "unshare", "--mount", "--uts", "--propagation",
                             "private", "--", sys.executable, "-m", "localcluster.holder", host.name, str(state)],
                            cwd=REPO, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 20
    while "ready" not in log.read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"host {host.name} did not come up: {log.read_text()[-2000:]}")
        time.sleep(0.05)
    return proc.pid


def enter(holder_pid: int) -> list[str]:
    """The command prefix that runs a command on the host whose holder is ``holder_pid``."""
    return ["nsenter", "--target", str(holder_pid), "--net", "--mount", "--uts", "--"]


def pids_in(netns: str) -> list[int]:
    out = ip("netns", "pids", netns, check=False).stdout.split()
    return [int(p) for p in out if p.isdigit()]


def destroy(grace: float = 20.0) -> list[str]:
    """Every process in the cluster's namespaces ended (SIGTERM, then SIGKILL), every namespace
    removed (their links and the bridge go with them). Returns what it had to SIGKILL."""
    names = namespaces()
    # As `docker compose down` stops a container: SIGTERM to its main processes only, which end their
    # own children. Signalled directly, children that inherited a parent's handler can wedge the
    # parent's shutdown: the LocalExecutor's workers, forked from the scheduler, took SIGTERM with the
    # scheduler's handler and lived on, and the scheduler waited on them until the SIGKILL.
    for netns in names:
        pids = pids_in(netns)
        for pid in pids:
            if _parent(pid) not in pids:
                _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while any(pids_in(n) for n in names) and time.monotonic() < deadline:
        time.sleep(0.2)
    killed = []
    for netns in names:
        for pid in pids_in(netns):
            killed.append(f"{netns}: {_cmdline(pid)}")
    _abort_python_survivors(names)
    for netns in names:
        for pid in pids_in(netns):
            _signal(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while any(pids_in(n) for n in names) and time.monotonic() < deadline:
        time.sleep(0.1)
    for netns in names:
        ip("netns", "del", netns, check=False)
    for link in json.loads(ip("-json", "link", "show", check=False).stdout or "[]"):
        if link.get("ifname", "").startswith("hvd-"):  # a veth a failed start left here
            ip("link", "del", link["ifname"], check=False)
    try:
        os.rmdir(HOST_DIR)
    except OSError:
        pass
    return killed


def _abort_python_survivors(names: list[str], wait_each: float = 3.0, budget: float = 15.0) -> None:
    """What a process that ignored SIGTERM was doing is the evidence a hung shutdown needs: every host
    runs Python with PYTHONFAULTHANDLER=1 (services.base_env), so SIGABRT makes a Python survivor
    write every thread's stack to its stderr (its service's log) before it dies. No core file: the
    survivor's core limit is set to 0 first.

    One at a time, each until it is gone, parents before their children. Aborted together, processes
    that share a log (a scheduler and its forked workers) interleaved their dumps in mid-line ("Current
    thread 0xCurrent thread 0x..."), and neither stack could be read back; and a child aborted before
    the parent that waits on it lets the parent's wait return, so the parent's stack would no longer
    say where it was stuck."""
    import resource

    pythons = []
    for netns in names:
        for pid in pids_in(netns):
            try:
                if "python" not in os.path.basename(os.readlink(f"/proc/{pid}/exe")):
                    continue
                resource.prlimit(pid, resource.RLIMIT_CORE, (0, 0))
            except OSError:
                continue
            pythons.append(pid)

    def depth(pid: int) -> int:  # how many of its ancestors are among them
        n, parent = 0, _parent(pid)
        while parent in pythons:
            n, parent = n + 1, _parent(parent)
        return n

    def gone(pid: int) -> bool:
        return _stat(pid)[:1] in ([], ["Z"])  # gone, or a zombie

    deadline = time.monotonic() + budget
    for pid in sorted(pythons, key=depth):
        if gone(pid):
            continue
        _signal(pid, signal.SIGABRT)
        until = min(time.monotonic() + wait_each, deadline)
        while not gone(pid) and time.monotonic() < until:
            time.sleep(0.05)


def _stat(pid: int) -> list[str]:
    """/proc/<pid>/stat's fields after the command name (state, parent, ...); [] once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def _parent(pid: int) -> int | None:
    fields = _stat(pid)
    return int(fields[1]) if len(fields) > 1 else None


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:200]
    except OSError:
        return str(pid)
