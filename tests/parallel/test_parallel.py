"""Data parallelism on CPU processes (lesson 6): sharding, evidence, equivalence, who all-reduces the gradients.

The launch machinery itself is tested in test_launcher.py.
"""

import pytest
import torch
from accelerate import Accelerator, DataLoaderConfiguration
from accelerate.utils import set_seed
from torch.utils.data import DataLoader
from transformers import DistilBertConfig, DistilBertForSequenceClassification, get_linear_schedule_with_warmup

from course_utils import parallel
from course_utils.parallel import ProcessReport

# It launches worker processes: make test runs the `forks` tests in a pytest process of their own (the Makefile says why).
pytestmark = pytest.mark.forks

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


def train_tiny(batch_size, cpu=True, dropout=False, plain_backward=False):
    """Run in each launched worker: train the tiny model; return (its ProcessReport, its parameters)."""
    accelerator = Accelerator(cpu=cpu)
    set_seed(0)
    model = tiny_classifier()
    if not dropout:
        parallel.without_dropout(model)
    dataloader = random_pairs(batch_size)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    # Ticks counted in batches before prepare: 20 on 2 processes x 8, 10 on 1 x 16, so
    # the 10% warm-up is 2 ticks = 1 step in both.
    num_training_steps = EPOCHS * len(dataloader)
    lr_scheduler = get_linear_schedule_with_warmup(optimizer, int(0.1 * num_training_steps), num_training_steps)
    model, optimizer, dataloader, lr_scheduler = accelerator.prepare(model, optimizer, dataloader, lr_scheduler)
    losses = []
    for epoch in range(EPOCHS):
        for batch in dataloader:
            optimizer.zero_grad()
            loss = model(**batch).loss
            loss.backward() if plain_backward else accelerator.backward(loss)
            optimizer.step()
            lr_scheduler.step()
            losses.append(loss.item())
    unwrapped = accelerator.unwrap_model(model)
    report = parallel.report_process(accelerator, unwrapped, len(losses) // EPOCHS, losses[-1])
    return report, parallel.parameters_of(unwrapped)


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


def test_adams_eps_keeps_the_steps_of_noise_only_parameters_far_below_lr():
    # Adam's step in units of lr is m_hat / (sqrt(v_hat) + eps). Where the gradient is rounding noise,
    # sqrt(v_hat) is far below eps and the step is tiny; where the gradient is real, it is about 1.
    torch.manual_seed(0)
    model = parallel.without_dropout(tiny_classifier())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(4):
        optimizer.zero_grad()
        inputs = torch.randint(0, 50, (8, 10))
        model(input_ids=inputs, labels=torch.randint(0, 2, (8,))).loss.backward()
        optimizer.step()
    beta1, beta2 = optimizer.param_groups[0]["betas"]
    steps = {}
    for name, parameter in model.named_parameters():
        state = optimizer.state[parameter]
        t = state["step"].item()
        m_hat, v_hat = state["exp_avg"] / (1 - beta1**t), state["exp_avg_sq"] / (1 - beta2**t)
        steps[name] = (m_hat / (v_hat.sqrt() + 1e-8)).abs().median().item()
    key_bias = [step for name, step in steps.items() if "k_lin.bias" in name]
    query_bias = [step for name, step in steps.items() if "q_lin.bias" in name]
    assert key_bias and max(key_bias) < 0.05 and min(query_bias) > 0.3


# ---------------------------------------------------------------- who averages the gradients


def gradient_checksums_after_plain_backward():
    accelerator = Accelerator(cpu=True)
    batch = next(iter(accelerator.prepare(random_pairs(8))))  # this process's own examples
    checksums = []
    for prepared in (True, False):
        torch.manual_seed(0)
        model = parallel.without_dropout(tiny_classifier())
        if prepared:
            model = accelerator.prepare(model)
        model(**batch).loss.backward()
        checksums.append(parallel.gradient_checksum(model))
    return checksums


def test_a_plain_loss_backward_through_the_prepared_model_averages_the_gradients():
    (prepared_0, bare_0), (prepared_1, bare_1) = parallel.launch(gradient_checksums_after_plain_backward, quiet=True)
    assert prepared_0 == prepared_1  # DDP's hooks all-reduced them
    assert bare_0 != bare_1  # without the wrapper, each process keeps its own


def test_training_with_plain_loss_backward_keeps_the_copies_identical_and_matches_one_process():
    two = parallel.launch(train_tiny, args=(8, True, False, True), quiet=True)
    one = parallel.launch(train_tiny, args=(16,), num_processes=1, quiet=True)
    assert parallel.max_parameter_difference(two[0][1], two[1][1]) == 0.0
    assert parallel.max_parameter_difference(two[0][1], one[0][1]) < 1e-5


def batches_with_split_batches():
    ignored = Accelerator(cpu=True, split_batches=True)
    configured = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(split_batches=True))
    return [
        (accelerator.split_batches, [batch.tolist() for batch in accelerator.prepare(DataLoader(list(range(8)), batch_size=4))])
        for accelerator in (ignored, configured)
    ]


def test_the_split_batches_keyword_is_ignored_and_the_dataloader_configuration_is_not():
    results = parallel.launch(batches_with_split_batches, quiet=True)
    assert [result[0] for result in results] == [(False, [[0, 1, 2, 3]]), (False, [[4, 5, 6, 7]])]
    assert [result[1] for result in results] == [(True, [[0, 1], [4, 5]]), (True, [[2, 3], [6, 7]])]
    assert [[batch for batch in shard] for shard in parallel.shards_of_each_process(8, 4, 2, split_batches=True)] == [
        result[1][1] for result in results
    ]


def count_allreduces(accumulation_steps):
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=accumulation_steps)
    counts = []
    for use_accumulate in (True, False):
        torch.manual_seed(0)
        model = tiny_classifier()
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        model, optimizer, dataloader = accelerator.prepare(model, optimizer, random_pairs(8))
        counter = parallel.AllReduceCounter(model)
        for step, batch in enumerate(dataloader):
            if use_accumulate:
                with accelerator.accumulate(model):
                    accelerator.backward(model(**batch).loss)
                    optimizer.step()
                    optimizer.zero_grad()
            else:
                accelerator.backward(model(**batch).loss)
        counts.append((step + 1, counter.calls))
    return counts


def test_accumulate_all_reduces_once_per_optimizer_step_and_every_backward_otherwise():
    # 80 examples in batches of 8 on 2 processes: 5 micro-batches each; with k = 5, one optimizer step.
    results = parallel.launch(count_allreduces, args=(5,), quiet=True)
    for (micro_batches, with_accumulate), (_, without) in results:
        assert micro_batches == 5
        assert with_accumulate * micro_batches == without  # one bucket per backward: 1 against 5
        assert with_accumulate >= 1


def test_the_all_reduce_counter_refuses_a_model_that_was_not_wrapped():
    with pytest.raises(TypeError, match="DistributedDataParallel"):
        parallel.AllReduceCounter(torch.nn.Linear(2, 2))


# ---------------------------------------------------------------- training on two processes for real


def test_without_cpu_true_two_workers_silently_train_alone():
    results = parallel.launch(train_tiny, args=(8, False), num_processes=2)
    reports = [report for report, _ in results]
    assert [(r.num_processes, r.distributed_type, r.num_batches) for r in reports] == [(1, "NO", 10)] * 2
    assert parallel.diagnose_launch(reports, 2).startswith("Silent failure")


def test_two_processes_with_batch_b_end_where_one_process_with_batch_2b_ends():
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


def test_dropout_is_why_the_comparison_needs_it_off():
    two = parallel.launch(train_tiny, args=(8, True, True), num_processes=2)
    one = parallel.launch(train_tiny, args=(16, True, True), num_processes=1)
    # Each process draws its own dropout masks: the runs drift apart.
    assert parallel.max_parameter_difference(two[0][1], one[0][1]) > 1e-3


# ---------------------------------------------------------------- figures


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


def test_the_flow_figure_puts_the_all_reduce_in_the_backward_pass_not_in_accelerator_backward():
    import matplotlib.pyplot as plt

    from course_utils.plots import plot_data_parallel_flow

    figure = plot_data_parallel_flow(2)
    texts = " ".join(text.get_text() for text in figure.axes[0].texts)
    assert "all-reduce during the backward pass" in texts and "accelerator.backward" not in texts
    plt.close(figure)


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


def test_the_wall_time_legend_says_one_run_when_there_is_one_run_and_median_when_there_are_several():
    import matplotlib.pyplot as plt

    from course_utils.plots import plot_wall_times

    for seconds, wanted, unwanted in [({"1 process": [3.0], "2 processes": [4.0]}, "one run", "median"),
                                      ({"1 process": [3.0, 1.0, 2.0], "2 processes": [4.0]}, "median", "one run")]:
        figure = plot_wall_times(seconds)
        legend = [text.get_text() for text in figure.axes[0].get_legend().get_texts()]
        assert any(wanted in label for label in legend) and not any(unwanted in label for label in legend), legend
        plt.close(figure)


def test_a_larger_batch_at_the_same_learning_rate_trains_a_different_model_and_the_sweep_keeps_each_seed():
    from course_utils import parallel
    from course_utils.plots import plot_learning_rate_sweep

    losses = parallel.learning_rate_sweep([16, 128], [3e-3], seeds=[0, 1])
    assert set(losses) == {(16, 3e-3), (128, 3e-3)} and all(len(v) == 2 for v in losses.values())
    assert all(0 < loss < 1 for values in losses.values() for loss in values)  # nats; chance is ln 2 = 0.69
    assert parallel.train_small_classifier(16, 3e-3, seed=0) == losses[16, 3e-3][0]  # one seed, one result
    figure = plot_learning_rate_sweep(losses)
    ax = figure.axes[0]
    assert ax.get_xscale() == "log" and "nats" in ax.get_ylabel() and ax.get_title()
    with pytest.raises(ValueError, match="lr"):
        parallel.train_small_classifier(16, float("nan"), seed=0)
    with pytest.raises(ValueError, match="batch_size"):
        parallel.train_small_classifier(0, 1e-3, seed=0)


# ---------------------------------------------------------------- an undivided loss under accumulation


def test_an_undivided_loss_makes_sgds_first_step_k_times_larger_and_barely_changes_adamws():
    from course_utils import data

    batches = list(data.make_dataloader("train", batch_size=4, seed=0, limit=16))  # 4 micro-batches: one step
    sgd = [parallel.update_after_accumulation(torch.optim.SGD, 1e-2, batches, 4, divide) for divide in (True, False)]
    adamw = [parallel.update_after_accumulation(torch.optim.AdamW, 1e-3, batches, 4, divide) for divide in (True, False)]
    # The gradient, and so SGD's step, is 4x (to float32 rounding of the parameters the change is read from).
    assert ((sgd[1] - 4 * sgd[0]).norm() / (4 * sgd[0]).norm()).item() < 1e-3
    assert ((adamw[1] - adamw[0]).norm() / adamw[0].norm()).item() < 0.05  # Adam's step is scale-invariant, but eps
    assert adamw[0].norm() > 0


def _parameter_checksum_after_prepare_from_a_seed_of_each_rank():
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(accelerator.process_index)  # a different seed in each process
    model = torch.nn.Linear(4, 3)
    bare = sum(p.double().sum().item() for p in model.parameters())
    model = accelerator.prepare(model)
    return bare, sum(p.double().sum().item() for p in model.parameters())


def test_ddp_makes_the_copies_identical_whatever_each_process_seeded():
    # train.py's comment: the seed is not what makes the copies equal; DDP broadcasts rank 0's parameters.
    (bare_0, prepared_0), (bare_1, prepared_1) = parallel.launch(
        _parameter_checksum_after_prepare_from_a_seed_of_each_rank, quiet=True)
    assert bare_0 != bare_1
    assert prepared_0 == prepared_1 == bare_0
