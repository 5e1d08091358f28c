"""The Accelerate loop of lesson 1 with one feature each: the lines that make a training fit and a job survive (lesson 5).

Each training function here is lesson 1's Accelerate loop, in the shape of
Accelerate's ``examples/nlp_example.py``, plus one feature, the way Accelerate's
``examples/by_feature/`` scripts are the base example plus a block under a
``# New Code #`` comment:

- :func:`train_accumulating`: ``with accelerator.accumulate(model):`` around the step,
  so k micro-batches make one optimizer step (``Accelerator(gradient_accumulation_steps=k)``);
- :func:`train_clipping`: the same, and ``accelerator.clip_grad_norm_`` on the
  micro-batch that updates; returns the norms it measured;
- :func:`train_resumable`: the same, saving the whole training state every
  ``checkpointing_steps`` optimizer steps with ``accelerator.save_state``, and
  resuming from one with ``accelerator.load_state``.

The levers that change no line of the loop (mixed precision, activation
checkpointing, freezing, LoRA) are switched on where the model or the
``Accelerator`` is built; the lesson shows those lines
(``course_utils.accelerate_state.fresh_accelerator`` builds Accelerators with
different settings in one notebook; ``course_utils.speed.time_optimizer_step``
measures what a lever costs in time).

The training functions have the signature and the lines of
``course_utils.loops.train_accelerate`` plus their own (a test holds them to
it, as Accelerate's ``compare_against_test`` holds its feature scripts), and no
argument checks, so they read as the lesson shows them.
"""

from __future__ import annotations

from pathlib import Path


def train_accumulating(model, optimizer, lr_scheduler, train_dataloader, num_epochs, accelerator):
    """Train with gradient accumulation; return the loss of every micro-batch (floats).

    ``accelerator`` decides the number of micro-batches per optimizer step
    (``Accelerator(gradient_accumulation_steps=k)``); the scheduler counts
    optimizer steps, so build it for ``len(train_dataloader) * num_epochs // k`` of them.
    """
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
            # New Code #
            # accumulate() counts the micro-batches: step(), the scheduler and zero_grad()
            # act on every k-th only, and backward divides the loss by k, so the k
            # gradients add up to the gradient of the mean loss over the big batch.
            with accelerator.accumulate(model):
                outputs = model(**batch)
                loss = outputs.loss
                accelerator.backward(loss)
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()
            losses.append(loss.item())
    return losses


def train_clipping(model, optimizer, lr_scheduler, train_dataloader, num_epochs, accelerator, max_grad_norm):
    """Train with accumulation and gradient clipping; return ``(losses, grad_norms)``.

    ``losses`` has one float per micro-batch; ``grad_norms`` one float per
    optimizer step: the norm of the whole gradient *before* clipping it to ``max_grad_norm``.
    """
    # prepare places the model and makes the dataloader yield
    # batches on the device; on several processes it wraps the
    # model in DDP, whose backward averages the gradients.
    model, optimizer, train_dataloader, lr_scheduler = accelerator.prepare(
        model, optimizer, train_dataloader, lr_scheduler
    )
    model.train()
    losses = []
    grad_norms = []
    for epoch in range(num_epochs):
        for step, batch in enumerate(train_dataloader):
            with accelerator.accumulate(model):
                outputs = model(**batch)
                loss = outputs.loss
                accelerator.backward(loss)
                # New Code #
                # Clip the whole gradient: after the backward that completes it
                # (sync_gradients), before the step that uses it.
                if accelerator.sync_gradients:
                    grad_norm = accelerator.clip_grad_norm_(model.parameters(), max_grad_norm)
                    grad_norms.append(grad_norm.item())
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()
            losses.append(loss.item())
    return losses, grad_norms


def train_resumable(model, optimizer, lr_scheduler, train_dataloader, num_epochs, accelerator,
                    checkpointing_steps, output_dir, resume_from_checkpoint=None, stop_after_steps=None):
    """Train with accumulation, saving the state every ``checkpointing_steps`` optimizer steps; return the losses.

    Each checkpoint is the folder ``output_dir/step_N`` written by
    ``accelerator.save_state`` (model, optimizer, scheduler, random number
    generators). With ``resume_from_checkpoint`` (such a folder) the training
    loads it and continues at the batch after step N. ``stop_after_steps``
    interrupts the training after that many optimizer steps, as a crash would.
    The batch order of every epoch must depend on the epoch alone:
    ``Accelerator(dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True))``.
    """
    # prepare places the model and makes the dataloader yield
    # batches on the device; on several processes it wraps the
    # model in DDP, whose backward averages the gradients.
    model, optimizer, train_dataloader, lr_scheduler = accelerator.prepare(
        model, optimizer, train_dataloader, lr_scheduler
    )
    # New Code #
    # load_state restores what prepare registered, so it comes after prepare;
    # the folder's name says how many optimizer steps were done.
    completed_steps = 0
    if resume_from_checkpoint is not None:
        accelerator.load_state(resume_from_checkpoint)
        completed_steps = int(Path(resume_from_checkpoint).name.removeprefix("step_"))
    batches_done = completed_steps * accelerator.gradient_accumulation_steps
    starting_epoch, resume_batch = divmod(batches_done, len(train_dataloader))
    model.train()
    losses = []
    for epoch in range(starting_epoch, num_epochs):
        # New Code #
        # The epoch number alone sets the batch order, in the first run and in the resumed one.
        train_dataloader.set_epoch(epoch)
        if epoch == starting_epoch and resume_batch > 0:
            active_dataloader = accelerator.skip_first_batches(train_dataloader, resume_batch)
        else:
            active_dataloader = train_dataloader
        for step, batch in enumerate(active_dataloader):
            with accelerator.accumulate(model):
                outputs = model(**batch)
                loss = outputs.loss
                accelerator.backward(loss)
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()
            losses.append(loss.item())
            # New Code #
            if accelerator.sync_gradients:
                completed_steps += 1
                if completed_steps % checkpointing_steps == 0:
                    accelerator.save_state(Path(output_dir) / f"step_{completed_steps}")
                if completed_steps == stop_after_steps:
                    return losses
    return losses
