"""The launch machinery behind lesson 6 (course_utils.launcher): guard rails, results, errors, time limits, interrupts."""

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import types
from types import SimpleNamespace

import psutil
import pytest
from accelerate import Accelerator
from accelerate.utils import DistributedType

from course_utils import REPO_DIR, accelerate_state, command_line, launcher, parallel
from course_utils.launcher import LaunchError, WorkerError, WorkerTimeout

# It launches worker processes: make test runs the `forks` tests in a pytest process of their own (the Makefile says why).
pytestmark = pytest.mark.forks

OFFLINE = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PYTHONPATH": str(REPO_DIR)}


# ---------------------------------------------------------------- guard rails


def test_more_processes_than_cores_is_refused():
    cores = os.cpu_count()
    with pytest.raises(LaunchError, match=f"more than the {cores} CPU cores"):
        launcher.check_can_launch(cores + 1)


def test_a_busy_port_is_refused_with_a_free_one_suggested():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        busy = server.getsockname()[1]
        assert not launcher.port_is_free(busy)
        with pytest.raises(LaunchError, match=rf"Port {busy} is busy.*Pass port=\d+"):
            launcher.check_can_launch(2, port=busy)


def test_a_port_someone_listens_on_is_reported_busy_and_free_once_closed():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert not launcher.port_is_free(port)
    assert launcher.port_is_free(port)


def test_without_a_port_the_launch_works_while_torchs_default_port_is_taken():
    # Two launches at once would both pick 29500 if launch() used torch's default: hold it and launch.
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            holder.bind(("127.0.0.1", 29500))
            holder.listen()
        except OSError:
            pass  # someone else holds it already: the condition this test wants
        assert parallel.launch(_group_size, num_processes=2, quiet=True) == [2, 2]


@pytest.mark.parametrize(
    "call, error, name",
    [
        (lambda: launcher.check_can_launch(0), ValueError, "num_processes"),
        (lambda: launcher.check_can_launch(2, port=70000), ValueError, "port"),
        (lambda: launcher.launch("not a function"), TypeError, "function"),
        (lambda: launcher.launch(print, args=[1]), TypeError, "args"),
        (lambda: launcher.launch(print, timeout=0), ValueError, "timeout"),
    ],
)
def test_bad_launch_arguments_are_named(call, error, name):
    with pytest.raises(error, match=name):
        call()


def test_a_process_launched_as_one_of_several_but_alone_is_stopped(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    alone = SimpleNamespace(num_processes=1, distributed_type=DistributedType.NO)
    with pytest.raises(LaunchError, match="cpu=True"):
        command_line.check_process_group(alone)
    command_line.check_process_group(SimpleNamespace(num_processes=2, distributed_type=DistributedType.MULTI_CPU))


def test_the_single_process_of_accelerate_launch_cpu_num_processes_is_stopped(monkeypatch):
    # What `accelerate launch --cpu --num_processes 2` leaves in the environment of its one process.
    for name in ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ACCELERATE_USE_CPU", "True")
    monkeypatch.setenv("MASTER_PORT", "29500")
    alone = SimpleNamespace(num_processes=1, distributed_type=DistributedType.NO)
    with pytest.raises(LaunchError, match="started only this one process.*--multi_gpu"):
        command_line.check_process_group(alone)
    monkeypatch.delenv("MASTER_PORT")  # `accelerate launch --cpu` of one process: nothing to say
    command_line.check_process_group(alone)


# ---------------------------------------------------------------- results


def _group_size():
    return Accelerator(cpu=True).num_processes


def test_launch_returns_each_workers_value_in_worker_order():
    assert parallel.launch(lambda: int(os.environ["RANK"]) * 10, num_processes=2, quiet=True) == [0, 10]


def test_one_process_runs_in_a_child_and_leaves_no_accelerator_here():
    from accelerate.state import AcceleratorState

    assert parallel.launch(_group_size, num_processes=1, quiet=True) == [1]
    assert not AcceleratorState._shared_state


def test_an_accelerator_created_here_does_not_reach_the_workers(monkeypatch):
    # What a learner does when trying an exercise function in the notebook: the
    # workers must still form their own group.
    monkeypatch.setitem(sys.modules, "bitsandbytes", types.ModuleType("bitsandbytes"))  # imported: harmless on CPU
    Accelerator(cpu=True)
    try:
        assert parallel.launch(_group_size, num_processes=2, quiet=True) == [2, 2]
    finally:
        accelerate_state.reset_accelerate_state()


class _GarbageThatSaysWhereItDies:
    """A reference cycle whose destruction writes the pid of the process that destroyed it to ``path``."""

    def __init__(self, path):
        self.path, self.cycle = path, self

    def __del__(self):
        with open(self.path, "a") as log:
            log.write(f"{os.getpid()}\n")


def _collect_garbage():
    import gc

    gc.collect()
    return os.getpid()


def test_a_worker_never_destroys_the_garbage_it_inherited(tmp_path):
    # This process's garbage may need this process to be destroyed (an earlier
    # launch's rendezvous store joins a server thread that exists only here).
    import gc

    deaths = tmp_path / "deaths"
    was_enabled = gc.isenabled()
    gc.disable()  # the cycle must still be garbage, not yet collected, when the workers start
    try:
        _GarbageThatSaysWhereItDies(deaths)
        worker_pids = parallel.launch(_collect_garbage, num_processes=2, quiet=True, timeout=120)
        assert not deaths.exists() or not set(deaths.read_text().split()) & {str(pid) for pid in worker_pids}
        gc.collect()  # here, where it belongs, it is destroyed
        assert deaths.read_text().split() == [str(os.getpid())]
    finally:
        if was_enabled:
            gc.enable()


def test_reset_accelerate_state_lets_accelerates_own_launcher_start_again():
    from accelerate.state import AcceleratorState

    Accelerator(cpu=True)
    assert AcceleratorState._shared_state
    accelerate_state.reset_accelerate_state()
    assert not AcceleratorState._shared_state


# ---------------------------------------------------------------- errors and time limits


def _divide_by_the_rank():
    rank = int(os.environ["RANK"])
    if rank == 1:
        return 1 / (rank - 1)
    Accelerator(cpu=True).wait_for_everyone()  # waits for rank 1, which never arrives


def test_a_workers_exception_is_reported_with_its_own_line_and_the_others_are_stopped():
    start = time.monotonic()
    with pytest.raises(WorkerError) as raised:
        parallel.launch(_divide_by_the_rank, num_processes=2, quiet=True, timeout=120)
    error = raised.value
    assert time.monotonic() - start < 60  # rank 0 waited in a collective; it was stopped, not waited for
    assert (error.rank, error.error_type, error.function) == (1, "ZeroDivisionError", "_divide_by_the_rank")
    assert error.line == "return 1 / (rank - 1)"
    assert str(error).splitlines() == [
        "worker 1 raised ZeroDivisionError: division by zero",
        "  in _divide_by_the_rank, line " + str(error.lineno) + ": return 1 / (rank - 1)",
    ]


def _fail_on_rank_1_after_rank_0_is_done():
    if int(os.environ["RANK"]) == 1:
        time.sleep(1)  # rank 0 has returned and ended by now
        raise ValueError("too late")
    return 0


def test_an_error_is_reported_at_once_when_no_other_worker_is_left_to_wait_for(monkeypatch):
    monkeypatch.setattr(launcher, "_GRACE_SECONDS", 60.0)
    start = time.monotonic()
    with pytest.raises(WorkerError, match="too late"):
        parallel.launch(_fail_on_rank_1_after_rank_0_is_done, num_processes=2, quiet=True, timeout=120)
    assert time.monotonic() - start < 30  # not the 60 s of grace given to workers still running


def _call_a_library_wrongly():
    import torch

    return torch.ones(2) @ torch.ones(3)  # the error is raised inside torch: the line shown is this one


def test_the_line_shown_is_the_callers_own_not_a_librarys():
    with pytest.raises(WorkerError) as raised:
        parallel.launch(_call_a_library_wrongly, num_processes=1, quiet=True)
    assert raised.value.function == "_call_a_library_wrongly" and "torch.ones(2) @ torch.ones(3)" in raised.value.line


def test_a_value_that_cannot_be_sent_back_is_a_clear_error():
    with pytest.raises(WorkerError, match="cannot be sent back"):
        parallel.launch(lambda: (lambda: None), num_processes=1, quiet=True)


def _sleep_forever():
    print(os.getpid(), flush=True)
    time.sleep(3600)


def test_code_still_running_after_the_time_limit_is_stopped_and_named(capfd):
    with pytest.raises(WorkerTimeout, match="your code was still running after 3 s; the 2 worker processes were stopped"):
        parallel.launch(_sleep_forever, num_processes=2, quiet=True, timeout=3)
    pids = [int(line) for line in capfd.readouterr().out.split()]
    assert len(pids) == 2 and not any(_alive(pid) for pid in pids)


# ---------------------------------------------------------------- interrupts end every process a cell started


def _alive(pid):
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


# A Jupyter kernel turns SIGINT into KeyboardInterrupt. A script started from a
# shell that runs in the background (`make test &`, some CI runners) inherits
# SIGINT *ignored*, and Python then leaves it ignored: so the scripts below say
# what a kernel does, whatever started the test run.
_LIKE_A_KERNEL = "import signal\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"


def _interrupt_like_jupyter(process):
    """Send SIGINT to the process group of ``process``, as Jupyter interrupts a kernel; return (stdout, stderr)."""
    os.killpg(process.pid, signal.SIGINT)
    return process.communicate(timeout=60)


def _wait_for_descendants(process, count, must_contain, deadline_s=120):
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        found = [
            child for child in psutil.Process(process.pid).children(recursive=True)
            if must_contain in " ".join(_cmdline(child))
        ]
        if len(found) >= count:
            return [child.pid for child in found]
        time.sleep(0.2)
    raise AssertionError(f"fewer than {count} processes running {must_contain!r} after {deadline_s} s")


def _cmdline(process):
    try:
        return process.cmdline()
    except psutil.Error:
        return []


def test_interrupting_a_launch_stops_every_worker_and_says_so_in_one_line(tmp_path):
    script = tmp_path / "interrupted_launch.py"
    script.write_text(_LIKE_A_KERNEL + textwrap.dedent("""
        import os, time
        from course_utils import parallel

        def sleeper():
            print(os.getpid(), flush=True)
            time.sleep(3600)

        parallel.launch(sleeper, num_processes=2, quiet=True)
    """))
    process = subprocess.Popen([sys.executable, str(script)], cwd=REPO_DIR, env=OFFLINE, start_new_session=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pids = [int(process.stdout.readline()) for _ in range(2)]
    assert all(_alive(pid) for pid in pids)
    _, stderr = _interrupt_like_jupyter(process)
    time.sleep(1)
    assert not any(_alive(pid) for pid in pids)
    assert stderr.strip().splitlines()[-1] == (
        "KeyboardInterrupt: interrupted: the 2 worker processes of this launch were stopped"
    )
    assert "SignalException" not in stderr and "Traceback" in stderr  # one exception, the interrupt itself


def test_interrupting_an_accelerate_launch_command_stops_it_and_all_its_workers(tmp_path):
    sleeper = tmp_path / "sleeper_worker.py"
    sleeper.write_text("import time\ntime.sleep(3600)\n")
    script = tmp_path / "interrupted_command.py"
    script.write_text(_LIKE_A_KERNEL + textwrap.dedent(f"""
        from course_utils import command_line, launcher
        command_line.run_command(
            "accelerate launch --multi_gpu --num_processes 2 --num_machines 1 --mixed_precision no "
            "--dynamo_backend no --main_process_port {launcher.find_free_port()} {sleeper}"
        )
    """))
    process = subprocess.Popen([sys.executable, str(script)], cwd=REPO_DIR, env=OFFLINE, start_new_session=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    workers = _wait_for_descendants(process, 2, str(sleeper))
    everything = [child.pid for child in psutil.Process(process.pid).children(recursive=True)]
    _, stderr = _interrupt_like_jupyter(process)
    time.sleep(1)
    assert not any(_alive(pid) for pid in everything + workers)
    last_line = stderr.strip().splitlines()[-1]
    assert last_line.startswith("KeyboardInterrupt: interrupted: `accelerate launch") and "were stopped" in last_line
    assert "SignalException" not in stderr


def test_run_command_stops_a_command_past_its_time_limit():
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="still running after 2 s"):
        command_line.run_command('python -c "import time; time.sleep(3600)"', timeout=2)
    assert time.monotonic() - start < 30


def test_run_command_accepts_only_the_course_programs():
    with pytest.raises(ValueError, match="must start with one of"):
        command_line.run_command("rm -rf /")
    with pytest.raises(ValueError, match="non-empty"):
        command_line.run_command("  ")
