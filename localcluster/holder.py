"""The process that keeps one host's namespaces alive and sets up its private file system view.

Started by localcluster.namespaces inside the host's network namespace, under
``unshare --mount --uts --propagation private``; every service of the host later joins its
namespaces (``nsenter --target <this pid>``). Here, before it sleeps:

- the host name (UTS namespace), which every host's /etc/hosts resolves to its data address;
- /etc/hosts: the cluster's, as Docker's DNS would answer in compose;
- /var/lib/hvd-host: this host's own folder of the cluster's state (work directory, logs, data);
- /tmp: an empty tmpfs of its own. Where the repository (the hosts' "image": code and virtual
  environment) or the cluster's state lives under /tmp (a CI clone, pytest's folders), its top
  folder there is bound back in;
- the other hosts' folders of the cluster's state: hidden under an empty tmpfs, so no host reads
  another's disk.

    python -m localcluster.holder <host> <state dir>
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import sys
from pathlib import Path

from localcluster.hosts import HOST_DIR

MS_BIND, MS_REC = 4096, 16384
_libc = ctypes.CDLL(None, use_errno=True)


def _mount(source: str, target: str, fstype: str | None = None, flags: int = 0, data: str | None = None) -> None:
    if _libc.mount(source.encode(), target.encode(), fstype.encode() if fstype else None, flags,
                   data.encode() if data else None) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"mount {source} on {target}: {os.strerror(errno)}")


def _bind(source: str, target: str) -> None:
    _mount(source, target, None, MS_BIND | MS_REC)


def _tmpfs(target: str, size: str) -> None:
    _mount("hvd-tmp", target, "tmpfs", 0, f"size={size},mode=1777")


def main(host: str, state: Path) -> None:
    socket.sethostname(host)
    _bind(str(state / "etc-hosts"), "/etc/hosts")
    _bind(str(state / "hosts" / host), HOST_DIR)
    # What every host must see at its path, the "image" and the cluster's state: the repository (code,
    # virtual environment) and the state folder. Those under /tmp (a CI clone, pytest's folders) keep
    # their top folder there.
    keep = {}
    for path in (Path(__file__).resolve().parent.parent, Path(sys.executable).resolve(), state.resolve()):
        parts = path.parts
        if len(parts) > 2 and parts[1] == "tmp" and parts[2] not in keep:
            keep[parts[2]] = os.open(f"/tmp/{parts[2]}", os.O_PATH)
    _tmpfs("/tmp", "4g")
    for top, fd in keep.items():
        os.mkdir(f"/tmp/{top}")
        _bind(f"/proc/self/fd/{fd}", f"/tmp/{top}")  # the kernel follows the descriptor to the hidden folder
        os.close(fd)
    _tmpfs(str(state / "hosts"), "1m")
    print(f"host {host} ready", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        signal.pause()


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
