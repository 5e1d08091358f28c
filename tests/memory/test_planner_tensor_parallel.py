"""The planner under tensor parallelism (lesson 9): estimate_training_memory(layout=Layout(..., tp=...)) against real gloo runs."""

import functools
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

from course_utils import launcher, memory, sharding
from course_utils.layouts import Layout, apply_layout
from course_utils.memory import per_process
from course_utils.optimizers import make_optimizer

# It launches worker processes: make test runs the `forks` tests in a pytest process of their own (the Makefile says why).
pytestmark = pytest.mark.forks

BATCH_SIZE, SEQ_LEN = 2, 16


@pytest.fixture(autouse=True)
def launchable(monkeypatch):
    monkeypatch.delitem(sys.modules, "bitsandbytes", raising=False)


def llama_config(layers=3):
    """A Llama with grouped-query attention (4 heads, 2 of keys and values), small enough to run in a test."""
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=layers,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)


def distilbert_config():
    """The course's DistilBERT shape, small: 2 blocks of 4 heads."""
    from transformers import DistilBertConfig

    return DistilBertConfig(vocab_size=120, dim=32, hidden_dim=64, n_layers=2, n_heads=4, max_position_embeddings=64)


ARCHITECTURES = {"llama": (AutoModelForCausalLM, llama_config()), "deep llama": (AutoModelForCausalLM, llama_config(7)),
                 "distilbert": (AutoModelForSequenceClassification, distilbert_config())}
"""The models planned and measured, as (transformers Auto class, config): what sharding.measure_laid_out_step builds."""


def build(model_name):
    torch.manual_seed(0)
    model_class, config = ARCHITECTURES[model_name]
    return model_class.from_config(config, dtype=torch.float32)


def tiny_llama():
    return build("llama")


def small_distilbert():
    return build("distilbert")


MODELS = {name: functools.partial(build, name) for name in ARCHITECTURES}


def measured(model_name, layout, *options):
    """Each process's step, measured in the layout's launched processes (sharding.measure_laid_out_step)."""
    return launcher.launch(sharding.measure_laid_out_step, (*ARCHITECTURES[model_name], layout, BATCH_SIZE, SEQ_LEN,
                                                             *options),
                           num_processes=layout.world_size, quiet=True, oversubscribe=True, timeout=300)


def assert_phase_peaks_match(plan, real, model_name, tp=2):
    """Every phase's peak as planned, or a real one above it by at most one collective's buffers of the hidden states.

    A real process's forward pass or optimizer step has been seen to peak
    above the plan, never below: by 6,144 bytes with sequence parallelism on
    the tiny Llama (one all-gather's output, batch x seq x hidden fp32 values,
    and this process's 1/tp shard of it), by 128 bytes once in the optimizer
    step, and once without sequence parallelism (under load, size not
    recorded), in about 1 of 8 processes. gloo runs each collective on its own
    thread, with its own buffers, whose lifetimes relative to the main thread
    vary from run to run; the fake group (every collective done at once) gives
    the plan the order in which they are freed first. The step's own peak is
    checked exact elsewhere (``plans == real``).
    """
    config = ARCHITECTURES[model_name][1]
    gathered = BATCH_SIZE * SEQ_LEN * config.hidden_size * 4
    allowance = gathered + gathered // tp
    for phase, planned in plan.peak_by_phase.items():
        above = real.peak_by_phase[phase] - planned
        assert 0 <= above <= allowance, f"{phase}: the real peak is {above} bytes above the plan (allowed {allowance})"



@pytest.mark.parametrize("model_name, sequence_parallel", [
    ("llama", False),
    ("llama", True),
    ("deep llama", True),  # 7 blocks: planned from the probes' copies, extrapolated
    ("distilbert", False),
])
def test_plan_of_every_tensor_parallel_process_equals_its_real_run_to_the_byte(model_name, sequence_parallel):
    layout = Layout("none", 2, tp=2, sequence_parallel=sequence_parallel)
    plans = [memory.estimate_training_memory(MODELS[model_name](), "adamw", BATCH_SIZE, SEQ_LEN, layout=layout,
                                             rank=rank) for rank in range(2)]
    real = measured(model_name, layout)
    assert plans == real
    for plan, process in zip(plans, real):
        assert_phase_peaks_match(plan, process, model_name)


@pytest.mark.parametrize("mixed_precision, accumulation", [("bf16", 1), ("no", 2)])
def test_plan_under_autocast_or_accumulating_equals_the_real_sequence_parallel_run(mixed_precision, accumulation):
    layout = Layout("none", 2, tp=2, sequence_parallel=True)
    plan = memory.estimate_training_memory(tiny_llama(), "adamw", BATCH_SIZE, SEQ_LEN, layout=layout,
                                           mixed_precision=mixed_precision, gradient_accumulation_steps=accumulation)
    real = measured("llama", layout, "adamw", mixed_precision, accumulation)
    assert plan == real[0]
    assert_phase_peaks_match(plan, real[0], "llama")


def test_tensor_parallelism_divides_the_split_layers_and_sequence_parallelism_the_activations():
    model = tiny_llama()
    one = memory.estimate_training_memory(model, "adamw", BATCH_SIZE, SEQ_LEN)
    tp = memory.estimate_training_memory(model, "adamw", BATCH_SIZE, SEQ_LEN, layout=Layout("none", 2, tp=2))
    sp = memory.estimate_training_memory(model, "adamw", BATCH_SIZE, SEQ_LEN,
                                         layout=Layout("none", 2, tp=2, sequence_parallel=True))
    blocks = sum(p.numel() for name, p in model.named_parameters() if ".layers." in name and "norm" not in name) * 4
    # The split layers' weights are halved; embeddings, norms and head stay whole in every process.
    assert tp.weights == one.weights - blocks // 2
    assert sp.weights == tp.weights and sp.gradients == tp.gradients
    # Sequence parallelism divides what the norms and the residual stream keep; the split layers' inputs stay whole.
    assert sp.activations < tp.activations < one.activations


def test_without_its_branch_the_planner_would_plan_one_process():
    """The tensor-parallel branch is what divides the weights: one process's copy holds them all."""
    model, setup = tiny_llama(), memory.TrainingSetup("adamw", BATCH_SIZE, SEQ_LEN)
    split, _ = per_process.tensor_parallel_probe(model, setup, None, Layout("none", 2, tp=2))
    whole = memory.plan(model, setup)
    assert split.weights < whole.weights and split.optimizer_state < whole.optimizer_state


@pytest.mark.parametrize("keywords, error, words", [
    (dict(layout=Layout("none", 2, tp=2), world_size=2), ValueError, "not both"),
    (dict(layout=Layout("none", 2, tp=2), sharding="zero3"), ValueError, "not both"),
    (dict(layout="tp=2"), TypeError, "layout"),
    (dict(layout=Layout("none", 2, tp=2), rank=2), ValueError, "rank"),
])
def test_bad_layouts_are_named(keywords, error, words):
    with pytest.raises(error, match=words):
        memory.estimate_training_memory(tiny_llama(), "adamw", BATCH_SIZE, SEQ_LEN, **keywords)


def test_a_model_with_no_tensor_parallel_plan_is_refused_by_name():
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=32))
    with pytest.raises(memory.PlannerRefused, match="GPT2LMHeadModel has no tensor-parallel plan"):
        memory.estimate_training_memory(model, "adamw", BATCH_SIZE, SEQ_LEN, layout=Layout("none", 2, tp=2))
    with pytest.raises(memory.PlannerRefused, match="GPT2LMHeadModel has no tensor-parallel plan"):
        memory.estimate_training_memory(model, "adamw", BATCH_SIZE, SEQ_LEN, layout=Layout("zero3", 4, tp=2))
    with pytest.raises(memory.PlannerRefused, match="DistilBERT plan splits no sequence"):
        memory.estimate_training_memory(small_distilbert(), "adamw", BATCH_SIZE, SEQ_LEN,
                                        layout=Layout("none", 2, tp=2, sequence_parallel=True))
    with pytest.raises(memory.PlannerRefused, match="'zero2' or 'zero3'"):
        memory.estimate_training_memory(tiny_llama(), "adamw", BATCH_SIZE, SEQ_LEN, layout=Layout("ddp", 4, tp=2))


def loss_and_gradients(model):
    """The loss of one forward pass of ``model`` and every gradient, whole (DTensors gathered); no dropout."""
    from torch.distributed.tensor import DTensor

    model.eval()  # dropout draws differently in each process
    batch = memory.training_batch(model, BATCH_SIZE, SEQ_LEN, torch.Generator().manual_seed(0))
    loss = model(**batch).loss
    loss.backward()
    return loss.item(), {name: (p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad)
                         for name, p in model.named_parameters()}


def laid_out_loss_and_gradients(model_name, layout):
    """In a launched process: :func:`loss_and_gradients` of the model laid out by layouts.apply_layout."""
    with sharding.gloo_group():
        return loss_and_gradients(apply_layout(MODELS[model_name](), layout))


@pytest.mark.parametrize("model_name, sequence_parallel", [("llama", False), ("llama", True), ("distilbert", False)])
def test_the_layout_trains_the_model_one_process_trains(model_name, sequence_parallel):
    """What the planner plans is a true split: the same loss and gradients as one process."""
    one_loss, one_gradients = loss_and_gradients(MODELS[model_name]())
    layout = Layout("none", 2, tp=2, sequence_parallel=sequence_parallel)
    for loss, gradients in launcher.launch(laid_out_loss_and_gradients, (model_name, layout), num_processes=2, quiet=True,
                                           oversubscribe=True, timeout=300):
        assert loss == pytest.approx(one_loss, abs=1e-6)
        assert gradients.keys() == one_gradients.keys()
        for name, gradient in gradients.items():
            torch.testing.assert_close(gradient, one_gradients[name], atol=1e-6, rtol=1e-5, msg=name)


def measured_fsdp_step(model_name, layout):
    """In a launched process: the model laid out on a 2-D mesh (FSDP2 over "dp" of the split model), one step
    measured with FSDPMemTracker; and the bytes of the largest unit FSDP gathers there."""
    from torch.distributed.tensor import DTensor

    with sharding.gloo_group():
        model = MODELS[model_name]()
        blocks = list(model.model.layers)
        model = apply_layout(model, layout, blocks)
        in_blocks = {id(p) for block in blocks for p in block.parameters()}
        units = [list(block.parameters()) for block in blocks]
        units.append([p for p in model.parameters() if id(p) not in in_blocks])  # the root's
        # A unit gathered over the data-parallel processes: this process's tensor-parallel share of it.
        largest_unit = max(sum(p.to_local().numel() * layout.dp * p.element_size() if isinstance(p, DTensor)
                               else p.numel() * p.element_size() for p in unit) for unit in units)
        optimizer = make_optimizer("adamw", [p for p in model.parameters() if p.requires_grad])
        # The processes of one tensor-parallel group train on one batch; each data-parallel group on its own.
        dp_rank = torch.distributed.get_rank() // layout.tp
        batch = memory.training_batch(model, BATCH_SIZE, SEQ_LEN, torch.Generator().manual_seed(dp_rank))
        step = memory.TrainingSetup("adamw", BATCH_SIZE, SEQ_LEN)
        return memory.measure_fsdp_step(model, optimizer, batch, step), largest_unit


@pytest.mark.parametrize("strategy, sequence_parallel", [("zero3", False), ("zero2", True)])
def test_plan_of_fsdp_over_tensor_parallel_processes_equals_its_real_four_process_run(strategy, sequence_parallel):
    """A 2 x 2 mesh: FSDP2 shards the split blocks over the data-parallel dimension (as torchtitan lays out 2-D).

    Every part to the byte; a real peak can hold one gathered unit more than planned (as under FSDP alone,
    ``sharding.agrees_with_plan``): when gloo's thread finishes an all-gather early, its output is alive at the
    peak, which the fake group, whose collectives return at once, never has.
    """
    layout = Layout(strategy, 4, tp=2, sequence_parallel=sequence_parallel)
    plans = [memory.estimate_training_memory(tiny_llama(), "adamw", BATCH_SIZE, SEQ_LEN, layout=layout, rank=rank)
             for rank in range(4)]
    real = launcher.launch(measured_fsdp_step, ("llama", layout), num_processes=4, quiet=True, oversubscribe=True,
                           timeout=300)
    for plan, (process, largest_unit) in zip(plans, real):
        assert sharding.agrees_with_plan(plan, process, largest_unit), (plan, process, largest_unit)
