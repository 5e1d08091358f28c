"""Every launch listens on loopback only: its rendezvous store and gloo's sockets (lessons 6 and 7).

A launch of several processes on one machine listens on two kinds of socket,
and torch 2.13 opens both to the network unless told otherwise:

- the rendezvous store (a ``torch.distributed.TCPStore`` server, where the
  processes find each other) listens on every interface (``[::]:port``)
  whatever host it is given, with no authentication; given an already-bound
  listening socket (``master_listen_fd``) it serves on that socket alone;
- gloo's sockets bind to the address the hostname resolves to (on many
  cloud machines, the LAN address) unless ``GLOO_SOCKET_IFNAME`` names an
  interface.

So:

- :func:`listening_socket` binds and listens on ``127.0.0.1``: the free-port
  check and the bind are one step, and the socket is handed to the store
  (:func:`loopback_store`), so no other program can take the port between them;
- :func:`gloo_on_loopback` is the environment that puts gloo on the loopback
  interface (:func:`loopback_interface`: ``lo`` on Linux, ``lo0`` on macOS);
- :func:`keep_launches_on_loopback` makes every store server this process
  hosts (those of torch's launcher agent: ``torchrun``, ``accelerate launch``,
  ``accelerate.notebook_launcher``) serve on a loopback socket, and puts the
  gloo of the processes it starts on loopback; ``course_utils.launcher`` calls
  it when imported, so a notebook that imports it launches on loopback;
- ``python -m course_utils.loopback MODULE ARGS...`` runs a launcher's module
  (``torch.distributed.run``, ``accelerate.commands.accelerate_cli``) with both;
  ``course_utils.command_line.run_command`` starts ``torchrun`` and
  ``accelerate`` that way.
"""

from __future__ import annotations

import os
import runpy
import socket
import sys
from datetime import timedelta

import torch.distributed

from course_utils.validation import check_instance, check_int_in_range, check_positive_int

__all__ = [
    "LOCALHOST", "LoopbackTCPStore", "gloo_on_loopback", "keep_launches_on_loopback", "listening_socket",
    "loopback_interface", "loopback_store",
]

LOCALHOST = "127.0.0.1"


def listening_socket(port: int = 0) -> socket.socket:
    """Return a TCP socket listening on ``127.0.0.1:port`` (``port=0``: one the operating system picks).

    Raises ``OSError`` (``EADDRINUSE``) when the port is busy on loopback. Set
    up as torch's store sets up its own (``SO_REUSEADDR``: a port left in
    TIME_WAIT by a finished run is usable).
    """
    check_int_in_range(port, "port", 0, 65535)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((LOCALHOST, port))
        listener.listen()
    except BaseException:
        listener.close()
        raise
    return listener


def loopback_store(listener: socket.socket, world_size: int, timeout: timedelta = timedelta(minutes=30),
                   **options) -> torch.distributed.TCPStore:
    """Return a ``TCPStore`` server for ``world_size`` processes serving on ``listener`` alone.

    The store takes ``listener``'s descriptor over (it closes it when it is
    destroyed), so ``listener`` is detached here. ``options``: the other
    ``TCPStore`` arguments (``wait_for_workers``, ``multi_tenant``...).
    """
    check_instance(listener, "listener", socket.socket, "a listening socket (listening_socket())")
    check_positive_int(world_size, "world_size")
    store = _TORCH_TCP_STORE(
        LOCALHOST, listener.getsockname()[1], world_size, True, timeout, master_listen_fd=listener.fileno(),
        **options,
    )
    listener.detach()
    return store


_TORCH_TCP_STORE = torch.distributed.TCPStore  # torch's own class, whatever keep_launches_on_loopback later did


class LoopbackTCPStore(_TORCH_TCP_STORE):
    """A ``TCPStore`` whose server, when this process hosts it, listens on ``127.0.0.1:port`` only.

    What torch's rendezvous creates in place of its ``TCPStore`` once
    :func:`keep_launches_on_loopback` has run; the same arguments. A client
    (``is_master=False``) is a plain client. Port 0: the operating system picks one.
    """

    def __init__(self, host_name, port, world_size=None, is_master=False, *args, **kwargs):
        if is_master and kwargs.get("master_listen_fd") is None:
            listener = listening_socket(port)
            kwargs["master_listen_fd"] = listener.fileno()
            super().__init__(LOCALHOST, port, world_size, is_master, *args, **kwargs)
            listener.detach()  # the store owns the descriptor now
        else:
            super().__init__(host_name, port, world_size, is_master, *args, **kwargs)


def keep_launches_on_loopback() -> None:
    """Make every ``TCPStore`` server this process hosts from now on listen on loopback only, and gloo bind there.

    The stores of torch's launcher agent (torchrun, ``accelerate launch``,
    ``notebook_launcher``) are created here: the "static" rendezvous's (a
    master port given) and, on one machine without one, the "c10d"
    rendezvous's two (its own store and the one it shares with the workers).
    Each is a :class:`LoopbackTCPStore` from now on, as is any other server
    made through ``torch.distributed.TCPStore`` in this process or in a process
    forked from it. Clients are unchanged. ``GLOO_SOCKET_IFNAME`` is set in
    this process's environment, which the processes it starts inherit.
    Calling it again changes nothing.
    """
    from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend, static_tcp_rendezvous

    # dynamic_rendezvous creates the shared store as `dist.TCPStore(...)`; the two
    # backends imported the class by name.
    for module in (torch.distributed, static_tcp_rendezvous, c10d_rendezvous_backend):
        module.TCPStore = LoopbackTCPStore
    os.environ.update(gloo_on_loopback())


def loopback_interface() -> str:
    """Return the name of this machine's loopback network interface (``lo`` on Linux, ``lo0`` on macOS)."""
    names = [name for _, name in socket.if_nameindex()]
    for name in names:
        if name in ("lo", "lo0"):
            return name
    found = [name for name in names if name.startswith("lo")]
    if not found:
        raise RuntimeError(f"no loopback network interface among {names}: gloo cannot be kept on loopback")
    return found[0]


def gloo_on_loopback() -> dict[str, str]:
    """Return the environment that binds gloo's sockets to the loopback interface (``GLOO_SOCKET_IFNAME``)."""
    return {"GLOO_SOCKET_IFNAME": loopback_interface()}


def main(argv: list[str]) -> None:
    """Run the launcher module ``argv[0]`` with arguments ``argv[1:]``, its store and gloo on loopback."""
    if not argv:
        raise SystemExit("usage: python -m course_utils.loopback MODULE [ARGS...] (e.g. torch.distributed.run)")
    keep_launches_on_loopback()
    # torchrun on one machine without a master port meets through the "c10d" rendezvous, which
    # tells the workers to reach the shared store at this node's address (the hostname's by default).
    os.environ.setdefault("PET_LOCAL_ADDR", LOCALHOST)
    sys.argv = argv
    runpy.run_module(argv[0], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
