"""Lesson 8's levers where they work: utilisation figures and HFU, shapes, foreach's calls, workers, a chunked loss, a profiler schedule."""

import pytest
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint, set_checkpoint_early_stop
from transformers import LlamaConfig, LlamaForCausalLM

from course_utils import chunked_loss, input_pipeline, profiling, shapes, speed, utilisation


# ---------------------------------------------------------------- published utilisation and data-sheet peaks


def test_every_published_run_names_its_source_hardware_and_precision():
    for run in utilisation.PUBLISHED_RUNS:
        assert 0 < run.utilisation < 1 and run.counts in {"model FLOPs", "hardware FLOPs"}
        assert "arXiv" in run.source and run.hardware and run.precision


def test_llama3_rates_over_the_dense_h100_peak_give_the_papers_mfu():
    h100 = next(peak for peak in utilisation.DATA_SHEET_PEAKS if peak.chip == "H100 SXM")
    for run in (run for run in utilisation.PUBLISHED_RUNS if run.model.startswith("Llama 3")):
        assert run.tflops_per_chip / h100.dense_tflops == pytest.approx(run.utilisation, abs=0.006)


def test_a_sparsity_peak_is_twice_the_dense_one():
    for peak in utilisation.DATA_SHEET_PEAKS:
        if peak.sparse_tflops is not None:
            assert peak.sparse_tflops == pytest.approx(2 * peak.dense_tflops, rel=1e-3)


def test_palm_reports_a_higher_hfu_than_mfu_for_the_same_run():
    palm = {run.counts: run.utilisation for run in utilisation.PUBLISHED_RUNS if run.model == "PaLM 540B"}
    assert palm["hardware FLOPs"] > palm["model FLOPs"]


# ---------------------------------------------------------------- MFU against HFU


def _stack_and_input():
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(3)]), torch.randn(4, 16, requires_grad=True)


def test_full_recomputation_counts_four_thirds_of_the_plain_steps_flops():
    stack, x = _stack_and_input()
    plain = utilisation.count_flops(lambda: stack(x).sum().backward())
    with set_checkpoint_early_stop(False):
        full = utilisation.count_flops(lambda: checkpoint(stack, x, use_reentrant=False).sum().backward())
    assert full * 3 == plain * 4


def test_count_flops_counts_a_matrix_product_as_two_flops_per_multiply_add():
    a, b = torch.randn(3, 5), torch.randn(5, 7)
    assert utilisation.count_flops(lambda: a @ b) == 2 * 3 * 5 * 7


def test_describe_recomputation_says_hfu_exceeds_mfu_only_when_work_was_recomputed():
    assert "HFU 1.333x its MFU" in utilisation.describe_recomputation(6.0, 8.0)
    assert "HFU equals MFU" in utilisation.describe_recomputation(6.0, 6.0)


# ---------------------------------------------------------------- shapes


def test_padded_to_multiple_gives_nanogpts_vocabulary():
    assert shapes.padded_to_multiple(50_257, 64) == 50_304
    assert shapes.padded_to_multiple(64, 64) == 64


def test_arithmetic_intensity_grows_with_the_rows_of_the_product():
    intensities = [shapes.arithmetic_intensity((rows, 256, 256)) for rows in (1, 8, 64, 512)]
    assert intensities == sorted(intensities) and intensities[0] < 1 < intensities[-1]
    assert shapes.arithmetic_intensity((2, 2, 2), bytes_per_element=1) == pytest.approx(16 / 12)


def test_time_matmuls_times_one_product_of_each_shape():
    timings = shapes.time_matmuls([(4, 8, 8), (8, 8, 8)], repeats=3, flops_per_call=1e4)
    assert set(timings) == {(4, 8, 8), (8, 8, 8)} and all(len(t.seconds) == 3 for t in timings.values())
    assert all(rate > 0 for rate in shapes.gflops((4, 8, 8), timings[(4, 8, 8)]))


def test_describe_shape_pair_compares_time_per_flop_with_both_outcomes():
    # The second shape does twice the work in twice the time: the same speed per FLOP.
    same = shapes.describe_shape_pair("a", (1, 1, 1), speed.Timing((1.0, 1.1, 0.9)),
                                      "b", (2, 1, 1), speed.Timing((2.0, 2.2, 1.8)))
    assert "no measurable" in same
    faster = shapes.describe_shape_pair("a", (1, 1, 1), speed.Timing((1.0, 1.0, 1.0)),
                                        "b", (2, 1, 1), speed.Timing((8.0, 8.0, 8.0)))
    assert faster.startswith("per FLOP, a is 4.00x faster than b")


# ---------------------------------------------------------------- foreach's operator calls


def test_foreach_on_cpu_still_runs_one_operator_per_tensor():
    parameters = [torch.randn(4, 4, requires_grad=True) for _ in range(5)]
    for parameter in parameters:
        parameter.grad = torch.ones_like(parameter)
    calls = {}
    for foreach in (False, True):
        optimizer = torch.optim.AdamW(parameters, lr=1e-3, foreach=foreach)
        optimizer.step()
        calls[foreach] = profiling.operator_calls(optimizer.step)
    assert calls[True]["aten::_foreach_mul_"] < calls[False]["aten::mul_"] <= calls[True]["aten::mul_"]
    sentence = profiling.describe_foreach_calls(calls[False], calls[True], "aten::mul_", "aten::_foreach_mul_")
    assert "loops over the tensors in C++" in sentence


def test_describe_foreach_calls_says_so_when_the_list_operator_makes_fewer_calls():
    sentence = profiling.describe_foreach_calls({"aten::mul_": 40}, {"aten::_foreach_mul_": 2}, "aten::mul_",
                                                "aten::_foreach_mul_")
    assert "multi-tensor kernel" in sentence and "C++" not in sentence


# ---------------------------------------------------------------- the profiler's schedule


def test_profile_on_schedule_keeps_only_the_active_steps_of_each_cycle():
    layer = torch.nn.Linear(8, 8)
    scheduled = profiling.profile_on_schedule(lambda: layer(torch.randn(2, 8)).sum().backward(),
                                              wait=1, warmup=1, active=2, repeat=2)
    assert scheduled.steps_run == 8 and scheduled.traces == ((2, 4), (2, 8))
    assert "Input Shapes" in scheduled.shapes_table and "[2, 8]" in scheduled.shapes_table


# ---------------------------------------------------------------- the input pipeline


def test_with_read_latency_returns_the_same_items_later():
    import time

    slow = input_pipeline.WithReadLatency([10, 20, 30], seconds=0.01)
    start = time.perf_counter()
    items = [slow[i] for i in range(len(slow))]
    assert items == [10, 20, 30] and time.perf_counter() - start >= 0.03


def test_time_epochs_records_each_epochs_wait_and_first_batch():
    loader = torch.utils.data.DataLoader(input_pipeline.WithReadLatency(list(range(6)), seconds=0.005), batch_size=3)
    seen = []
    times = input_pipeline.time_epochs(loader, seen.append, epochs=2)
    assert len(seen) == 4 and len(times.epochs) == len(times.waits) == len(times.first_batch_waits) == 2
    assert all(first >= 0.015 for first in times.first_batch_waits)  # three items of 5 ms before the first batch
    assert all(wait <= epoch for wait, epoch in zip(times.waits, times.epochs)) and times.total == sum(times.epochs)


def test_describe_extra_wait_explains_each_outcome_of_the_epochs_verdict():
    noisy = input_pipeline.describe_extra_wait([0.040, 0.045, 0.050], [-0.050, 0.030, 0.020], epochs_differ=False)
    assert "too noisy a ruler" in noisy
    taken_back = input_pipeline.describe_extra_wait([0.034, 0.070, 0.072], [-0.067, -0.033, -0.024], epochs_differ=False)
    assert "ran faster in the on-the-fly loop, taking back 47%" in taken_back and "from -33.0 to +48.0" in taken_back
    drifting = input_pipeline.describe_extra_wait([0.040, 0.045, 0.050], [0.001, 0.002, 0.003], epochs_differ=False)
    assert "not the rounds' pairs" in drifting
    shown = input_pipeline.describe_extra_wait([0.040, 0.045, 0.050], [0.001, -0.002, 0.003], epochs_differ=True)
    assert "the epochs show the difference too" in shown


# ---------------------------------------------------------------- the chunked loss


def test_chunked_cross_entropy_equals_the_plain_loss_values_and_gradients():
    torch.manual_seed(0)
    hidden = torch.randn(37, 8, requires_grad=True)
    weight = torch.randn(50, 8, requires_grad=True)
    labels = torch.randint(0, 50, (37,))
    labels[:4] = chunked_loss.IGNORE_INDEX
    plain = F.cross_entropy(hidden @ weight.T, labels)
    plain_grads = torch.autograd.grad(plain, (hidden, weight))
    chunked = chunked_loss.chunked_cross_entropy(hidden, weight, labels, chunk_size=10)
    chunked_grads = torch.autograd.grad(chunked, (hidden, weight))
    assert torch.allclose(plain, chunked, atol=1e-6)
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(plain_grads, chunked_grads))


def _tiny_llama(vocab=300):
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32, use_cache=False)
    return LlamaForCausalLM(config)


def test_chunked_loss_lm_gives_the_models_own_loss():
    model = _tiny_llama()
    ids = torch.randint(0, 300, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        own = model(input_ids=ids, labels=ids).loss
        chunked = chunked_loss.ChunkedLossLM(model, chunk_size=5)(input_ids=ids, labels=ids).loss
    assert torch.allclose(own, chunked, atol=1e-6)


def test_chunked_loss_holds_less_at_its_peak_when_the_logits_dominate():
    from course_utils import memory

    model = _tiny_llama(vocab=4000)
    ids = torch.randint(0, 4000, (2, 32), generator=torch.Generator().manual_seed(0))
    batch = {"input_ids": ids, "labels": ids}
    plain = memory.measure_allocator_rise(model, torch.optim.SGD(model.parameters(), lr=0.0), batch)
    wrapped = chunked_loss.ChunkedLossLM(model, chunk_size=8)
    chunked = memory.measure_allocator_rise(wrapped, torch.optim.SGD(wrapped.parameters(), lr=0.0), batch)
    logits_bytes = ids.numel() * 4000 * 4
    assert plain.rise - chunked.rise > logits_bytes


def test_describe_first_batch_waits_names_the_start_up_only_when_every_round_shows_it():
    shown = input_pipeline.describe_first_batch_waits({"restarted": [0.06, 0.05], "kept": [0.03, 0.04]}, "restarted", "kept")
    assert "its start-up, paid at every epoch" in shown
    hidden = input_pipeline.describe_first_batch_waits({"restarted": [0.06, 0.03], "kept": [0.04, 0.035]}, "restarted",
                                                       "kept")
    assert "does not show the start-up" in hidden
