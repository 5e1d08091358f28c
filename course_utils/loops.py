"""Training loops: the plain PyTorch loop, the same loop with Hugging Face Accelerate, and the Trainer.

Introduced in lesson 1. :func:`train_plain` and :func:`train_accelerate` are
twins in the shape of Accelerate's ``examples/nlp_example.py``: the Accelerate
loop is the plain loop with a few lines removed and added, and nothing else.
A test asserts exactly which lines those are (``loop_diff.loop_changes`` lists them),
and ``loop_diff.loop_diff_html`` shows the two side by side (both in
``course_utils.loop_diff``). Neither loop checks its arguments: they are written to be read.

The changes, as the lesson's summary table gives them:

- ``device`` becomes ``accelerator`` (the caller creates the ``Accelerator``);
- ``model.to(device)``, which the plain loop's caller runs before it builds the
  optimizer (``train_plain`` gets the model on its device), becomes
  ``accelerator.prepare(...)`` of the model, the optimizer, the dataloader and
  the scheduler, inside the loop's function (``prepare`` may come after the
  optimizer: it places the model and the optimizer together);
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

import torch
from torch.utils.data import DataLoader
from transformers import DataCollatorWithPadding, Trainer, TrainingArguments


def train_plain(model, optimizer, lr_scheduler, train_dataloader, num_epochs, device):
    """Train ``model`` on ``device`` with a plain PyTorch loop; return the loss of every step (floats).

    ``model`` is on ``device`` already: moved there before ``optimizer`` was built
    from its parameters, as torch.optim asks (lesson 1, section 1).
    """
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
