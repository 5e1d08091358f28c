"""The learning-rate schedule of the course: a linear warm-up, then a linear decay to 0 (lessons 2, 5, 6).

The schedule of transformers' ``get_linear_schedule_with_warmup``, which
lessons 1 and 3 call as the library call, written once here with torch alone:
importing transformers' optimization module also imports peft and bitsandbytes,
after which ``accelerate.notebook_launcher`` refuses to start (lesson 6's
``train.training_function`` runs in launched processes).
:func:`linear_warmup_then_decay` is the factor of each step;
:func:`linear_schedule_with_warmup` the scheduler the other lessons build.
"""

from __future__ import annotations

import torch

from course_utils.validation import check_fraction, check_int_in_range, check_instance, check_positive_int

__all__ = ["linear_schedule_with_warmup", "linear_warmup_then_decay"]


def linear_warmup_then_decay(num_warmup_steps, num_training_steps):
    """Return the learning-rate factor of each scheduler step, for ``torch.optim.lr_scheduler.LambdaLR``.

    The factor rises linearly from 0 to 1 over ``num_warmup_steps`` steps, then
    falls linearly to 0 at ``num_training_steps``: the schedule of transformers'
    ``get_linear_schedule_with_warmup``.
    """
    check_positive_int(num_training_steps, "num_training_steps")
    check_int_in_range(num_warmup_steps, "num_warmup_steps", 0, num_training_steps)

    def factor(step):
        if step < num_warmup_steps:
            return step / max(1, num_warmup_steps)
        return max(0.0, (num_training_steps - step) / max(1, num_training_steps - num_warmup_steps))

    return factor


def linear_schedule_with_warmup(optimizer, num_training_steps, warmup_fraction=0.1):
    """Return a scheduler: the learning rate rises from 0 over ``warmup_fraction`` of the steps, then falls to 0.

    The warm-up lasts ``int(warmup_fraction * num_training_steps)`` steps, as
    ``transformers.get_linear_schedule_with_warmup(optimizer, int(warmup_fraction * num_training_steps),
    num_training_steps)`` would make it; build the optimizer with ``course_utils.optimizers.make_optimizer``.
    """
    check_instance(optimizer, "optimizer", torch.optim.Optimizer, "a torch.optim.Optimizer")
    check_positive_int(num_training_steps, "num_training_steps")
    check_fraction(warmup_fraction, "warmup_fraction")
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, linear_warmup_then_decay(int(warmup_fraction * num_training_steps), num_training_steps)
    )
