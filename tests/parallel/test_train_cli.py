"""The command line ``python -m course_utils.train``: alone, and on two processes with accelerate launch (lesson 6)."""

import contextlib
import io
import json
import os
import subprocess
import sys

import pytest
import torch

from course_utils import REPO_DIR, data, launcher, parallel, schedules, train

# It launches worker processes: make test runs the `forks` tests in a pytest process of their own (the Makefile says why).
pytestmark = pytest.mark.forks

OFFLINE = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
# Without a config file, these flags keep accelerate launch from warning about the defaults it would pick.
# A free port rather than the default 29500, which an earlier run may still hold for a minute.
ACCELERATE_LAUNCH = [
    sys.executable, "-m", "accelerate.commands.accelerate_cli", "launch", "--multi_gpu", "--num_processes", "2",
    "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
    "--main_process_port", str(launcher.find_free_port()),
]
# 160 examples: batches of 8 on each of 2 processes, or of 16 on one, make 10 steps with no example
# repeated; the 10% warm-up is 2 scheduler ticks of batches of 8 = 1 tick of 16 = 1 step either way.
SMALL = ["--cpu", "--no-dropout", "--limit", "160", "--epochs", "1"]
TOLERANCE = 1e-5


def run(command, timeout=300):
    return subprocess.run(command, cwd=REPO_DIR, env=OFFLINE, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory):
    """The 2-process run, once for the module: (completed process, saved parameters, metrics)."""
    directory = tmp_path_factory.mktemp("two-processes")
    completed = run(ACCELERATE_LAUNCH + [
        "-m", "course_utils.train", *SMALL, "--batch-size", "8",
        "--save-parameters", str(directory / "parameters.pt"), "--metrics-json", str(directory / "metrics.json"),
    ])
    assert completed.returncode == 0, completed.stdout + completed.stderr
    parameters = torch.load(directory / "parameters.pt")
    return completed, parameters, json.loads((directory / "metrics.json").read_text())


def test_help_lists_the_options_and_the_command_for_several_processes():
    completed = run([sys.executable, "-m", "course_utils.train", "--help"], timeout=60)
    assert completed.returncode == 0
    for option in ("--batch-size", "--epochs", "--limit", "--cpu", "--no-dropout", "--save-parameters"):
        assert option in completed.stdout
    assert "accelerate launch --multi_gpu --num_processes 2" in " ".join(completed.stdout.split())


def test_two_processes_train_as_one_group_and_print_the_metrics_once(two_processes):
    completed, _, metrics = two_processes
    assert completed.stdout.count("validation accuracy") == 1
    table_rows = [line.split() for line in completed.stdout.splitlines() if line.split()[:1] in (["0"], ["1"])]
    assert [row[:4] for row in table_rows] == [["0", "0", "2", "MULTI_CPU"], ["1", "1", "2", "MULTI_CPU"]]
    assert "Data parallel: the 2 workers formed one group" in completed.stdout
    assert metrics["num_processes"] == 2 and metrics["steps"] == 10


def test_accelerate_launch_needs_no_config_file_and_says_nothing_with_these_flags(two_processes):
    completed, _, _ = two_processes
    assert "defaults used instead" not in completed.stderr
    assert "Traceback" not in completed.stderr


@pytest.fixture
def restore_threads():
    """main(["--threads", ...]) sets this process's torch threads; put them back afterwards."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_one_process_alone_matches_two_processes_with_half_the_batch(two_processes, tmp_path, restore_threads):
    _, two_parameters, two_metrics = two_processes
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        # One thread, like each of the two processes: the same arithmetic, and no wait on a busy core.
        result = train.main([*SMALL, "--batch-size", "16", "--threads", "1", "--save-parameters", str(tmp_path / "one.pt")])
    assert printed.getvalue().count("validation accuracy") == 1
    assert result.report.num_processes == 1 and len(result.losses) == 10
    one_parameters = torch.load(tmp_path / "one.pt")
    assert parallel.max_parameter_difference(one_parameters, two_parameters, skip=parallel.NOISE_ONLY_PARAMETERS) < TOLERANCE
    # The attention key biases have a zero gradient up to rounding: their updates are noise, which
    # Adam's eps keeps to a few thousandths of lr (1e-3) per step. They may differ, but by far less than lr.
    noise_only = {name: gap for name, gap in parallel.parameter_differences(one_parameters, two_parameters).items()
                  if any(part in name for part in parallel.NOISE_ONLY_PARAMETERS)}
    assert noise_only and max(noise_only.values()) < 1e-3
    assert result.accuracy == pytest.approx(two_metrics["accuracy"])
    assert two_metrics["baseline"] == pytest.approx(result.baseline)


def test_accelerate_launch_with_cpu_flag_starts_a_single_process(tmp_path):
    # The trap the lesson warns about: --cpu selects Accelerate's MPI-based CPU launcher,
    # which without mpirun runs the script once.
    script = tmp_path / "count.py"
    script.write_text("import os\nprint('process of', os.environ.get('WORLD_SIZE', 'no WORLD_SIZE'))\n")
    completed = run([*ACCELERATE_LAUNCH[:4], "--cpu", *ACCELERATE_LAUNCH[5:], str(script)], timeout=120)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.splitlines() == ["process of no WORLD_SIZE"]


def test_the_course_script_stops_that_single_process_and_gives_the_command_that_works():
    completed = run([*ACCELERATE_LAUNCH[:4], "--cpu", *ACCELERATE_LAUNCH[5:], "-m", "course_utils.train", *SMALL], timeout=120)
    assert completed.returncode == 1
    # The script's own message comes first; accelerate launch then adds its
    # traceback of the failed command, which this project cannot change.
    assert completed.stderr.startswith("error: `accelerate launch --cpu --num_processes N` started only this one process")
    assert "accelerate launch --multi_gpu --num_processes N" in completed.stderr


def test_train_config_rejects_bad_values():
    with pytest.raises(ValueError, match="batch_size"):
        train.TrainConfig(batch_size=0)
    with pytest.raises(ValueError, match="limit"):
        train.TrainConfig(limit=-1)
    with pytest.raises(ValueError, match="lr"):
        train.TrainConfig(lr=0)
    with pytest.raises(TypeError, match="cpu"):
        train.TrainConfig(cpu="yes")


def test_the_training_function_trains_through_accelerates_calls_as_its_examples_do(monkeypatch):
    # Lesson 6 shows this function as Accelerate's example loop: an Accelerator made from the
    # config, backward through it once per training batch, predictions gathered once per eval batch.
    calls = []

    class Recorded(train.Accelerator):
        def __init__(self, *args, **kwargs):
            calls.append(("Accelerator", args, kwargs))
            super().__init__(*args, **kwargs)

        def backward(self, loss, **kwargs):
            calls.append("backward")
            return super().backward(loss, **kwargs)

        def gather_for_metrics(self, input_data, *args, **kwargs):
            calls.append("gather_for_metrics")
            return super().gather_for_metrics(input_data, *args, **kwargs)

    monkeypatch.setattr(train, "Accelerator", Recorded)
    config = train.TrainConfig(batch_size=8, num_epochs=1, cpu=True, limit=16)
    result = train.training_function(config)
    _, eval_dataloader = data.make_dataloaders(batch_size=8, seed=0, limit=16)
    assert calls[0] == ("Accelerator", (), {"cpu": True})
    assert calls.count("backward") == len(result.losses) == 2  # 16 examples in batches of 8
    assert calls.count("gather_for_metrics") == len(eval_dataloader)
    assert calls.index("gather_for_metrics") > max(i for i, call in enumerate(calls) if call == "backward")


def test_the_training_function_lesson_6_shows_has_no_argument_checks():
    import inspect

    # The lesson displays this source (inspect.getsource): TrainConfig checks the settings, the loop stays plain.
    assert "check_" not in inspect.getsource(train.training_function)


def test_the_schedule_is_transformers_linear_schedule_with_warmup():
    from transformers import get_linear_schedule_with_warmup

    for warmup, total in [(0, 10), (3, 30), (37, 372)]:
        ours = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
        theirs = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
        our_schedule = torch.optim.lr_scheduler.LambdaLR(ours, schedules.linear_warmup_then_decay(warmup, total))
        their_schedule = get_linear_schedule_with_warmup(theirs, warmup, total)
        for _ in range(total + 2):
            assert ours.param_groups[0]["lr"] == pytest.approx(theirs.param_groups[0]["lr"], abs=1e-12)
            our_schedule.step()
            their_schedule.step()
