"""One training set-up, as the planner follows it and the measurement runs it: :class:`TrainingSetup`.

The optimizer (a name of :func:`course_utils.optimizers.make_optimizer` and
its constructor options), the micro-batch (``batch_size`` sequences of
``seq_len`` tokens), Accelerate's ``mixed_precision`` and the micro-batches per
optimizer step. Checked once, when it is made; frozen and hashable, so it is
its own cache key. What the model itself is (its dtype, checkpointing, which
parameters train) is read from the model, not from here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from course_utils.optimizers import check_optimizer_name, resolve_options
from course_utils.validation import check_choice, check_positive_int

__all__ = ["MIXED_PRECISION", "TrainingSetup", "check_mixed_precision"]

# As Accelerate spells them. "bf16" and "fp16" keep fp32 weights, gradients and state and autocast the forward pass.
MIXED_PRECISION = ("no", "bf16", "fp16")


def check_mixed_precision(mixed_precision: object) -> None:
    """Refuse anything but "no" and "bf16", saying why "fp16" is not followed on CPU."""
    check_choice(mixed_precision, "mixed_precision", MIXED_PRECISION)
    if mixed_precision == "fp16":
        raise ValueError(
            "mixed_precision='fp16' is not followed on CPU: Accelerate 1.15 turns on fp16 autocast only on a GPU "
            "(on CPU its Accelerator trains in fp32 and says nothing), and fp16 autocast on a GPU runs CUDA kernels "
            "the course does not follow; use 'bf16' (CPU autocast) or 'no'"
        )


@dataclass(frozen=True)
class TrainingSetup:
    """One training step's choices besides the model; every value checked when it is made.

    - ``optimizer``: a name of :data:`course_utils.optimizers.SUPPORTED_OPTIMIZERS`.
    - ``batch_size``: sequences in one forward pass (the micro-batch when accumulating).
    - ``seq_len``: tokens in each sequence.
    - ``mixed_precision``: "no" or "bf16", as Accelerate means it ("fp16" is refused on CPU).
    - ``gradient_accumulation_steps``: forward and backward passes per optimizer step.
    - ``options``: the optimizer's constructor options, given as a mapping
      (``{"foreach": True}``) and kept as sorted ``(name, value)`` pairs, lists
      turned into tuples, so that the set-up is hashable; :attr:`optimizer_options`
      gives them back as a dict.
    """

    optimizer: str
    batch_size: int
    seq_len: int
    mixed_precision: str = "no"
    gradient_accumulation_steps: int = 1
    options: tuple[tuple[str, object], ...] = field(default=())

    def __post_init__(self):
        check_optimizer_name(self.optimizer)
        options = _options_dict(self.options)
        resolve_options(self.optimizer, options)  # unknown names and bad values refused, naming the option
        object.__setattr__(self, "options", _hashable(options))
        check_positive_int(self.batch_size, "batch_size")
        check_positive_int(self.seq_len, "seq_len")
        check_mixed_precision(self.mixed_precision)
        check_positive_int(self.gradient_accumulation_steps, "gradient_accumulation_steps")

    @property
    def optimizer_options(self) -> dict[str, object]:
        """Return the optimizer's constructor options as a dict (a new one each time)."""
        return dict(self.options)


def _options_dict(options: object) -> dict[str, object]:
    """Return ``options`` (a mapping, or (name, value) pairs) as a dict, refusing anything else."""
    if isinstance(options, Mapping):
        pairs = list(options.items())
    elif isinstance(options, (tuple, list)) and all(isinstance(p, tuple) and len(p) == 2 for p in options):
        pairs = list(options)
    else:
        raise TypeError(f"options must be a dict of optimizer options, such as {{'foreach': True}}; got {options!r}")
    for name, _ in pairs:
        if not isinstance(name, str):
            raise TypeError(f"options: each option's name must be a str, got {name!r}")
    return dict(pairs)


def _hashable(options: dict[str, object]) -> tuple[tuple[str, object], ...]:
    """Return ``options`` as (name, value) pairs sorted by name, lists made tuples, every value hashable."""
    pairs = []
    for name, value in sorted(options.items()):
        if isinstance(value, list):
            value = tuple(value)
        try:
            hash(value)
        except TypeError:
            raise TypeError(f"option {name!r} must be a number, a bool, None or a tuple, got {value!r}") from None
        pairs.append((name, value))
    return tuple(pairs)
