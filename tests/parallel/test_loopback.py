"""Every launch listens on loopback only (course_utils.loopback): read from /proc/net/tcp{,6} while each runs.

For each way the course launches processes (course_utils.launcher.launch, which
the lessons' cells and the exercise checks of lessons 6 and 7 use; sharding's
gloo group; accelerate's notebook_launcher, as lesson 6's cell calls it; and
the command lines run_command runs: torchrun on one machine with and without a
master port, accelerate launch), rank 0 reads, once every process has met,
the listening sockets of the whole launch (the launching process and all its
descendants: the store and each worker's gloo sockets), and each must be on a
loopback address. The first test shows the reading would catch a store on
every interface: torch's own.
"""

import os
import socket
from pathlib import Path

import pytest
import torch

from course_utils import command_line, launcher, loopback, sharding
from listening_sockets import is_loopback, listening_sockets, meet_and_report, reported

TESTS_DIR = Path(__file__).resolve().parents[1]
NO_HUB_WARNINGS = "--num_machines 1 --mixed_precision no --dynamo_backend no"


def assert_all_on_loopback(sockets, at_least):
    assert len(sockets) >= at_least, sockets  # the store and every worker's gloo socket were seen
    outside = [s for s in sockets if not is_loopback(s["address"])]
    assert not outside, f"listening outside loopback: {outside}"


def test_torchs_own_store_listens_on_every_interface_and_the_loopback_store_on_loopback_alone():
    torchs_store_class = loopback.LoopbackTCPStore.__bases__[0]
    plain = torchs_store_class(loopback.LOCALHOST, 0, 1, True, wait_for_workers=False)
    ours = loopback.loopback_store(loopback.listening_socket(), 1, wait_for_workers=False)
    found = {s["port"]: s["address"] for s in listening_sockets(os.getpid())}
    assert not is_loopback(found[plain.port])  # "::" or "0.0.0.0", whatever host it was given
    assert found[ours.port] == "127.0.0.1"
    del plain, ours


def test_the_free_port_check_is_the_bind_on_loopback():
    held = loopback.listening_socket()
    port = held.getsockname()[1]
    with pytest.raises(OSError):
        loopback.listening_socket(port)
    with pytest.raises(launcher.LaunchError, match=f"Port {port} is busy"):
        launcher.check_can_launch(2, port=port)
    held.close()
    store = loopback.loopback_store(loopback.listening_socket(port), 1, wait_for_workers=False)
    assert store.port == port
    del store


def test_a_store_on_a_loopback_socket_serves_its_clients():
    store = loopback.loopback_store(loopback.listening_socket(), 2, wait_for_workers=False)
    client = torch.distributed.TCPStore(loopback.LOCALHOST, store.port, 2, False)
    client.set("written by", "a client")
    assert store.get("written by") == b"a client"


def test_the_loopback_interface_is_one_this_machine_has():
    name = loopback.loopback_interface()
    assert name in {n for _, n in socket.if_nameindex()}
    assert loopback.gloo_on_loopback() == {"GLOO_SOCKET_IFNAME": name}


def _report_from_launch(launcher_pid):
    return meet_and_report(launcher_pid)


@pytest.mark.forks
def test_a_launch_listens_on_loopback_only():
    reports = launcher.launch(_report_from_launch, (os.getpid(),), num_processes=2, quiet=True, timeout=120)
    found, interface = reports[0]
    assert_all_on_loopback(found, at_least=3)
    assert any(s["pid"] == os.getpid() for s in found)  # the launch's store, hosted here
    assert {interface for _, interface in reports} == {loopback.loopback_interface()}


def _report_from_gloo_group(launcher_pid):
    import torch.distributed as dist

    os.environ.pop("GLOO_SOCKET_IFNAME")  # as in a process some other launcher started
    with sharding.gloo_group():
        dist.barrier()
        found = listening_sockets(launcher_pid) if dist.get_rank() == 0 else None
        dist.barrier()
        return found, os.environ.get("GLOO_SOCKET_IFNAME")


@pytest.mark.forks
def test_shardings_gloo_group_puts_gloo_on_loopback_whoever_launched():
    reports = launcher.launch(_report_from_gloo_group, (os.getpid(),), num_processes=2, quiet=True, timeout=120)
    assert_all_on_loopback(reports[0][0], at_least=3)
    assert {interface for _, interface in reports} == {loopback.loopback_interface()}


@pytest.mark.forks
@pytest.mark.parametrize("command", [
    "python -m listening_sockets notebook_launcher",  # accelerate's notebook_launcher, as lesson 6's cell calls it
    "torchrun --nproc_per_node 2 -m listening_sockets",  # one machine, no master port: the c10d rendezvous
    "torchrun --nproc_per_node 2 --master_port {port} -m listening_sockets",  # the static rendezvous
    "accelerate launch --multi_gpu --num_processes 2 " + NO_HUB_WARNINGS + " --main_process_port {port} "
    "-m listening_sockets",
], ids=["notebook_launcher", "torchrun", "torchrun-master-port", "accelerate-launch"])
def test_a_command_line_launch_listens_on_loopback_only(command, capsys):
    port = launcher.find_free_port()
    output = command_line.run_command(command.format(port=port), cwd=TESTS_DIR, timeout=300)
    capsys.readouterr()
    report = reported(output)
    assert_all_on_loopback(report["sockets"], at_least=3)
    assert report["gloo_interface"] == loopback.loopback_interface()
    if "{port}" in command:
        assert port in {s["port"] for s in report["sockets"]}  # the store the agent hosts, on loopback
