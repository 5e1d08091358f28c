"""Training loops: the plain PyTorch loop, the same loop with Hugging Face Accelerate, and the Trainer.

Introduced in lesson 1. :func:`train_plain` and :func:`train_accelerate` are
twins in the shape of Accelerate's ``examples/nlp_example.py``: the Accelerate
loop is the plain loop with a few lines removed and added, and nothing else.
A test asserts exactly which lines those are (:func:`loop_changes` lists them),
and :func:`loop_diff_html` shows the two side by side. Neither checks its
arguments: they are written to be read.

The changes, as the lesson's summary table gives them:

- ``device`` becomes ``accelerator`` (the caller creates the ``Accelerator``);
- ``model.to(device)`` becomes ``accelerator.prepare(...)`` of the model, the
  optimizer, the dataloader and the scheduler;
- the line that moves each batch to the device goes: the prepared dataloader does it;
- ``loss.backward()`` becomes ``accelerator.backward(loss)``.

Averaging the gradients across processes is not done by ``accelerator.backward``:
on several processes ``prepare`` wraps the model in ``DistributedDataParallel``,
whose hooks average the gradients during any backward pass through it.
``accelerator.backward`` divides the loss by the gradient-accumulation steps,
scales it under fp16 and hands over to DeepSpeed or Megatron-LM when they are
used (lesson 6 runs it on two processes).
"""

from __future__ import annotations

import ast
import difflib
import inspect
import textwrap

import torch
from torch.utils.data import DataLoader
from transformers import DataCollatorWithPadding, Trainer, TrainingArguments, get_linear_schedule_with_warmup

from course_utils.validation import check_fraction, check_positive_int, check_python_function


def train_plain(model, optimizer, lr_scheduler, train_dataloader, num_epochs, device):
    """Train ``model`` on ``device`` with a plain PyTorch loop; return the loss of every step (floats)."""
    model.to(device)
    model.train()
    losses = []
    for epoch in range(num_epochs):
        for step, batch in enumerate(train_dataloader):
            batch = {k: v.to(device) for k, v in batch.items()}
            outputs = model(**batch)
            loss = outputs.loss
            loss.backward()
            optimizer.step()
            lr_scheduler.step()
            optimizer.zero_grad()
            losses.append(loss.item())
    return losses


def train_accelerate(model, optimizer, lr_scheduler, train_dataloader, num_epochs, accelerator):
    """Train ``model`` with ``accelerator``; return the loss of every step on this process (floats)."""
    # prepare places the model and makes the dataloader yield
    # batches on the device; on several processes it wraps the
    # model in DDP, whose backward averages the gradients.
    model, optimizer, train_dataloader, lr_scheduler = accelerator.prepare(
        model, optimizer, train_dataloader, lr_scheduler
    )
    model.train()
    losses = []
    for epoch in range(num_epochs):
        for step, batch in enumerate(train_dataloader):
            outputs = model(**batch)
            loss = outputs.loss
            accelerator.backward(loss)
            optimizer.step()
            lr_scheduler.step()
            optimizer.zero_grad()
            losses.append(loss.item())
    return losses


def train_with_trainer(
    model, optimizer, lr_scheduler, train_dataset, eval_dataset, tokenizer, num_epochs, seed, output_dir
):
    """Train ``model`` with the Hugging Face ``Trainer``; return the Trainer.

    The Trainer runs the loop itself. ``trainer.evaluate()`` then returns
    ``eval_loss``, ``eval_accuracy`` and ``eval_f1`` (fractions in [0, 1]);
    ``trainer.optimizer`` is the optimizer it stepped. The Trainer creates
    ``output_dir`` for its checkpoints; with ``save_strategy="no"`` it stays empty.
    """
    arguments = TrainingArguments(
        output_dir=output_dir,
        num_train_epochs=num_epochs,
        per_device_train_batch_size=32,
        per_device_eval_batch_size=32,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        seed=seed,
    )
    trainer = Trainer(
        model=model,
        args=arguments,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        data_collator=DataCollatorWithPadding(tokenizer),
        compute_metrics=trainer_metrics,
        optimizers=(optimizer, lr_scheduler),
    )
    trainer.train()
    return trainer


def trainer_metrics(evaluation):
    """Return accuracy and F1 (fractions) of a Trainer's ``EvalPrediction``: logits and true labels."""
    return accuracy_and_f1(torch.as_tensor(evaluation.predictions).argmax(dim=-1), torch.as_tensor(evaluation.label_ids))


def linear_schedule_with_warmup(optimizer, num_training_steps, warmup_fraction=0.1):
    """Return a scheduler: the learning rate rises from 0 over ``warmup_fraction`` of the steps, then falls to 0.

    The warm-up lasts ``int(warmup_fraction * num_training_steps)`` steps
    (``transformers.get_linear_schedule_with_warmup``); build the optimizer with
    ``course_utils.optimizers.make_optimizer``.
    """
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    check_positive_int(num_training_steps, "num_training_steps")
    check_fraction(warmup_fraction, "warmup_fraction")
    return get_linear_schedule_with_warmup(
        optimizer, num_warmup_steps=int(warmup_fraction * num_training_steps), num_training_steps=num_training_steps
    )


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
    try:
        predictions, labels = torch.as_tensor(predictions), torch.as_tensor(labels)
    except (TypeError, ValueError, RuntimeError):
        raise TypeError("predictions and labels must be tensors or lists of 0/1 labels") from None
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


def code_lines(function):
    """Return the lines of ``function``'s source without its docstring, comment-only lines and blank lines.

    Lines keep their indentation, relative to the ``def`` line.
    """
    return [line for line in _source_without_docstring(function) if line.strip() and not line.strip().startswith("#")]


def loop_changes(before=train_plain, after=train_accelerate):
    """Return ``(removed, added)``: the code lines (stripped) that only ``before``, or only ``after``, has.

    Comments, blank lines and docstrings are left out, as in Accelerate's own
    check of its examples; the lines are compared in order (``difflib``).
    """
    before_lines = [line.strip() for line in code_lines(before)]
    after_lines = [line.strip() for line in code_lines(after)]
    removed, added = [], []
    for line in difflib.ndiff(before_lines, after_lines):
        if line.startswith("- "):
            removed.append(line[2:])
        elif line.startswith("+ "):
            added.append(line[2:])
    return removed, added


class _WordWrappingHtmlDiff(difflib.HtmlDiff):
    """difflib's side-by-side table, wrapping long lines between words instead of at a fixed column.

    difflib cuts a long line at exactly ``wrapcolumn`` characters, often in the
    middle of an identifier (``lr_sche`` / ``duler``); this cuts at the last
    space before that column, when the line has one after its indentation.
    """

    def _split_line(self, data_list, line_num, text):
        limit = self._wrapcolumn
        # difflib marks changes with "\0+", "\0-", "\0^" (start) and "\1" (end), which take no column.
        if not line_num or len(text) - 3 * text.count("\0") <= limit:
            data_list.append((line_num, text))
            return
        i = column = 0
        mark, seen_text, cut = "", False, None
        while column < limit and i < len(text):
            if text[i] == "\0":
                mark, i = text[i + 1], i + 2
            elif text[i] == "\1":
                mark, i = "", i + 1
            else:
                if text[i] == " " and seen_text:
                    cut = (i + 1, mark)  # after the space: the next line starts with a word
                seen_text = seen_text or text[i] != " "
                i, column = i + 1, column + 1
        if cut is not None and i < len(text) and text[i] not in " \0\1":
            i, mark = cut  # the column falls inside a word: cut at the last space instead
        line1, line2 = text[:i], text[i:]
        if mark:  # the cut falls inside a change: close it on this line, reopen it on the next
            line1, line2 = line1 + "\1", "\0" + mark + line2
        data_list.append((line_num, line1))
        self._split_line(data_list, ">", line2)


def loop_diff_html(before=train_plain, after=train_accelerate):
    """Return an HTML table showing two functions side by side, the changed lines highlighted."""
    diff = _WordWrappingHtmlDiff(tabsize=4, wrapcolumn=76)
    before_lines = _source_without_docstring(before)
    after_lines = _source_without_docstring(after)
    table = diff.make_table(before_lines, after_lines, fromdesc=before.__name__, todesc=after.__name__)
    # make_table comes without difflib's colours, and JupyterLab's own table style
    # right-aligns cells in a proportional font: restore both, so code keeps its indentation.
    style = (
        "<style>" + diff._styles
        + "table.diff td {text-align: left; font-family: monospace; white-space: pre; font-size: 11px;}</style>"
    )
    return style + table


def _source_without_docstring(function):
    """Return ``function``'s source lines, comments included, without the docstring (the twins' differ)."""
    check_python_function(function, "function")
    source = textwrap.dedent(inspect.getsource(function))
    lines = source.splitlines()
    first = ast.parse(source).body[0].body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        lines = lines[: first.lineno - 1] + lines[first.end_lineno:]
    return [line.rstrip() for line in lines]

