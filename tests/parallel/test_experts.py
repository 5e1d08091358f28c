"""Expert parallelism: experts on different processes, two all-to-alls, the same layer as one process."""

import sys

import pytest
import torch

from course_utils import experts, launcher

pytestmark = pytest.mark.forks

SEEDS = (0, 1, 2)


@pytest.fixture(autouse=True)
def launchable(monkeypatch):
    monkeypatch.delitem(sys.modules, "bitsandbytes", raising=False)


def test_each_token_goes_to_its_best_expert_scaled_by_the_router_probability():
    moe = experts.make_moe(4, seed=3)
    x = experts.token_batch(3, 20)
    out = experts.moe_one_process(x, moe)
    probabilities = torch.softmax(moe.router(x), dim=-1)
    for token in range(20):
        best = int(probabilities[token].argmax())
        expected = moe.experts[best](x[token : token + 1])[0] * probabilities[token, best]
        assert torch.allclose(out[token], expected, atol=1e-6)


def test_a_skewed_router_sends_more_tokens_to_expert_zero():
    x = experts.token_batch(0, 200)
    counts = [int((experts.route(x, experts.make_moe(4, skew=skew).router)[0] == 0).sum()) for skew in (0.0, 3.0)]
    assert counts[1] > counts[0]


def test_make_moe_leaves_the_global_random_stream_as_it_was():
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    experts.make_moe(2, seed=9)
    assert torch.equal(torch.rand(3), expected)


def test_dispatch_groups_tokens_by_their_experts_process_and_counts_every_process():
    expert_ids = torch.tensor([3, 0, 2, 1, 0, 3])
    order, counts = experts.dispatch(expert_ids, experts_per_process=2, world_size=3)
    assert counts == [3, 3, 0]  # process 2 holds experts 4 and 5: none chosen, still counted
    assert (expert_ids[order] // 2).tolist() == [0, 0, 0, 1, 1, 1]
    assert order.tolist() == [1, 3, 4, 0, 2, 5]  # stable: tokens keep their order within a process


def test_load_balancing_loss_is_one_when_even_and_the_number_of_experts_when_all_on_one():
    even = torch.full((8, 4), 0.25)
    assert experts.load_balancing_loss(even, torch.arange(8) % 4) == pytest.approx(1.0)
    one = torch.zeros(8, 4)
    one[:, 2] = 1.0
    assert experts.load_balancing_loss(one, torch.full((8,), 2)) == pytest.approx(4.0)


def three_processes():
    return experts.expert_parallel_run(SEEDS, (0.0,), tokens_per_process=24, num_experts=6)


@pytest.fixture(scope="module")
def launched():
    two = launcher.launch(experts.expert_parallel_run, (SEEDS, (0.0, 2.0)), num_processes=2, quiet=True, timeout=120)
    three = launcher.launch(three_processes, num_processes=3, quiet=True, timeout=120, oversubscribe=True)
    return two, three


@pytest.mark.parametrize("processes", [2, 3])
def test_the_expert_parallel_layer_equals_the_one_process_layer_outputs_and_gradients(launched, processes):
    runs = launched[processes - 2]
    assert [run.rank for run in runs] == list(range(processes))
    for run in runs:
        assert set(run.output_errors) == set(SEEDS)
        assert max(run.output_errors.values()) < 1e-5
        assert max(run.gradient_errors.values()) < 1e-5
        assert set(run.misrouted.values()) == {0}


def test_each_process_holds_its_own_contiguous_experts(launched):
    assert [run.experts for run in launched[0]] == [(0, 1), (2, 3)]
    assert [run.experts for run in launched[1]] == [(0, 1), (2, 3), (4, 5)]


def test_every_token_is_computed_once_and_a_skewed_router_loads_one_process(launched):
    runs = launched[0]
    for skew in (0.0, 2.0):
        assert sum(sum(run.received[skew]) for run in runs) == 2 * 64
    busiest = max(sum(run.received[2.0]) for run in runs)
    assert busiest > max(sum(run.received[0.0]) for run in runs)
    assert runs[0].balance_loss[2.0] > runs[0].balance_loss[0.0]


def test_the_tokens_figure_has_a_title_labelled_axes_and_keeps_every_label(launched):
    import matplotlib.pyplot as plt
    from figure_checks import assert_nothing_is_cropped

    from course_utils.plots import experts as expert_plots

    runs = launched[0]
    figure = expert_plots.plot_tokens_per_expert({f"skew {skew:g}": [run.received[skew] for run in runs]
                                                  for skew in (0.0, 2.0)})
    try:
        ax = figure.axes[0]
        assert ax.get_title() and "count" in ax.get_ylabel() and ax.get_xlabel()
        assert sum(patch.get_height() for patch in ax.patches) == 2 * 2 * 64  # every token, under both routers
        assert_nothing_is_cropped(figure)
    finally:
        plt.close(figure)


def round_robin_dispatch(expert_ids, experts_per_process, world_size):
    """The classic mistake: experts taken as dealt round-robin, while each process holds a contiguous range."""
    destinations = expert_ids % world_size
    return torch.argsort(destinations, stable=True), torch.bincount(destinations, minlength=world_size).tolist()


def test_tokens_sent_to_the_wrong_expert_are_counted_and_break_the_equality():
    runs = launcher.launch(experts.expert_parallel_run, ((0,), (0.0,), 64, 4, round_robin_dispatch), num_processes=2,
                           quiet=True, timeout=120)
    assert sum(run.misrouted[0] for run in runs) > 0
    assert max(run.output_errors[0] for run in runs) > 1e-2
