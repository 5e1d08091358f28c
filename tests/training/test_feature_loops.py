"""course_utils.feature_loops: accumulation reproduces the big batch, clipping acts once per update, a resumed run ends where an uninterrupted one does."""

import os

import pytest
import torch
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration, set_seed

from course_utils import data, loop_diff, loops, models, optimizers, parallel, schedules, speed
from course_utils.feature_loops import train_accumulating, train_clipping, train_resumable

EXAMPLES = 64


def dropout_free_classifier():
    """The course checkpoint with every dropout at 0, so two runs differ only by how they batch."""
    return parallel.without_dropout(models.load_pretrained_classifier())


def training_objects(batch_size, optimizer_steps, seed=0, model=None):
    set_seed(seed)
    model = model if model is not None else dropout_free_classifier()
    train_dataloader = data.make_dataloader("train", batch_size=batch_size, seed=seed, limit=EXAMPLES)
    optimizer = optimizers.make_optimizer("adamw", model.parameters(), lr=1e-3)
    lr_scheduler = schedules.linear_schedule_with_warmup(optimizer, optimizer_steps)
    return model, optimizer, train_dataloader, lr_scheduler


def parameters_of(model):
    return [parameter.detach().clone() for parameter in model.parameters()]


def largest_gap(first, second):
    return max((a - b).abs().max().item() for a, b in zip(first, second))


def count_steps(optimizer):
    counter = {"steps": 0}
    optimizer.register_step_post_hook(lambda *args: counter.__setitem__("steps", counter["steps"] + 1))
    return counter


def test_four_micro_batches_of_8_give_the_parameters_of_one_batch_of_32():
    model, optimizer, loader, scheduler = training_objects(batch_size=32, optimizer_steps=2)
    train_accumulating(model, optimizer, scheduler, loader, 1, Accelerator())
    big_batch = parameters_of(model)

    model, optimizer, loader, scheduler = training_objects(batch_size=8, optimizer_steps=2)
    steps = count_steps(optimizer)
    losses = train_accumulating(model, optimizer, scheduler, loader, 1, Accelerator(gradient_accumulation_steps=4))
    assert steps["steps"] == 2 and len(losses) == 8
    assert largest_gap(parameters_of(model), big_batch) < 1e-5


def test_without_accumulation_the_micro_batches_take_a_step_each_and_end_elsewhere():
    model, optimizer, loader, scheduler = training_objects(batch_size=32, optimizer_steps=2)
    train_accumulating(model, optimizer, scheduler, loader, 1, Accelerator())
    big_batch = parameters_of(model)
    model, optimizer, loader, scheduler = training_objects(batch_size=8, optimizer_steps=8)
    steps = count_steps(optimizer)
    train_accumulating(model, optimizer, scheduler, loader, 1, Accelerator())
    assert steps["steps"] == 8
    assert largest_gap(parameters_of(model), big_batch) > 1e-3


def test_clipping_reports_one_norm_per_update_and_the_step_sees_a_clipped_gradient():
    model, optimizer, loader, scheduler = training_objects(batch_size=8, optimizer_steps=2)
    norms_at_step = []
    optimizer.register_step_pre_hook(
        lambda *args: norms_at_step.append(torch.nn.utils.get_total_norm([p.grad for p in model.parameters()]).item())
    )
    losses, grad_norms = train_clipping(
        model, optimizer, scheduler, loader, 1, Accelerator(gradient_accumulation_steps=4), max_grad_norm=0.05
    )
    assert len(losses) == 8 and len(grad_norms) == 2 == len(norms_at_step)
    assert all(norm > 0.05 for norm in grad_norms), "the test needs gradients larger than the clip"
    assert all(norm == pytest.approx(0.05, rel=1e-4) for norm in norms_at_step)


def test_clipping_at_a_large_norm_changes_nothing():
    model, optimizer, loader, scheduler = training_objects(batch_size=8, optimizer_steps=2)
    train_accumulating(model, optimizer, scheduler, loader, 1, Accelerator(gradient_accumulation_steps=4))
    unclipped = parameters_of(model)
    model, optimizer, loader, scheduler = training_objects(batch_size=8, optimizer_steps=2)
    train_clipping(model, optimizer, scheduler, loader, 1, Accelerator(gradient_accumulation_steps=4), max_grad_norm=1e6)
    assert largest_gap(parameters_of(model), unclipped) == 0.0


def resumable_run(tmp_path, name, **options):
    """Two epochs of 4 optimizer steps (8 batches of 8, 2 per step), dropout on, from seed 0."""
    set_seed(0)
    model = models.load_pretrained_classifier()
    model, optimizer, loader, scheduler = training_objects(batch_size=8, optimizer_steps=8, model=model)
    accelerator = Accelerator(
        gradient_accumulation_steps=2, dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True)
    )
    losses = train_resumable(model, optimizer, scheduler, loader, 2, accelerator, output_dir=tmp_path / name, **options)
    return model, losses


@pytest.mark.parametrize("checkpoint_step", [2, 5], ids=["inside the first epoch", "inside the second epoch"])
def test_an_interrupted_training_resumed_from_its_saved_state_ends_with_the_same_parameters(tmp_path, checkpoint_step):
    uninterrupted, all_losses = resumable_run(tmp_path, "whole", checkpointing_steps=100)
    _, first_losses = resumable_run(tmp_path, "first", checkpointing_steps=checkpoint_step, stop_after_steps=checkpoint_step + 1)
    checkpoint = tmp_path / "first" / f"step_{checkpoint_step}"
    assert {"model.safetensors", "optimizer.bin", "scheduler.bin", "random_states_0.pkl"} <= set(os.listdir(checkpoint))
    resumed, resumed_losses = resumable_run(tmp_path, "resumed", checkpointing_steps=100, resume_from_checkpoint=checkpoint)
    assert largest_gap(parameters_of(resumed), parameters_of(uninterrupted)) == 0.0
    assert resumed_losses == all_losses[2 * checkpoint_step:]
    assert first_losses == all_losses[: 2 * (checkpoint_step + 1)]


def test_resuming_without_the_saved_state_ends_elsewhere(tmp_path):
    uninterrupted, _ = resumable_run(tmp_path, "whole", checkpointing_steps=100)
    resumable_run(tmp_path, "first", checkpointing_steps=2, stop_after_steps=3)
    # A fresh start that only skips the batches already seen: the weights, Adam's moments and the schedule start over.
    (tmp_path / "empty").mkdir()
    set_seed(0)
    model, optimizer, loader, scheduler = training_objects(batch_size=8, optimizer_steps=8, model=models.load_pretrained_classifier())
    accelerator = Accelerator(gradient_accumulation_steps=2, dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True))
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    for batch in accelerator.skip_first_batches(loader, 4):
        with accelerator.accumulate(model):
            accelerator.backward(model(**batch).loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
    assert largest_gap(parameters_of(model), parameters_of(uninterrupted)) > 1e-4


def test_time_optimizer_step_returns_one_duration_per_repeat():
    model, optimizer, loader, _ = training_objects(batch_size=8, optimizer_steps=2)
    batches = [next(iter(loader))]
    seconds = speed.time_optimizer_step(model, optimizer, batches, repeats=3, warmup=1)
    assert len(seconds) == 3 and all(s > 0 for s in seconds)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"model": "bert"}, "model must be a torch.nn.Module"),
        ({"micro_batches": []}, "micro_batches must be a non-empty list"),
        ({"repeats": 0}, "repeats must be a positive int"),
        ({"warmup": -1}, "warmup must be a non-negative int"),
    ],
)
def test_time_optimizer_step_names_a_bad_argument(change, message):
    model, optimizer, loader, _ = training_objects(batch_size=8, optimizer_steps=2)
    arguments = {"model": model, "optimizer": optimizer, "micro_batches": [next(iter(loader))], **change}
    with pytest.raises((TypeError, ValueError), match=message):
        speed.time_optimizer_step(**arguments)


def test_each_feature_loop_is_lesson_1s_accelerate_loop_plus_its_own_lines_only():
    signature = "(model, optimizer, lr_scheduler, train_dataloader, num_epochs, accelerator):"
    removed, added = loop_diff.loop_changes(loops.train_accelerate, train_accumulating)
    assert removed == ["def train_accelerate" + signature]
    assert added == ["def train_accumulating" + signature, "with accelerator.accumulate(model):"]
    removed, added = loop_diff.loop_changes(train_accumulating, train_clipping)
    assert added == [
        "def train_clipping(model, optimizer, lr_scheduler, train_dataloader, num_epochs, accelerator, max_grad_norm):",
        "grad_norms = []",
        "if accelerator.sync_gradients:",
        "grad_norm = accelerator.clip_grad_norm_(model.parameters(), max_grad_norm)",
        "grad_norms.append(grad_norm.item())",
        "return losses, grad_norms",
    ]
    assert removed == [
        "def train_accumulating(model, optimizer, lr_scheduler, train_dataloader, num_epochs, accelerator):",
        "return losses",
    ]
    removed, added = loop_diff.loop_changes(train_accumulating, train_resumable)
    assert "accelerator.load_state(resume_from_checkpoint)" in added
    assert "accelerator.save_state(Path(output_dir) / f\"step_{completed_steps}\")" in added
    assert removed == [
        "def train_accumulating(model, optimizer, lr_scheduler, train_dataloader, num_epochs, accelerator):",
        "for epoch in range(num_epochs):",
        "for step, batch in enumerate(train_dataloader):",
    ]
