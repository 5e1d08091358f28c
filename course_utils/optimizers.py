"""One builder for every optimizer the course uses, by name, and the options each accepts.

``make_optimizer("adamw", model.parameters(), lr=1e-3)`` builds torch.optim's
SGD, Adam, AdamW and Adafactor (``"torch_adafactor"``), transformers' Adafactor
(``"adafactor"``) and bitsandbytes' Adam8bit and AdamW8bit (lessons 2-5). The
same names and options go to the memory estimates (``course_utils.memory``), so
an estimate and the optimizer it describes are spelled the same way. A learning
rate schedule is added separately (``transformers.get_scheduler``).

bitsandbytes is imported only inside :func:`make_optimizer`, quietly:
``accelerate.notebook_launcher`` refuses to start once it has been imported.
"""

from __future__ import annotations

import inspect
import logging
import math
import warnings
from collections.abc import Iterable

import torch

from course_utils.validation import check_bool, check_fraction, check_non_negative_number

__all__ = ["SUPPORTED_OPTIMIZERS", "make_optimizer"]

# For each optimizer name: the options that change the size of its state, with
# their defaults, and the other constructor options, which are accepted (so one
# dict of options can go to both the estimate and make_optimizer) but change
# nothing in the state.
STATE_OPTIONS: dict[str, dict[str, object]] = {
    "sgd": {"momentum": 0.0},
    # `fused` decides the dtype of Adam's `step` counter (see _scalar_dtype).
    "adam": {"amsgrad": False, "fused": None},
    "adamw": {"amsgrad": False, "fused": None},
    "adafactor": {"beta1": None},
    "torch_adafactor": {},
    "adam8bit": {"min_8bit_size": 4096},
    "adamw8bit": {"min_8bit_size": 4096},
}
OTHER_OPTIONS: dict[str, frozenset[str]] = {
    "sgd": frozenset({"lr", "dampening", "weight_decay", "nesterov", "maximize", "foreach", "differentiable", "fused"}),
    "adam": frozenset(
        {
            "lr", "betas", "eps", "weight_decay", "maximize", "foreach", "capturable", "differentiable",
            "decoupled_weight_decay",
        }
    ),
    "adamw": frozenset(
        {"lr", "betas", "eps", "weight_decay", "maximize", "foreach", "capturable", "differentiable"}
    ),
    # scale_parameter, relative_step and warmup_init change how the step size is
    # computed, not what is stored: transformers' Adafactor always keeps `RMS`.
    "adafactor": frozenset(
        {"lr", "eps", "clip_threshold", "decay_rate", "weight_decay", "scale_parameter", "relative_step", "warmup_init"}
    ),
    "torch_adafactor": frozenset({"lr", "beta2_decay", "eps", "d", "weight_decay", "foreach", "maximize"}),
    "adam8bit": frozenset({"lr", "betas", "eps", "weight_decay"}),
    "adamw8bit": frozenset({"lr", "betas", "eps", "weight_decay"}),
}
# The other optimizers torch ships, built with any of their constructor options. Left
# out: LBFGS (its step takes a closure that recomputes the loss), SparseAdam (sparse
# gradients only) and Muon (2-D parameters only): none fits a plain training step.
_MORE_TORCH_OPTIMIZERS: dict[str, type] = {
    "adadelta": torch.optim.Adadelta,
    "adagrad": torch.optim.Adagrad,
    "adamax": torch.optim.Adamax,
    "asgd": torch.optim.ASGD,
    "nadam": torch.optim.NAdam,
    "radam": torch.optim.RAdam,
    "rmsprop": torch.optim.RMSprop,
    "rprop": torch.optim.Rprop,
}
SUPPORTED_OPTIMIZERS: tuple[str, ...] = (*STATE_OPTIONS, *_MORE_TORCH_OPTIMIZERS)


def check_optimizer_name(optimizer: object) -> str:
    """Return ``optimizer`` if it is a supported optimizer name; raise ValueError listing them otherwise."""
    if not isinstance(optimizer, str) or optimizer not in SUPPORTED_OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {', '.join(SUPPORTED_OPTIMIZERS)}; got {optimizer!r}")
    return optimizer


def resolve_options(name: str, options: dict[str, object]) -> dict[str, object]:
    """Return the state-changing options of ``name``, defaults filled in; reject unknown option names."""
    if name in _MORE_TORCH_OPTIMIZERS:
        accepted = set(inspect.signature(_MORE_TORCH_OPTIMIZERS[name]).parameters) - {"params"}
        for option in options:
            if option not in accepted:
                raise TypeError(
                    f"unknown option {option!r} for optimizer {name!r}; accepted options: {', '.join(sorted(accepted))}"
                )
        _check_option_values(name, options)
        return {}
    accepted = set(STATE_OPTIONS[name]) | OTHER_OPTIONS[name]
    for option in options:
        if option not in accepted:
            raise TypeError(
                f"unknown option {option!r} for optimizer {name!r}; accepted options: {', '.join(sorted(accepted))}"
            )
    _check_option_values(name, options)
    resolved = {key: options.get(key, default) for key, default in STATE_OPTIONS[name].items()}
    if "momentum" in resolved:
        momentum = resolved["momentum"]
        if isinstance(momentum, bool) or not isinstance(momentum, (int, float)) or not 0 <= momentum < math.inf:
            raise ValueError(f"option 'momentum' must be a number >= 0, got {momentum!r}")
    if "amsgrad" in resolved and not isinstance(resolved["amsgrad"], bool):
        raise ValueError(f"option 'amsgrad' must be True or False, got {resolved['amsgrad']!r}")
    if "beta1" in resolved:
        beta1 = resolved["beta1"]
        if beta1 is not None and (isinstance(beta1, bool) or not isinstance(beta1, (int, float)) or not 0 <= beta1 < 1):
            raise ValueError(f"option 'beta1' must be None or a number in [0, 1), got {beta1!r}")
    if "min_8bit_size" in resolved:
        size = resolved["min_8bit_size"]
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ValueError(f"option 'min_8bit_size' must be an int >= 0, got {size!r}")
    return resolved


# Options that are True or False (None too for foreach and fused: "let torch choose").
_SWITCHES = frozenset({"maximize", "capturable", "differentiable", "nesterov", "decoupled_weight_decay", "centered",
                       "scale_parameter", "relative_step", "warmup_init"})


def _check_option_values(name: str, options: dict[str, object]) -> None:
    """Refuse the option values torch takes silently (``lr=inf``, ``momentum=nan``) or answers obscurely (``betas=0.9``)."""
    for option, value in options.items():
        label = f"option {option!r}"
        # SGD's momentum sizes its state: checked with the state options (resolve_options).
        if (option in ("lr", "weight_decay") or option == "momentum" and name != "sgd") and not isinstance(value, torch.Tensor):
            if not (option == "lr" and value is None and name == "adafactor"):  # None: Adafactor's relative step
                check_non_negative_number(value, label)
        elif option == "eps" and name not in ("adafactor", "torch_adafactor"):  # theirs: a pair, or None
            check_non_negative_number(value, label)
        elif option == "betas":
            if not isinstance(value, (tuple, list)) or len(value) != 2:
                raise ValueError(f"{label} must be a pair of numbers in [0, 1), such as (0.9, 0.999); got {value!r}")
            for beta in value:
                check_fraction(beta, f"{label} (each of the pair)")
        elif option in _SWITCHES or (option in ("foreach", "fused") and value is not None):
            check_bool(value, label)
    if options.get("foreach") and options.get("fused"):
        raise ValueError("options 'foreach' and 'fused' cannot both be True: they are two implementations of one step")


def make_optimizer(name: str, params: Iterable[torch.Tensor], **options: object) -> torch.optim.Optimizer:
    """Return the optimizer called ``name`` (see :data:`SUPPORTED_OPTIMIZERS`) over ``params``.

    ``options`` go to its constructor: torch.optim's SGD, Adam, AdamW and
    Adafactor (``"torch_adafactor"``), transformers' Adafactor
    (``"adafactor"``), bitsandbytes' Adam8bit and AdamW8bit, and torch.optim's
    Adadelta, Adagrad, Adamax, ASGD, NAdam, RAdam, RMSprop and Rprop by their
    lower-case names.
    """
    name = check_optimizer_name(name)
    if isinstance(params, torch.nn.Module):
        raise TypeError("params must be the tensors to optimize, such as model.parameters(), not the model itself")
    resolve_options(name, options)
    if name in _MORE_TORCH_OPTIMIZERS:
        return _MORE_TORCH_OPTIMIZERS[name](params, **options)
    if name == "sgd":
        return torch.optim.SGD(params, **options)
    if name == "adam":
        return torch.optim.Adam(params, **options)
    if name == "adamw":
        return torch.optim.AdamW(params, **options)
    if name == "torch_adafactor":
        return torch.optim.Adafactor(params, **options)
    if name == "adafactor":
        from transformers.optimization import Adafactor

        return Adafactor(params, **options)
    bnb_optim = _import_bitsandbytes_optim()
    optimizer_class = bnb_optim.Adam8bit if name == "adam8bit" else bnb_optim.AdamW8bit
    return optimizer_class(params, **options)


def _import_bitsandbytes_optim():
    """Import and return ``bitsandbytes.optim``, without its two harmless import-time messages."""
    # On CPUs with AVX512-BF16, importing bitsandbytes logs a warning that the optional
    # `kernels` package (a faster 4-bit matmul) is missing; the 8-bit optimizers do not use it.
    cpu_ops_logger = logging.getLogger("bitsandbytes.backends.cpu.ops")
    previous_level = cpu_ops_logger.level
    cpu_ops_logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            # Its torch.compile decorators import torch's mkldnn helpers, which use a
            # deprecated TorchScript decorator: torch's own business, nothing to act on.
            warnings.filterwarnings(
                "ignore", message="`torch.jit.script_method` is deprecated", category=DeprecationWarning
            )
            import bitsandbytes.optim
    finally:
        cpu_ops_logger.setLevel(previous_level)
    return bitsandbytes.optim
