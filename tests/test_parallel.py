"""Data parallelism on CPU processes (lesson 4): sharding, launching, guard rails, evidence, equivalence."""

import os
import socket
import sys
import types
from types import SimpleNamespace

import pytest
import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType, set_seed
from torch.utils.data import DataLoader
from transformers import DistilBertConfig, DistilBertForSequenceClassification

from course_utils import loops, parallel
from course_utils.parallel import LaunchError, ProcessReport

# ---------------------------------------------------------------- a tiny problem that trains in a second

NUM_EXAMPLES, EPOCHS = 80, 2  # 80 examples: batches of 8 or 16 split evenly, no example repeated


def tiny_classifier():
    # DistilBERT's default dropout (0.1) is kept: the runs that compare turn it off explicitly.
    config = DistilBertConfig(vocab_size=50, dim=16, n_layers=1, n_heads=2, hidden_dim=32, max_position_embeddings=16)
    return DistilBertForSequenceClassification(config)


def random_pairs(batch_size, seed=0):
    generator = torch.Generator().manual_seed(1234)
    examples = [
        {
            "input_ids": torch.randint(0, 50, (10,), generator=generator),
            "attention_mask": torch.ones(10, dtype=torch.long),
            "labels": torch.randint(0, 2, (), generator=generator),
        }
        for _ in range(NUM_EXAMPLES)
    ]
    return DataLoader(examples, batch_size=batch_size, shuffle=True, generator=torch.Generator().manual_seed(seed))


def train_tiny(batch_size, cpu=True, dropout=False):
    """Run in each launched worker: train the tiny model; return (its ProcessReport, its parameters)."""
    accelerator = Accelerator(cpu=cpu)
    set_seed(0)
    model = tiny_classifier()
    if not dropout:
        parallel.without_dropout(model)
    dataloader = random_pairs(batch_size)
    # Ticks counted in batches before prepare: 20 on 2 processes x 8, 10 on 1 x 16, so
    # the 10% warm-up is 2 ticks = 1 step in both.
    optimizer, lr_scheduler = loops.make_optimizer_and_scheduler(model, EPOCHS * len(dataloader), lr=1e-2)
    losses = loops.train_accelerate(
        model, optimizer, lr_scheduler, dataloader, EPOCHS, accelerator=accelerator, show_progress=False
    )
    report = parallel.report_process(accelerator, model, len(losses) // EPOCHS, losses[-1])
    return report, parallel.parameters_of(model)


@pytest.fixture
def launchable(monkeypatch):
    """A process that may launch workers: no Accelerate state, and bitsandbytes not in sys.modules.

    Other test modules import bitsandbytes, which makes notebook_launcher refuse to
    fork in case it initialised a GPU. This CPU-only test process has no GPU to
    spoil, so the module is hidden for the duration of the test.
    """
    monkeypatch.delitem(sys.modules, "bitsandbytes", raising=False)


# ---------------------------------------------------------------- sharding


@pytest.mark.parametrize("num_batches, num_processes, expected", [(10, 2, 5), (11, 2, 6), (7, 4, 2), (3, 4, 1), (8, 1, 8)])
def test_each_process_takes_the_batches_rounded_up(num_batches, num_processes, expected):
    assert parallel.batches_per_process(num_batches, num_processes) == expected


def test_batches_per_process_agrees_with_accelerates_sampler():
    for num_examples in range(1, 30):
        shards = parallel.shards_of_each_process(num_examples, batch_size=2, num_processes=3)
        num_batches = -(-num_examples // 2)
        assert [len(shard) for shard in shards] == [parallel.batches_per_process(num_batches, 3)] * 3


def test_processes_take_whole_batches_in_turn_and_repeat_the_first_examples_to_fill_the_last_step():
    shards = parallel.shards_of_each_process(10, batch_size=2, num_processes=2)
    assert shards == [[[0, 1], [4, 5], [8, 9]], [[2, 3], [6, 7], [0, 1]]]


def test_split_batches_cuts_every_batch_into_equal_pieces():
    shards = parallel.shards_of_each_process(8, batch_size=4, num_processes=2, split_batches=True)
    assert shards == [[[0, 1], [4, 5]], [[2, 3], [6, 7]]]


def test_two_shards_of_b_cover_the_same_examples_as_one_batch_of_2b():
    # The arrangement behind the equivalence: step k on 2 processes x b = batch k of 1 process x 2b.
    two = parallel.shards_of_each_process(32, batch_size=4, num_processes=2)
    one = parallel.shards_of_each_process(32, batch_size=8, num_processes=1)[0]
    assert [sorted(two[0][step] + two[1][step]) for step in range(len(one))] == one


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: parallel.batches_per_process(0, 2), "num_batches"),
        (lambda: parallel.batches_per_process(10, 0), "num_processes"),
        (lambda: parallel.batches_per_process(10, True), "num_processes"),
        (lambda: parallel.shards_of_each_process(10, 0, 2), "batch_size"),
        (lambda: parallel.shards_of_each_process(10, 3, 2, split_batches=True), "batch_size must be a multiple"),
    ],
)
def test_bad_sharding_arguments_are_named(call, name):
    with pytest.raises(ValueError, match=name):
        call()


# ---------------------------------------------------------------- guard rails


def test_an_accelerator_in_this_process_asks_for_a_kernel_restart(launchable):
    Accelerator(cpu=True)
    with pytest.raises(LaunchError, match="Restart the kernel"):
        parallel.check_can_launch(2)


def test_imported_bitsandbytes_is_refused_before_the_launcher_refuses(monkeypatch):
    monkeypatch.setitem(sys.modules, "bitsandbytes", types.ModuleType("bitsandbytes"))
    with pytest.raises(LaunchError, match="import bitsandbytes only inside"):
        parallel.check_can_launch(2)


def test_more_processes_than_cores_is_refused(launchable):
    cores = os.cpu_count()
    with pytest.raises(LaunchError, match=f"more than the {cores} CPU cores"):
        parallel.check_can_launch(cores + 1)


def test_a_busy_port_is_refused_with_a_free_one_suggested(launchable):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        busy = server.getsockname()[1]
        assert not parallel.port_is_free(busy)
        with pytest.raises(LaunchError, match=rf"Port {busy} is busy.*Pass port=\d+"):
            parallel.check_can_launch(2, port=busy)


def test_without_a_port_a_free_one_is_chosen(launchable):
    port = parallel.check_can_launch(2)
    assert parallel.port_is_free(port)
    assert parallel.port_is_free(parallel.find_free_port())


@pytest.mark.parametrize(
    "call, error, name",
    [
        (lambda: parallel.check_can_launch(0), ValueError, "num_processes"),
        (lambda: parallel.check_can_launch(2, port=70000), ValueError, "port"),
        (lambda: parallel.launch("not a function"), TypeError, "function"),
        (lambda: parallel.launch(print, args=[1]), TypeError, "args"),
    ],
)
def test_bad_launch_arguments_are_named(call, error, name):
    with pytest.raises(error, match=name):
        call()


def test_a_process_launched_as_one_of_several_but_alone_is_stopped(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    alone = SimpleNamespace(num_processes=1, distributed_type=DistributedType.NO)
    with pytest.raises(LaunchError, match="cpu=True"):
        parallel.check_process_group(alone)
    parallel.check_process_group(SimpleNamespace(num_processes=2, distributed_type=DistributedType.MULTI_CPU))


def test_the_single_process_of_accelerate_launch_cpu_num_processes_is_stopped(monkeypatch):
    # What `accelerate launch --cpu --num_processes 2` leaves in the environment of its one process.
    for name in ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ACCELERATE_USE_CPU", "True")
    monkeypatch.setenv("MASTER_PORT", "29500")
    alone = SimpleNamespace(num_processes=1, distributed_type=DistributedType.NO)
    with pytest.raises(LaunchError, match="started only this one process.*--multi_gpu"):
        parallel.check_process_group(alone)
    monkeypatch.delenv("MASTER_PORT")  # `accelerate launch --cpu` of one process: nothing to say
    parallel.check_process_group(alone)


# ---------------------------------------------------------------- evidence


def report(rank, size, mode="MULTI_CPU", batches=5, checksum=0.25):
    return ProcessReport(rank, rank if size > 1 else 0, size, mode, batches, 0.5 + rank, checksum)


def test_the_diagnosis_names_the_silent_failure_when_every_worker_is_alone():
    verdict = parallel.diagnose_launch([report(0, 1, "NO", 10), report(1, 1, "NO", 10)], num_processes=2)
    assert verdict.startswith("Silent failure") and "each trained alone" in verdict and "10 batches" in verdict


def test_the_diagnosis_confirms_a_group_whose_gradients_agree():
    verdict = parallel.diagnose_launch([report(0, 2), report(1, 2)], num_processes=2)
    assert verdict.startswith("Data parallel") and "agree" in verdict


def test_the_diagnosis_flags_gradients_that_disagree():
    verdict = parallel.diagnose_launch([report(0, 2, checksum=1.0), report(1, 2, checksum=2.0)], num_processes=2)
    assert "DISAGREE" in verdict


def test_the_report_table_has_one_line_per_process_in_the_order_given():
    lines = parallel.format_reports([report(0, 2), report(1, 2)]).splitlines()
    assert len(lines) == 3 and lines[1].split()[:3] == ["0", "0", "2"] and lines[2].split()[:3] == ["1", "1", "2"]


def test_gradient_checksum_sums_every_gradient_element():
    model = torch.nn.Linear(3, 2)
    assert parallel.gradient_checksum(model) == 0.0
    model(torch.ones(1, 3)).sum().backward()
    expected = sum(p.grad.sum().item() for p in model.parameters())
    assert parallel.gradient_checksum(model) == pytest.approx(expected)


def test_without_dropout_makes_training_mode_deterministic():
    model = parallel.without_dropout(tiny_classifier()).train()
    inputs = torch.randint(0, 50, (4, 10))
    assert all(m.p == 0 for m in model.modules() if isinstance(m, torch.nn.Dropout))
    torch.testing.assert_close(model(input_ids=inputs).logits, model(input_ids=inputs).logits, rtol=0, atol=0)


def test_max_parameter_difference_is_the_largest_elementwise_gap():
    first = {"w": torch.zeros(2, 2), "b": torch.zeros(2)}
    second = {"w": torch.tensor([[0.0, 0.5], [0.0, 0.0]]), "b": torch.tensor([0.0, -0.75])}
    assert parallel.parameter_differences(first, second) == {"w": 0.5, "b": 0.75}
    assert parallel.max_parameter_difference(first, second) == 0.75
    assert parallel.max_parameter_difference(first, second, skip=("b",)) == 0.5
    with pytest.raises(ValueError, match="same parameter names"):
        parallel.max_parameter_difference(first, {"w": torch.zeros(2, 2)})
    with pytest.raises(TypeError, match="skip"):
        parallel.max_parameter_difference(first, second, skip="b")


def test_the_attention_key_bias_gets_only_rounding_noise_as_gradient():
    torch.manual_seed(0)
    model = parallel.without_dropout(tiny_classifier())
    inputs = torch.randint(0, 50, (8, 10))
    model(input_ids=inputs, labels=torch.randint(0, 2, (8,))).loss.backward()
    gradients = {name: p.grad.abs().max().item() for name, p in model.named_parameters()}
    noise = [g for name, g in gradients.items() if any(part in name for part in parallel.NOISE_ONLY_PARAMETERS)]
    others = [g for name, g in gradients.items() if not any(part in name for part in parallel.NOISE_ONLY_PARAMETERS)]
    assert noise and max(noise) < 1e-7 < 1e-4 < sorted(others)[len(others) // 2]


# ---------------------------------------------------------------- launching for real


def test_launch_returns_each_workers_value_in_worker_order(launchable):
    results = parallel.launch(lambda: int(os.environ["RANK"]) * 10, num_processes=2)
    assert results == [0, 10]


def test_one_process_runs_in_a_child_and_leaves_no_accelerator_here(launchable):
    results = parallel.launch(train_tiny, args=(16,), num_processes=1)
    assert results[0][0].num_processes == 1
    parallel.check_can_launch(2)  # nothing was left behind that would block the next launch


def test_without_cpu_true_two_workers_silently_train_alone(launchable):
    results = parallel.launch(train_tiny, args=(8, False), num_processes=2)
    reports = [report for report, _ in results]
    assert [(r.num_processes, r.distributed_type, r.num_batches) for r in reports] == [(1, "NO", 10)] * 2
    assert parallel.diagnose_launch(reports, 2).startswith("Silent failure")


def test_two_processes_with_batch_b_end_where_one_process_with_batch_2b_ends(launchable):
    two = parallel.launch(train_tiny, args=(8,), num_processes=2)
    one = parallel.launch(train_tiny, args=(16,), num_processes=1)
    reports = [report for report, _ in two]
    assert [(r.process_index, r.num_processes, r.distributed_type, r.num_batches) for r in reports] == [
        (0, 2, "MULTI_CPU", 5), (1, 2, "MULTI_CPU", 5)
    ]
    assert reports[0].gradient_checksum == reports[1].gradient_checksum
    assert reports[0].last_loss != reports[1].last_loss  # different shards, same gradients
    assert parallel.max_parameter_difference(two[0][1], two[1][1]) == 0.0  # the copies stay identical
    assert parallel.max_parameter_difference(two[0][1], one[0][1]) < 1e-5


def test_dropout_is_why_the_comparison_needs_it_off(launchable):
    two = parallel.launch(train_tiny, args=(8, True, True), num_processes=2)
    one = parallel.launch(train_tiny, args=(16, True, True), num_processes=1)
    # Each process draws its own dropout masks: the runs drift apart.
    assert parallel.max_parameter_difference(two[0][1], one[0][1]) > 1e-3


# ---------------------------------------------------------------- figures and the command-line helper


def test_the_flow_figure_has_a_title_and_one_column_of_boxes_per_process():
    import matplotlib.pyplot as plt

    from course_utils.plots import plot_data_parallel_flow

    for num_processes in (2, 3):
        figure = plot_data_parallel_flow(num_processes)
        texts = [text.get_text() for text in figure.axes[0].texts]
        assert figure.axes[0].get_title().startswith("Data parallelism")
        assert sum(text.startswith("process ") for text in texts) == num_processes
        assert any(f"/ {num_processes}" in text for text in texts)  # the gradient average
        plt.close(figure)
    with pytest.raises(ValueError, match="num_processes"):
        plot_data_parallel_flow(1)


def test_the_shards_figure_writes_every_batch_and_hatches_the_repeats():
    import matplotlib.pyplot as plt

    from course_utils.plots import plot_shards

    figure = plot_shards(parallel.shards_of_each_process(10, 2, 2))
    ax = figure.axes[0]
    assert sorted(text.get_text() for text in ax.texts) == sorted(["0, 1", "4, 5", "8, 9", "2, 3", "6, 7", "0, 1"])
    assert sum(bool(patch.get_hatch()) for patch in ax.patches) == 1
    assert ax.get_title() and ax.get_xlabel() == "step"
    plt.close(figure)


def test_the_wall_time_figure_shows_medians_in_seconds():
    import matplotlib.pyplot as plt

    from course_utils.plots import plot_wall_times

    figure = plot_wall_times({"1 process": [3.0, 1.0, 2.0], "2 processes": [4.0]})
    ax = figure.axes[0]
    assert [bar.get_height() for bar in ax.patches[:2]] == [2.0, 4.0]
    assert "(s)" in ax.get_ylabel() and ax.get_title()
    plt.close(figure)
    with pytest.raises(ValueError, match="seconds"):
        plot_wall_times({"1 process": []})


def test_run_command_accepts_only_the_course_programs():
    with pytest.raises(ValueError, match="must start with one of"):
        parallel.run_command("rm -rf /")
    with pytest.raises(ValueError, match="non-empty"):
        parallel.run_command("  ")
