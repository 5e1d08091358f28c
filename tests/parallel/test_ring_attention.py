"""Ring attention: a sequence split across processes attends as one process does, forward and gradients."""

import sys

import pytest
import torch

from course_utils import launcher
from course_utils import ring_attention as ra

pytestmark = pytest.mark.forks

SEEDS = (0, 1, 2)


@pytest.fixture(autouse=True)
def launchable(monkeypatch):
    monkeypatch.delitem(sys.modules, "bitsandbytes", raising=False)


def test_full_attention_is_torch_scaled_dot_product_attention():
    for seed in SEEDS:
        q, k, v = ra.random_qkv(seed, 96)
        for causal in (True, False):
            expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
            assert torch.allclose(ra.attention(q, k, v, causal), expected, atol=1e-5)


@pytest.mark.parametrize("score_scale", [1.0, 50.0])
def test_merging_two_halves_by_their_log_sum_exp_is_attention_over_all_keys(score_scale):
    """Large scores too: exp(lse) itself would overflow there, logaddexp does not."""
    for seed in SEEDS:
        q, k, v = ra.random_qkv(seed, 64)
        q = q * score_scale
        whole, whole_lse = ra.block_attention(q, k, v)
        first = ra.block_attention(q, k[:, :40], v[:, :40])
        second = ra.block_attention(q, k[:, 40:], v[:, 40:])
        out, lse = ra.merge_partial(*first, *second)
        assert torch.isfinite(out).all()
        assert torch.allclose(out, whole, atol=1e-5) and torch.allclose(lse, whole_lse, atol=1e-4)


def test_averaging_the_halves_without_reweighting_is_not_attention():
    q, k, v = ra.random_qkv(0, 64)
    (out_a, _), (out_b, _) = ra.block_attention(q, k[:, :40], v[:, :40]), ra.block_attention(q, k[:, 40:], v[:, 40:])
    assert not torch.allclose((out_a + out_b) / 2, ra.block_attention(q, k, v)[0], atol=1e-3)


def test_the_causal_mask_compares_global_positions():
    earlier, own, later = torch.arange(0, 4), torch.arange(4, 8), torch.arange(8, 12)
    assert ra.causal_mask(own, earlier).all()
    assert torch.equal(ra.causal_mask(own, own), torch.ones(4, 4, dtype=torch.bool).tril())
    assert not ra.causal_mask(own, later).any()


def test_a_ring_of_one_process_is_full_attention_forward_and_gradients():
    for seed in SEEDS:
        for causal in (True, False):
            leaves = [t.requires_grad_() for t in ra.random_qkv(seed, 80)]
            copies = [t.detach().clone().requires_grad_() for t in leaves]
            ra.ring_attention(*leaves, causal=causal).pow(2).sum().backward()
            ra.attention(*copies, causal=causal).pow(2).sum().backward()
            for mine, full in zip(leaves, copies):
                assert torch.allclose(mine.grad, full.grad, atol=1e-5)


def test_the_ring_keeps_only_its_inputs_output_and_log_sum_exp_for_the_backward_pass():
    """q, k, v, out (heads x seq x d each) and lse (heads x seq), fp32; full attention keeps seq x seq tensors."""
    heads, seq, dim = 2, 128, 32
    q, k, v = (t.requires_grad_() for t in ra.random_qkv(0, seq))
    kept, _ = ra.attention_memory(ra.ring_attention, q, k, v)
    assert kept == 4 * (4 * heads * seq * dim + heads * seq)
    full_kept, _ = ra.attention_memory(ra.attention, *(t.detach().requires_grad_() for t in (q, k, v)))
    assert full_kept >= 4 * heads * seq * seq


def test_sequence_chunk_cuts_the_sequence_into_equal_contiguous_pieces():
    x = torch.arange(12.0).reshape(1, 6, 2)
    assert torch.equal(torch.cat([ra.sequence_chunk(x, r, 3) for r in range(3)], dim=-2), x)
    with pytest.raises(ValueError, match="divisible by world_size=4"):
        ra.sequence_chunk(x, 0, 4)


MEMORY_SEQ_LENS = (256, 512)


@pytest.fixture(scope="module")
def launched():
    two = launcher.launch(ra.context_parallel_run, (SEEDS, 128, MEMORY_SEQ_LENS), num_processes=2, quiet=True,
                          timeout=120)
    # Three processes: the next and the previous process differ, so a ring that turns the wrong way would show.
    three = launcher.launch(ra.context_parallel_run, (SEEDS, 96, ()), num_processes=3, quiet=True, timeout=120,
                            oversubscribe=True)
    return two, three


@pytest.mark.parametrize("processes", [2, 3])
def test_ring_attention_on_processes_equals_full_attention_forward_and_gradients(launched, processes):
    runs = launched[processes - 2]
    assert [run.rank for run in runs] == list(range(processes))
    for run in runs:
        assert set(run.output_errors) == {(seed, causal) for seed in SEEDS for causal in (True, False)}
        assert max(run.output_errors.values()) < 1e-5
        assert max(run.gradient_errors.values()) < 1e-5


def test_under_the_causal_mask_each_process_computes_the_blocks_at_and_before_its_own(launched):
    """Process r computes r + 1 blocks of N: the ring is unbalanced under a causal mask."""
    for run in launched[1]:
        assert [source for _, source, _ in run.steps] == [(run.rank - step) % 3 for step in range(3)]
        assert sum(computed for *_, computed in run.steps) == run.rank + 1


def test_each_of_two_processes_keeps_half_the_bytes_for_backward_and_a_quarter_of_the_peak_block(launched):
    for index, seq_len in enumerate(MEMORY_SEQ_LENS):
        alone = [t.requires_grad_() for t in ra.random_qkv(0, seq_len)]
        kept_alone, peak_alone = ra.attention_memory(ra.ring_attention, *alone)
        for run in launched[0]:
            assert run.kept[index] * 2 == kept_alone
            # The score block is (seq/2)^2 instead of seq^2; the merge and the messages add a little.
            assert run.peaks[index] < peak_alone / 2


def test_the_memory_figure_has_a_title_labelled_axes_and_keeps_every_label(launched):
    import matplotlib.pyplot as plt
    from figure_checks import assert_nothing_is_cropped

    from course_utils.plots import ring_attention as ring_plots

    two = launched[0]
    figure = ring_plots.plot_attention_memory(MEMORY_SEQ_LENS, {"ring attention, each of 2 processes": (
        list(two[0].kept), list(two[0].peaks))})
    try:
        assert figure._suptitle.get_text()
        for ax in figure.axes:
            assert "MiB" in ax.get_ylabel() and "tokens" in ax.get_xlabel() and ax.get_title()
        assert_nothing_is_cropped(figure)
    finally:
        plt.close(figure)


def diagonal_mask_everywhere(query_positions, key_positions):
    """The classic mistake: every step masked as if it held the diagonal block."""
    return torch.ones(len(query_positions), len(key_positions), dtype=torch.bool).tril()


def averaged_merge(out_a, lse_a, out_b, lse_b):
    """The classic mistake: the parts averaged, not reweighted by their log-sum-exp."""
    return (out_a + out_b) / 2, torch.logaddexp(lse_a, lse_b)


@pytest.mark.parametrize("mistake", ["mask", "merge"])
def test_the_launched_comparison_catches_each_classic_mistake(mistake):
    pieces = {"mask": (ra.merge_partial, diagonal_mask_everywhere), "merge": (averaged_merge, ra.causal_mask)}[mistake]
    runs = launcher.launch(ra.context_parallel_run, ((0,), 96, (), *pieces), num_processes=2, quiet=True, timeout=120)
    causal_errors = [error for run in runs for (seed, causal), error in run.output_errors.items() if causal]
    assert max(causal_errors) > 1e-2


def test_a_mask_that_hides_every_key_is_refused_by_name():
    with pytest.raises(ValueError, match="mask hides every key"):
        ra.ring_attention(*ra.random_qkv(0, 8), mask=lambda q, k: torch.zeros(len(q), len(k), dtype=torch.bool))
