"""What a launch listens on, read from /proc: the tests' evidence that every launch stays on loopback.

- :func:`listening_sockets` returns the TCP sockets in state LISTEN (``0A`` in
  ``/proc/net/tcp`` and ``/proc/net/tcp6``) owned by a process and all its
  descendants, with their addresses;
- run as a module under a launcher (``torchrun -m listening_sockets``,
  ``accelerate launch ... -m listening_sockets``, from this folder), each
  process joins the launch's gloo group; once all have met, rank 0 prints
  one line ``LISTENING <json>`` with what the launcher's process tree listens
  on, then all meet again and leave;
- ``python -m listening_sockets notebook_launcher`` does the same through
  ``accelerate.notebook_launcher`` in this process, as lesson 6's cell does.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import sys
from pathlib import Path

import psutil

TCP_LISTEN = "0A"


def _address(hex_address: str) -> str:
    """Return the text form of an address as /proc/net/tcp{,6} writes it (hex, 32-bit words in host order)."""
    raw = bytes.fromhex(hex_address)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return socket.inet_ntop(socket.AF_INET if len(raw) == 4 else socket.AF_INET6, words)


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    try:
        descriptors = os.listdir(f"/proc/{pid}/fd")
    except OSError:  # gone, or not ours
        return inodes
    for descriptor in descriptors:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{descriptor}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    return inodes


def process_tree(pid: int) -> list[int]:
    """Return ``pid`` and the ids of all its descendants."""
    root = psutil.Process(pid)
    return [pid] + [child.pid for child in root.children(recursive=True)]


def listening_sockets(pid: int) -> list[dict]:
    """Return {"address", "port", "pid"} for every listening TCP socket of ``pid`` and its descendants.

    ``pid``: the first process of the tree (ancestors first) holding the socket.
    """
    owner = {}
    for member in process_tree(pid):  # the launcher first: forked workers inherit its store's socket too
        for inode in _socket_inodes(member):
            owner.setdefault(inode, member)
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == TCP_LISTEN and inode in owner:
                address, port = local.split(":")
                found.append({"address": _address(address), "port": int(port, 16), "pid": owner[inode]})
    return found


def is_loopback(address: str) -> bool:
    """Return whether ``address`` is a loopback address (``127.0.0.0/8``, ``::1``, or IPv4-mapped loopback)."""
    parsed = ipaddress.ip_address(address)
    mapped = getattr(parsed, "ipv4_mapped", None)
    return (mapped or parsed).is_loopback


def meet_and_report(launcher_pid: int) -> tuple[list[dict] | None, str | None]:
    """In a launched process: join the gloo group; return (what ``launcher_pid``'s tree listens on, on rank 0
    only, else None; this process's ``GLOO_SOCKET_IFNAME``)."""
    import torch.distributed as dist

    dist.init_process_group("gloo")
    try:
        dist.barrier()  # every process has met: the store and gloo's sockets are all open now
        found = listening_sockets(launcher_pid) if dist.get_rank() == 0 else None
        dist.barrier()  # the others stay until rank 0 has looked
        return found, os.environ.get("GLOO_SOCKET_IFNAME")
    finally:
        dist.destroy_process_group()


def _report_line(launcher_pid: int) -> None:
    found, interface = meet_and_report(launcher_pid)
    if found is not None:
        print("LISTENING " + json.dumps({"sockets": found, "gloo_interface": interface}), flush=True)


def _through_notebook_launcher() -> None:
    from accelerate import notebook_launcher

    from course_utils import launcher

    notebook_launcher(_report_line, (os.getpid(),), num_processes=2, use_port=str(launcher.find_free_port()))


def reported(output: str) -> dict:
    """Return what the ``LISTENING`` line of a launch's ``output`` says."""
    lines = [line for line in output.splitlines() if line.startswith("LISTENING ")]
    assert len(lines) == 1, output[-3000:]
    return json.loads(lines[0][len("LISTENING "):])


if __name__ == "__main__":
    if sys.argv[1:] == ["notebook_launcher"]:
        _through_notebook_launcher()
    else:
        _report_line(os.getppid())
