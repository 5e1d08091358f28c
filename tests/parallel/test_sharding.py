"""course_utils.sharding: each strategy, launched on CPU processes, holds what ZeRO says and trains as one process does."""

import sys

import pytest

from course_utils import launcher, parallel, sharding
from course_utils.plots.sharding import plot_held_per_process

# It launches worker processes: make test runs the `forks` tests in a pytest process of their own (the Makefile says why).
pytestmark = pytest.mark.forks


@pytest.fixture(autouse=True)
def launchable(monkeypatch):
    monkeypatch.delitem(sys.modules, "bitsandbytes", raising=False)


@pytest.fixture(scope="module")
def runs():
    one = launcher.launch(sharding.train_one_process, num_processes=1, quiet=True)[0]
    launched = {
        strategy: launcher.launch(sharding.train_with_strategy, (strategy,), num_processes=2, quiet=True,
                                  oversubscribe=True)
        for strategy in sharding.STRATEGIES
    }
    return one, launched


def whole_parameter_bytes():
    return 4 * sum(p.numel() for p in sharding._loaded_model().parameters())


def test_ddp_holds_everything_and_a_bucket_copy_of_the_gradients(runs):
    _, launched = runs
    whole = whole_parameter_bytes()
    for process in launched["ddp"]:
        assert process.parameters == process.gradients == process.buckets == whole
        assert process.optimizer_state - process.optimizer_scalars == 2 * whole


def test_zero1_divides_only_the_optimizer_state_by_whole_tensors(runs):
    _, launched = runs
    whole = whole_parameter_bytes()
    moments = [p.optimizer_state - p.optimizer_scalars for p in launched["zero1"]]
    assert sum(moments) == 2 * whole
    assert all(p.parameters == p.gradients == whole for p in launched["zero1"])


@pytest.mark.parametrize("strategy", ["zero2", "zero3"])
def test_fsdp_strategies_hold_half_the_parameters_and_gradients_with_padding(runs, strategy):
    _, launched = runs
    whole = whole_parameter_bytes()
    for process in launched[strategy]:
        assert whole / 2 <= process.parameters <= whole / 2 * 1.01
        assert process.gradients == process.parameters and process.buckets == 0
        assert process.fsdp_units == len(sharding.sharded_blocks(sharding._loaded_model())) + 1


def test_zero2_keeps_the_whole_model_gathered_at_its_peak_and_zero3_does_not(runs):
    _, launched = runs
    zero2 = launched["zero2"][0].peak_by_category["Unsharded Param"]
    zero3 = launched["zero3"][0].peak_by_category["Unsharded Param"]
    assert zero2 >= whole_parameter_bytes() > zero3


@pytest.mark.parametrize("strategy", sharding.STRATEGIES)
def test_every_strategy_trains_the_model_one_process_trains(runs, strategy):
    one, launched = runs
    gap = parallel.max_parameter_difference(one["final_parameters"], launched[strategy][0].final_parameters,
                                            skip=parallel.NOISE_ONLY_PARAMETERS)
    assert gap <= 1e-5
    assert launched[strategy][0].losses == pytest.approx(one["losses"], abs=1e-5)


def test_plot_has_title_axis_labels_and_a_bar_per_process_and_category(runs):
    _, launched = runs
    figure = plot_held_per_process({s: launched[s] for s in sharding.STRATEGIES})
    axes = figure.axes[0]
    assert axes.get_title() and "MiB" in axes.get_ylabel() and axes.get_xlabel()
    assert len(axes.patches) == 2 * len(sharding.STRATEGIES) * 5


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="strategy"):
        sharding.train_with_strategy("zero4")
    with pytest.raises(RuntimeError, match="launch of 2 or more"):
        sharding.train_with_strategy("ddp")
    with pytest.raises(TypeError, match="runs"):
        plot_held_per_process({})


def test_launch_refuses_more_processes_than_cores_unless_oversubscribed(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 1)
    with pytest.raises(launcher.LaunchError, match="oversubscribe"):
        launcher.check_can_launch(2)
    assert launcher.check_can_launch(2, oversubscribe=True) > 0
    with pytest.raises(TypeError, match="oversubscribe"):
        launcher.check_can_launch(2, oversubscribe="yes")


def test_each_strategy_hands_the_collectives_what_zero_says(runs):
    _, launched = runs
    whole = whole_parameter_bytes()
    assert launched["ddp"][0].communicated == {"all_reduce": whole}
    assert launched["zero1"][0].communicated == {"all_reduce": whole, "broadcast": whole}
    for strategy, gathers in (("zero2", 1), ("zero3", 2)):
        counted = launched[strategy][0].communicated
        shard = launched[strategy][0].parameters  # this process's padded shard
        assert counted == {"all_gather_single": gathers * shard, "reduce_scatter_single": 2 * shard}


def test_local_sgd_every_four_steps_sends_less_per_step_than_ddp_and_still_learns():
    ddp = launcher.launch(sharding.train_with_local_sgd, (None, 16, 6, 0), num_processes=2, quiet=True,
                          oversubscribe=True)
    local = launcher.launch(sharding.train_with_local_sgd, (4, 16, 6, 0), num_processes=2, quiet=True,
                            oversubscribe=True)
    assert ddp[0]["sent_per_step"] >= whole_parameter_bytes()
    # 8 steps per process: averages after steps 4 and 8, and once more when LocalSGD's block ends.
    assert local[0]["sent_per_step"] <= 3 * whole_parameter_bytes() / 8 * 1.01 < ddp[0]["sent_per_step"]
    assert all(0 < run[0]["validation_loss"] < 1 for run in (ddp, local))


@pytest.mark.parametrize("strategy", ["zero2", "zero3"])
def test_the_allocator_rises_at_least_as_far_as_the_tracker_sees(strategy):
    rises = launcher.launch(sharding.measure_planned_step_rise, (strategy, 2, 16), num_processes=2, quiet=True,
                            oversubscribe=True, timeout=120)
    for rise in rises:
        assert rise["tracker_rise"] > 0
        # The instruments start counting at slightly different moments: 16 B below was seen once.
        assert rise["allocator_rise"] >= 0.99 * rise["tracker_rise"]
        assert rise["allocating_threads"] >= 1


def test_measuring_the_rise_refuses_a_strategy_it_does_not_shard():
    with pytest.raises(ValueError, match="strategy"):
        sharding.measure_planned_step_rise("ddp", 2, 16)
