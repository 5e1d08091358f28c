"""Training loops: the plain PyTorch loop and the same loop with Hugging Face Accelerate.

Introduced in lesson 1. The two training functions are deliberately twins: the
Accelerate loop is the plain loop plus a handful of changes, and every changed
line carries a marker comment:

- ``# [plain]`` on a line that only the plain loop has (Accelerate removes or replaces it),
- ``# [accelerate]`` on a line that only the Accelerate loop has.

A marker may be followed by a short reason. Drop the marked lines from each and
the two functions are identical; a test
holds them to that, and :func:`loop_diff_html` renders the difference for the lesson.
"""

from __future__ import annotations

import difflib
import inspect
import math

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader
from tqdm.auto import tqdm
from transformers import get_linear_schedule_with_warmup

PLAIN_MARKER = "# [plain]"
ACCELERATE_MARKER = "# [accelerate]"


def train_plain(
    model,
    optimizer,
    lr_scheduler,
    train_dataloader,
    num_epochs=1,
    device="cpu",  # [plain]
    show_progress=True,
):
    """Train ``model`` with a plain PyTorch loop; return the loss of every step (floats).

    The caller chooses the device and must move the model there; every batch is
    moved by hand inside the loop.
    """
    _check_training_arguments(model, optimizer, lr_scheduler, train_dataloader, num_epochs)
    model.to(device)  # [plain]
    model.train()
    losses = []
    steps = tqdm(total=num_epochs * len(train_dataloader), desc="training", disable=not show_progress)
    for epoch in range(num_epochs):
        for batch in train_dataloader:
            optimizer.zero_grad()
            inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
            targets = batch["labels"]
            inputs = {name: tensor.to(device) for name, tensor in inputs.items()}  # [plain] move by hand
            targets = targets.to(device)  # [plain]
            outputs = model(**inputs, labels=targets)
            loss = outputs.loss
            loss.backward()  # [plain]
            optimizer.step()
            lr_scheduler.step()
            losses.append(loss.item())
            steps.update()
    steps.close()
    return losses


def train_accelerate(
    model,
    optimizer,
    lr_scheduler,
    train_dataloader,
    num_epochs=1,
    accelerator=None,  # [accelerate]
    show_progress=True,
):
    """Train ``model`` with Accelerate; return the loss of every step on this process (floats).

    ``prepare`` places the model and every batch on the accelerator's device and,
    when several processes run, wraps the model for data parallelism and gives
    each process its own shard of the data. Without ``accelerator`` a default
    ``Accelerator()`` is created.
    """
    _check_training_arguments(model, optimizer, lr_scheduler, train_dataloader, num_epochs)
    accelerator = accelerator or Accelerator()  # [accelerate]
    # [accelerate] prepare moves the model, and makes the dataloader yield batches on the device
    model, optimizer, train_dataloader, lr_scheduler = accelerator.prepare(  # [accelerate]
        model, optimizer, train_dataloader, lr_scheduler  # [accelerate]
    )  # [accelerate]
    model.train()
    losses = []
    show_progress = show_progress and accelerator.is_local_main_process  # [accelerate] one bar, not one per process
    steps = tqdm(total=num_epochs * len(train_dataloader), desc="training", disable=not show_progress)
    for epoch in range(num_epochs):
        for batch in train_dataloader:
            optimizer.zero_grad()
            inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
            targets = batch["labels"]
            outputs = model(**inputs, labels=targets)
            loss = outputs.loss
            accelerator.backward(loss)  # [accelerate] also averages gradients across processes
            optimizer.step()
            lr_scheduler.step()
            losses.append(loss.item())
            steps.update()
    steps.close()
    return losses


def make_optimizer_and_scheduler(model, num_training_steps, lr=1e-3, warmup_fraction=0.1, optimizer_class=None):
    """Return ``(optimizer, lr_scheduler)``: Adam (or ``optimizer_class``) with linear warm-up and decay.

    The learning rate rises linearly from 0 to ``lr`` over the first
    ``int(warmup_fraction * num_training_steps)`` steps, then falls linearly to 0.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(num_training_steps, int) or num_training_steps <= 0:
        raise ValueError(f"num_training_steps must be a positive int, got {num_training_steps!r}")
    if not (isinstance(lr, (int, float)) and lr > 0 and math.isfinite(lr)):
        raise ValueError(f"lr must be a positive number, got {lr!r}")
    if not (isinstance(warmup_fraction, (int, float)) and 0 <= warmup_fraction < 1):
        raise ValueError(f"warmup_fraction must be a number in [0, 1), got {warmup_fraction!r}")
    optimizer_class = optimizer_class or torch.optim.Adam
    optimizer = optimizer_class(model.parameters(), lr=lr)
    lr_scheduler = get_linear_schedule_with_warmup(
        optimizer=optimizer,
        num_warmup_steps=int(num_training_steps * warmup_fraction),
        num_training_steps=num_training_steps,
    )
    return optimizer, lr_scheduler


def train_with_trainer(model, optimizer, lr_scheduler, train_dataset, eval_dataset, tokenizer,
                       num_epochs=1, batch_size=32, output_dir=None, show_progress=True):
    """Train ``model`` with the Hugging Face ``Trainer``; return the evaluation metrics after each epoch.

    The Trainer runs the loop itself: you hand it the model, data, optimizer and
    schedule, and it decides the order of zero_grad, forward, backward and step.
    Returns a list with one dict per epoch (``eval_loss``, ``eval_accuracy``,
    ``eval_f1``; accuracy and F1 as fractions in [0, 1]).
    """
    import tempfile

    from transformers import DataCollatorWithPadding, Trainer, TrainingArguments

    def compute_metrics(evaluation):
        return accuracy_and_f1(torch.as_tensor(evaluation.predictions).argmax(dim=-1), torch.as_tensor(evaluation.label_ids))

    if not isinstance(num_epochs, int) or isinstance(num_epochs, bool) or num_epochs <= 0:
        raise ValueError(f"num_epochs must be a positive int, got {num_epochs!r}")
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size <= 0:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    with tempfile.TemporaryDirectory() as scratch_dir:
        arguments = TrainingArguments(
            output_dir=output_dir or scratch_dir,
            num_train_epochs=num_epochs,
            per_device_train_batch_size=batch_size,
            per_device_eval_batch_size=batch_size,
            eval_strategy="epoch",
            logging_strategy="epoch",
            save_strategy="no",  # nothing to keep: the lesson only compares metrics
            report_to="none",  # no experiment tracker: the course runs offline
            use_cpu=True,
            disable_tqdm=not show_progress,
            seed=torch.initial_seed() % 2**32,
        )
        trainer = Trainer(
            model=model,
            args=arguments,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            data_collator=DataCollatorWithPadding(tokenizer),
            compute_metrics=compute_metrics,
            optimizers=(optimizer, lr_scheduler),
        )
        trainer.train()
    return [entry for entry in trainer.state.log_history if "eval_accuracy" in entry]


@torch.no_grad()
def evaluate(model, dataloader, accelerator=None):
    """Return ``{"accuracy": float, "f1": float}`` of ``model`` on ``dataloader`` (fractions in [0, 1]).

    F1 is for the positive class (label 1), as GLUE reports it for MRPC. With an
    ``accelerator`` whose dataloader was prepared, predictions from every process
    are gathered first, so each process returns the metrics of the whole split.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(dataloader, DataLoader):
        raise TypeError(f"dataloader must be a torch.utils.data.DataLoader, got {type(dataloader).__name__}")
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    all_predictions, all_labels = [], []
    for batch in dataloader:
        logits = model(
            input_ids=batch["input_ids"].to(device), attention_mask=batch["attention_mask"].to(device)
        ).logits
        predictions, labels = logits.argmax(dim=-1), batch["labels"].to(device)
        if accelerator is not None:
            # gather_for_metrics also drops the samples duplicated to even out the last batch.
            predictions, labels = accelerator.gather_for_metrics((predictions, labels))
        all_predictions.append(predictions.cpu())
        all_labels.append(labels.cpu())
    model.train(was_training)
    return accuracy_and_f1(torch.cat(all_predictions), torch.cat(all_labels))


def accuracy_and_f1(predictions, labels):
    """Return ``{"accuracy": float, "f1": float}`` for 0/1 ``predictions`` against ``labels``."""
    predictions, labels = torch.as_tensor(predictions), torch.as_tensor(labels)
    if predictions.shape != labels.shape:
        raise ValueError(f"predictions and labels must have the same shape, got {tuple(predictions.shape)} and {tuple(labels.shape)}")
    if labels.numel() == 0:
        raise ValueError("labels is empty: there is nothing to score")
    true_positives = ((predictions == 1) & (labels == 1)).sum().item()
    predicted_positives = (predictions == 1).sum().item()
    actual_positives = (labels == 1).sum().item()
    # F1 = 2 TP / (2 TP + FP + FN); defined as 0 when there are no positives at all.
    f1_denominator = predicted_positives + actual_positives
    return {
        "accuracy": (predictions == labels).float().mean().item(),
        "f1": 2 * true_positives / f1_denominator if f1_denominator else 0.0,
    }


def loop_source(loop, drop_marker=None):
    """Return the source lines of a training loop, without those carrying ``drop_marker``.

    With no marker the full source is returned. The docstring is left out, since
    the two loops describe themselves differently.
    """
    source = inspect.getsource(loop)
    docstring = inspect.getdoc(loop)
    lines = source.splitlines()
    if docstring:
        start = next(i for i, line in enumerate(lines) if '"""' in line)
        end = next(i for i in range(start + 1, len(lines)) if '"""' in lines[i]) if lines[start].count('"""') < 2 else start
        lines = lines[:start] + lines[end + 1:]
    if drop_marker is not None:
        lines = [line for line in lines if drop_marker not in line]
    return lines


def loop_diff_html(before=train_plain, after=train_accelerate):
    """Return an HTML table showing two loops side by side, the changed lines highlighted."""
    diff = difflib.HtmlDiff(tabsize=4, wrapcolumn=48)
    before_lines = [_without_marker(line, PLAIN_MARKER) for line in loop_source(before)]
    after_lines = [_without_marker(line, ACCELERATE_MARKER) for line in loop_source(after)]
    table = diff.make_table(before_lines, after_lines, fromdesc=before.__name__, todesc=after.__name__)
    # make_table comes without difflib's colours, and JupyterLab's own table style
    # right-aligns cells in a proportional font: restore both, so code keeps its indentation.
    style = (
        "<style>" + diff._styles
        + "table.diff td {text-align: left; font-family: monospace; white-space: pre; font-size: 12px;}</style>"
    )
    return style + table


def _without_marker(line, marker):
    """``x = 1  # [plain] why`` -> ``x = 1  # why``; a bare marker comment disappears."""
    code, found, reason = line.partition(marker)
    if not found:
        return line.rstrip()
    code = code.rstrip()
    if code.endswith("#"):
        code = code[:-1].rstrip()
    reason = reason.strip()
    if not reason:
        return code
    return f"{code}  # {reason}" if code.strip() else f"{code}# {reason}"


def _check_training_arguments(model, optimizer, lr_scheduler, train_dataloader, num_epochs):
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    if not hasattr(lr_scheduler, "step"):
        raise TypeError(f"lr_scheduler must be a learning-rate scheduler with a step() method, got {type(lr_scheduler).__name__}")
    if not isinstance(train_dataloader, DataLoader):
        raise TypeError(f"train_dataloader must be a torch.utils.data.DataLoader, got {type(train_dataloader).__name__}")
    if not isinstance(num_epochs, int) or isinstance(num_epochs, bool) or num_epochs <= 0:
        raise ValueError(f"num_epochs must be a positive int, got {num_epochs!r}")
