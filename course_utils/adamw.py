"""AdamW from first principles: one step written plainly, its moving averages, its step sizes.

Introduced in lesson 2. With ``g`` the gradient, ``t`` the 1-based step number,
``lr`` the learning rate and ``wd`` the weight decay, one AdamW step is::

    m = beta1 * m + (1 - beta1) * g                  # first moment: moving average of the gradients
    v = beta2 * v + (1 - beta2) * g**2               # second moment: moving average of their squares
    m_hat = m / (1 - beta1**t)                       # bias correction: both averages start at zero
    v_hat = v / (1 - beta2**t)
    param = param - lr * wd * param - lr * m_hat / (sqrt(v_hat) + eps)

The last line is the whole update: the decay is *decoupled* (it shrinks the old
weights directly and never enters ``m`` or ``v``), and ``eps`` is added outside
the square root. Where ``sqrt(v_hat)`` is far below ``eps`` (gradients much
smaller than eps), the step is about ``lr / eps * m_hat``: Adam turns into SGD
with learning rate ``lr / eps``. ``m`` and ``v`` are what ``torch.optim.AdamW``
keeps per parameter as ``exp_avg`` and ``exp_avg_sq``.

:func:`adamw_step` is displayed by the lesson: one line checks its step number
and hyperparameters (step 0 would divide by zero and return NaN weights). The
helpers that take a learner's step function or values (:func:`run_steps`,
:func:`ema_traces`) check those.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from course_utils.validation import (
    check_finite_tensor, check_int_in_range, check_non_negative_number, check_positive_int,
)

__all__ = [
    "adamw_step",
    "adam_l2_step",
    "run_steps",
    "run_torch_adamw",
    "noisy_gradients",
    "ema_traces",
    "optimizer_state_table",
]

# torch.optim.AdamW's defaults, so that the from-scratch step and the library agree out of the box.
DEFAULT_LR = 1e-3
DEFAULT_BETA1 = 0.9
DEFAULT_BETA2 = 0.999
DEFAULT_EPS = 1e-8
DEFAULT_WEIGHT_DECAY = 1e-2


def adamw_step(param, grad, exp_avg, exp_avg_sq, step,
               lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=1e-2):
    """Return ``(param, exp_avg, exp_avg_sq)`` after AdamW step number ``step`` (1 for the first step).

    New tensors are returned; the inputs are left untouched. The defaults are
    torch.optim.AdamW's.
    """
    _check_step(step, lr, beta1, beta2, eps, weight_decay)  # the first step is 1: step 0 would divide by zero
    exp_avg = beta1 * exp_avg + (1 - beta1) * grad
    exp_avg_sq = beta2 * exp_avg_sq + (1 - beta2) * grad**2
    exp_avg_hat = exp_avg / (1 - beta1**step)
    exp_avg_sq_hat = exp_avg_sq / (1 - beta2**step)
    param = param - lr * weight_decay * param - lr * exp_avg_hat / (exp_avg_sq_hat.sqrt() + eps)
    return param, exp_avg, exp_avg_sq


def adam_l2_step(param, grad, exp_avg, exp_avg_sq, step,
                 lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=1e-2):
    """Return ``(param, exp_avg, exp_avg_sq)`` after one step of Adam with L2 regularisation.

    The same as :func:`adamw_step` except that the decay is added to the gradient
    (``g + weight_decay * param``, what ``torch.optim.Adam(weight_decay=...)`` does),
    so it passes through the moving averages and is rescaled by ``sqrt(v_hat)``.
    With ``weight_decay=0`` the two steps are identical.
    """
    check_non_negative_number(weight_decay, "weight_decay")  # the rest is checked by adamw_step
    return adamw_step(param, grad + weight_decay * param, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps, weight_decay=0.0)


def run_steps(step_function: Callable, initial_param, gradients: Sequence, **hyperparameters) -> list[dict]:
    """Apply ``step_function`` once per gradient, starting from zero moving averages.

    ``step_function`` has the signature of :func:`adamw_step`. Returns one dict
    per step with the tensors ``"param"``, ``"exp_avg"`` and ``"exp_avg_sq"``
    after that step. The step function receives copies, so it may work in place.
    """
    if not callable(step_function):
        raise TypeError(f"step_function must be callable, got {type(step_function).__name__}")
    _check_gradients(initial_param, gradients)
    _check_hyperparameter_values(hyperparameters)
    param = initial_param.detach().clone()
    exp_avg, exp_avg_sq = torch.zeros_like(param), torch.zeros_like(param)
    history = []
    for step, grad in enumerate(gradients, start=1):
        param, exp_avg, exp_avg_sq = step_function(
            param.clone(), grad.clone(), exp_avg.clone(), exp_avg_sq.clone(), step, **hyperparameters
        )
        history.append({"param": param.clone(), "exp_avg": exp_avg.clone(), "exp_avg_sq": exp_avg_sq.clone()})
    return history


def run_torch_adamw(initial_param, gradients: Sequence, **hyperparameters) -> list[dict]:
    """Do what :func:`run_steps` does, with ``torch.optim.AdamW`` taking the steps.

    ``hyperparameters`` use the names of :func:`adamw_step` (``lr``, ``beta1``,
    ``beta2``, ``eps``, ``weight_decay``). Returns one dict per step with the
    tensors ``"param"``, ``"exp_avg"`` and ``"exp_avg_sq"`` after that step.
    """
    _check_gradients(initial_param, gradients)
    unknown = set(hyperparameters) - {"lr", "beta1", "beta2", "eps", "weight_decay"}
    if unknown:
        raise TypeError(f"hyperparameters has unknown names {sorted(unknown)}; expected lr, beta1, beta2, eps, weight_decay")
    _check_hyperparameter_values(hyperparameters)
    param = torch.nn.Parameter(initial_param.detach().clone())
    optimizer = torch.optim.AdamW(
        [param],
        lr=hyperparameters.get("lr", DEFAULT_LR),
        betas=(hyperparameters.get("beta1", DEFAULT_BETA1), hyperparameters.get("beta2", DEFAULT_BETA2)),
        eps=hyperparameters.get("eps", DEFAULT_EPS),
        weight_decay=hyperparameters.get("weight_decay", DEFAULT_WEIGHT_DECAY),
    )
    history = []
    for grad in gradients:
        param.grad = grad.detach().clone()
        optimizer.step()
        state = optimizer.state[param]
        history.append(
            {"param": param.detach().clone(), "exp_avg": state["exp_avg"].clone(), "exp_avg_sq": state["exp_avg_sq"].clone()}
        )
    return history


def noisy_gradients(num_steps: int = 300, seed: int = 0) -> torch.Tensor:
    """Return ``num_steps`` gradients of one weight (a 1-D float32 tensor), in three phases of equal length.

    First a clear signal (mean 1, noise 0.3), then mostly noise (mean 0.2,
    noise 1), then the signal reversed (mean -1, noise 0.3): enough to see how
    the moving averages smooth, lag and shrink the step when the sign is unsure.
    """
    if not isinstance(num_steps, int) or isinstance(num_steps, bool) or num_steps < 3:
        raise ValueError(f"num_steps must be an int of at least 3, got {num_steps!r}")
    check_int_in_range(seed, "seed", 0, 2**64 - 1)  # what torch.Generator.manual_seed takes
    generator = torch.Generator().manual_seed(seed)
    phase = torch.arange(num_steps) * 3 // num_steps
    means = torch.tensor([1.0, 0.2, -1.0])[phase]
    noise_levels = torch.tensor([0.3, 1.0, 0.3])[phase]
    return means + noise_levels * torch.randn(num_steps, generator=generator)


def ema_traces(gradients, beta1=DEFAULT_BETA1, beta2=DEFAULT_BETA2, lr=DEFAULT_LR, eps=DEFAULT_EPS) -> dict:
    """Return AdamW's moving averages and update at every step of a 1-D gradient sequence.

    Keys, each a 1-D float64 tensor as long as ``gradients``:

    - ``"gradient"``: the gradients themselves
    - ``"exp_avg"``, ``"exp_avg_sq"``: the raw moving averages (gradient and squared-gradient units)
    - ``"exp_avg_hat"``, ``"exp_avg_sq_hat"``: the same after bias correction
    - ``"update"``: what the step subtracts from the weight, ``lr * m_hat / (sqrt(v_hat) + eps)``
      (weight units; at most about ``lr`` in size)
    - ``"update_without_bias_correction"``: ``lr * m / (sqrt(v) + eps)``, for comparison
    """
    try:
        gradients = torch.as_tensor(gradients, dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError):
        raise TypeError(f"gradients must be a 1-D sequence of numbers, got {type(gradients).__name__}") from None
    if gradients.ndim != 1 or gradients.numel() == 0:
        raise ValueError(f"gradients must be a non-empty 1-D sequence, got shape {tuple(gradients.shape)}")
    check_finite_tensor(gradients, "gradients")
    _check_hyperparameters(lr, beta1, beta2, eps, weight_decay=0.0)
    exp_avg, exp_avg_sq = torch.zeros_like(gradients), torch.zeros_like(gradients)
    m = v = 0.0
    for index, grad in enumerate(gradients.tolist()):
        m = beta1 * m + (1 - beta1) * grad
        v = beta2 * v + (1 - beta2) * grad * grad
        exp_avg[index], exp_avg_sq[index] = m, v
    steps = torch.arange(1, len(gradients) + 1, dtype=torch.float64)
    exp_avg_hat = exp_avg / (1 - beta1**steps)
    exp_avg_sq_hat = exp_avg_sq / (1 - beta2**steps)
    return {
        "gradient": gradients,
        "exp_avg": exp_avg,
        "exp_avg_sq": exp_avg_sq,
        "exp_avg_hat": exp_avg_hat,
        "exp_avg_sq_hat": exp_avg_sq_hat,
        "update": lr * exp_avg_hat / (exp_avg_sq_hat.sqrt() + eps),
        "update_without_bias_correction": lr * exp_avg / (exp_avg_sq.sqrt() + eps),
    }


def optimizer_state_table(optimizer, model=None, max_rows: int = 4) -> str:
    """Return a short text table of an optimizer's state: one row per parameter, shapes and dtypes only.

    With ``model``, rows are labelled with parameter names. At most ``max_rows``
    rows are listed, followed by a count of the rest, so a large model does not
    print a wall of tensors.
    """
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    if model is not None and not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module or None, got {type(model).__name__}")
    if not isinstance(max_rows, int) or isinstance(max_rows, bool) or max_rows < 1:
        raise ValueError(f"max_rows must be a positive int, got {max_rows!r}")
    names = {id(p): name for name, p in model.named_parameters()} if model is not None else {}
    states = list(optimizer.state.items())
    if not states:
        return "optimizer.state is empty: the state is created by the first optimizer.step()"
    rows = []
    for index, (param, state) in enumerate(states[:max_rows]):
        label = names.get(id(param), f"parameter {index}")
        entries = "  ".join(f"{key}: {_describe(value)}" for key, value in state.items())
        rows.append(f"{label}\n    {entries}")
    if len(states) > max_rows:
        rows.append(f"... and {len(states) - max_rows} more parameters with the same keys")
    return "\n".join(rows)


def _describe(value) -> str:
    if torch.is_tensor(value):
        shape = "x".join(str(size) for size in value.shape) or "scalar"
        return f"{shape} {str(value.dtype).removeprefix('torch.')}"
    return type(value).__name__


def _check_hyperparameter_values(hyperparameters):
    """Check the values among ``lr``, ``beta1``, ``beta2``, ``eps`` and ``weight_decay`` that were given."""
    defaults = {"lr": DEFAULT_LR, "beta1": DEFAULT_BETA1, "beta2": DEFAULT_BETA2, "eps": DEFAULT_EPS,
                "weight_decay": DEFAULT_WEIGHT_DECAY}
    values = {name: hyperparameters.get(name, default) for name, default in defaults.items()}
    _check_hyperparameters(**values)


def _check_step(step, lr, beta1, beta2, eps, weight_decay):
    """Refuse a step number below 1 (the first step is 1) and hyperparameters outside their ranges."""
    check_positive_int(step, "step")
    _check_hyperparameters(lr, beta1, beta2, eps, weight_decay)


def _check_hyperparameters(lr, beta1, beta2, eps, weight_decay):
    if not _is_number(lr) or lr <= 0:
        raise ValueError(f"lr must be a positive number, got {lr!r}")
    for name, beta in [("beta1", beta1), ("beta2", beta2)]:
        if not _is_number(beta) or not 0 <= beta < 1:
            raise ValueError(f"{name} must be a number in [0, 1), got {beta!r}")
    if not _is_number(eps) or eps <= 0:
        raise ValueError(f"eps must be a positive number, got {eps!r}")
    if not _is_number(weight_decay) or weight_decay < 0:
        raise ValueError(f"weight_decay must be a non-negative number, got {weight_decay!r}")


def _check_gradients(initial_param, gradients):
    if not torch.is_tensor(initial_param):
        raise TypeError(f"initial_param must be a torch.Tensor, got {type(initial_param).__name__}")
    if isinstance(gradients, torch.Tensor) or not isinstance(gradients, Sequence) or len(gradients) == 0:
        raise ValueError("gradients must be a non-empty list of tensors, one per step")
    for index, grad in enumerate(gradients):
        if not torch.is_tensor(grad) or grad.shape != initial_param.shape:
            raise ValueError(
                f"gradients[{index}] must be a tensor shaped like initial_param {tuple(initial_param.shape)}"
            )


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
