"""Exercises of lesson 2: AdamW's moving averages and what they cost in memory.

- ``q1``: write one AdamW step; checked against ``torch.optim.AdamW`` over several steps
- ``q2``: estimate the memory of AdamW's state for distilbert-base-cased, in MiB
- ``q3``: measure the state an optimizer really holds (elements and bytes)

The checks recognise the usual mistakes by running them: each known mistake
is written out below as a small function, and a learner's answer that behaves
like one of them gets that mistake's explanation.
"""

from __future__ import annotations

import math
import warnings

import torch

from course_utils import adamw, memory
from course_utils.exercises.core import CodeExercise, Exercise, Incorrect, ValueExercise, a_or_an, describe_value

# --------------------------------------------------------------------------- q1: one AdamW step

STEP_TOLERANCE = 1e-6
"""Largest difference (absolute, in the tensors' units) accepted between the learner's step and torch's."""

# Two problems the step is tried on. float64, so that a right answer agrees with torch to ~1e-15
# and only a real mistake can exceed STEP_TOLERANCE.
#  - "typical": gradients of order 1, weight decay on, hyperparameters away from the defaults
#    (a function that ignores its arguments shows up);
#  - "tiny gradients": gradients of order 1e-6, where eps (1e-8) matters inside or outside the root.
STEP_PROBLEMS = {
    "typical": dict(shape=(4, 3), scale=1.0, num_steps=6, seed=0,
                    hyperparameters=dict(lr=0.05, beta1=0.8, beta2=0.95, eps=1e-8, weight_decay=0.1)),
    "tiny gradients": dict(shape=(5,), scale=1e-6, num_steps=4, seed=1,
                           hyperparameters=dict(lr=0.01, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0)),
}


def step_problem(name):
    """Return ``(initial_param, gradients, hyperparameters)`` of the problem ``name`` in :data:`STEP_PROBLEMS`."""
    problem = STEP_PROBLEMS[name]
    generator = torch.Generator().manual_seed(problem["seed"])
    initial_param = torch.randn(problem["shape"], generator=generator, dtype=torch.float64)
    gradients = [
        problem["scale"] * torch.randn(problem["shape"], generator=generator, dtype=torch.float64)
        for _ in range(problem["num_steps"])
    ]
    return initial_param, gradients, dict(problem["hyperparameters"])


def _step_without_bias_correction(param, grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps, weight_decay):
    exp_avg = beta1 * exp_avg + (1 - beta1) * grad
    exp_avg_sq = beta2 * exp_avg_sq + (1 - beta2) * grad**2
    param = param - lr * weight_decay * param - lr * exp_avg / (exp_avg_sq.sqrt() + eps)
    return param, exp_avg, exp_avg_sq


def _step_correcting_only_the_first_moment(param, grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps, weight_decay):
    exp_avg = beta1 * exp_avg + (1 - beta1) * grad
    exp_avg_sq = beta2 * exp_avg_sq + (1 - beta2) * grad**2
    exp_avg_hat = exp_avg / (1 - beta1**step)
    param = param - lr * weight_decay * param - lr * exp_avg_hat / (exp_avg_sq.sqrt() + eps)
    return param, exp_avg, exp_avg_sq


def _step_correcting_only_the_second_moment(param, grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps, weight_decay):
    exp_avg = beta1 * exp_avg + (1 - beta1) * grad
    exp_avg_sq = beta2 * exp_avg_sq + (1 - beta2) * grad**2
    exp_avg_sq_hat = exp_avg_sq / (1 - beta2**step)
    param = param - lr * weight_decay * param - lr * exp_avg / (exp_avg_sq_hat.sqrt() + eps)
    return param, exp_avg, exp_avg_sq


def _step_storing_the_corrected_averages(param, grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps, weight_decay):
    exp_avg = beta1 * exp_avg + (1 - beta1) * grad
    exp_avg_sq = beta2 * exp_avg_sq + (1 - beta2) * grad**2
    exp_avg_hat = exp_avg / (1 - beta1**step)
    exp_avg_sq_hat = exp_avg_sq / (1 - beta2**step)
    param = param - lr * weight_decay * param - lr * exp_avg_hat / (exp_avg_sq_hat.sqrt() + eps)
    return param, exp_avg_hat, exp_avg_sq_hat


def _step_with_decay_in_the_gradient(param, grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps, weight_decay):
    return adamw.adam_l2_step(param, grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps, weight_decay)


def _step_with_decay_not_scaled_by_lr(param, grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps, weight_decay):
    new_param, exp_avg, exp_avg_sq = adamw.adamw_step(param, grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps, 0.0)
    return new_param - weight_decay * param, exp_avg, exp_avg_sq


def _squared_ema_of_the_gradient(param, grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps, weight_decay):
    return _step_with_second_moment_of(grad, param, grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps, weight_decay)


def _squared_ema_of_the_absolute_gradient(param, grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps, weight_decay):
    return _step_with_second_moment_of(
        grad.abs(), param, grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps, weight_decay
    )


def _squared_ema_of_the_first_moment(param, grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps, weight_decay):
    new_exp_avg = beta1 * exp_avg + (1 - beta1) * grad
    return _step_with_second_moment_of(
        new_exp_avg**2, param, grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps, weight_decay
    )


def _step_with_second_moment_of(quantity, param, grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps, weight_decay):
    """AdamW, except that the second moment averages ``quantity`` instead of ``grad**2``."""
    exp_avg = beta1 * exp_avg + (1 - beta1) * grad
    exp_avg_sq = beta2 * exp_avg_sq + (1 - beta2) * quantity
    exp_avg_hat = exp_avg / (1 - beta1**step)
    exp_avg_sq_hat = exp_avg_sq / (1 - beta2**step)
    param = param - lr * weight_decay * param - lr * exp_avg_hat / (exp_avg_sq_hat.sqrt() + eps)
    return param, exp_avg, exp_avg_sq


def _step_with_eps_inside_the_root(param, grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps, weight_decay):
    exp_avg = beta1 * exp_avg + (1 - beta1) * grad
    exp_avg_sq = beta2 * exp_avg_sq + (1 - beta2) * grad**2
    exp_avg_hat = exp_avg / (1 - beta1**step)
    exp_avg_sq_hat = exp_avg_sq / (1 - beta2**step)
    param = param - lr * weight_decay * param - lr * exp_avg_hat / (exp_avg_sq_hat + eps).sqrt()
    return param, exp_avg, exp_avg_sq


def _step_ignoring_its_hyperparameters(param, grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps, weight_decay):
    return adamw.adamw_step(param, grad, exp_avg, exp_avg_sq, step)


# Each known mistake, and what a learner whose step behaves like it reads.
KNOWN_STEP_MISTAKES = [
    (
        _step_storing_the_corrected_averages,
        "Your step returns the bias-corrected averages as the new state. Keep the corrections for the update "
        "only: return the *uncorrected* `exp_avg` and `exp_avg_sq`, or the next step corrects them a second time.",
    ),
    (
        _step_without_bias_correction,
        "Your step has no bias correction. Both moving averages start at zero, so early on they are too small: "
        "divide `exp_avg` by `1 - beta1**step` and `exp_avg_sq` by `1 - beta2**step` before using them "
        "(the stored `exp_avg` and `exp_avg_sq` stay uncorrected).",
    ),
    (
        _step_correcting_only_the_first_moment,
        "Only the first moment is bias-corrected. `exp_avg_sq` starts at zero too: divide it by `1 - beta2**step` as well.",
    ),
    (
        _step_correcting_only_the_second_moment,
        "Only the second moment is bias-corrected. `exp_avg` starts at zero too: divide it by `1 - beta1**step` as well.",
    ),
    (
        _step_with_decay_in_the_gradient,
        "Your weight decay goes through the gradient (`grad + weight_decay * param`): that is Adam with L2, "
        "not AdamW. AdamW shrinks the weights directly, `param - lr * weight_decay * param`, and leaves the "
        "gradient, and so both moving averages, untouched.",
    ),
    (
        _step_with_decay_not_scaled_by_lr,
        "Your weight decay is not scaled by the learning rate. AdamW shrinks the weights by `lr * weight_decay * param`.",
    ),
    (
        _squared_ema_of_the_gradient,
        "`exp_avg_sq` averages the gradient itself. It is the moving average of the *squared* gradient: "
        "`(1 - beta2) * grad**2`.",
    ),
    (
        _squared_ema_of_the_absolute_gradient,
        "`exp_avg_sq` averages the gradient's absolute value. It is the moving average of the *squared* gradient: "
        "`(1 - beta2) * grad**2`.",
    ),
    (
        _squared_ema_of_the_first_moment,
        "`exp_avg_sq` averages the square of the first moment (`exp_avg**2`). It averages the square of "
        "each new gradient: `(1 - beta2) * grad**2`.",
    ),
    (
        _step_with_eps_inside_the_root,
        "`eps` is inside the square root. AdamW adds it after the root: `exp_avg_sq_hat.sqrt() + eps`. "
        "The difference shows when gradients are tiny, as in one of the problems the check uses.",
    ),
    (
        _step_ignoring_its_hyperparameters,
        "Your step gives the right answer for torch's default hyperparameters only: use the arguments "
        "`lr`, `beta1`, `beta2`, `eps` and `weight_decay` rather than fixed numbers.",
    ),
]


class AdamWStep(Exercise):
    title = "Exercise 1"
    variables = ["my_adamw_step"]
    hints = [
        "Work down the equations above: update `exp_avg`, then `exp_avg_sq`, then correct both for their start at zero, "
        "then move `param`.",
        "The second moment averages the square of the *gradient*: `beta2 * exp_avg_sq + (1 - beta2) * grad**2`. "
        "Bias correction divides by `1 - beta1**step` and `1 - beta2**step`; `step` is 1 on the first call.",
        "`eps` goes outside the square root: `exp_avg_hat / (exp_avg_sq_hat.sqrt() + eps)`. The decay shrinks "
        "the weights directly: `param - lr * weight_decay * param`. Return the *uncorrected* averages.",
    ]
    solution_code = """
        def my_adamw_step(param, grad, exp_avg, exp_avg_sq, step,
                          lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01):
            exp_avg = beta1 * exp_avg + (1 - beta1) * grad
            exp_avg_sq = beta2 * exp_avg_sq + (1 - beta2) * grad**2
            exp_avg_hat = exp_avg / (1 - beta1**step)
            exp_avg_sq_hat = exp_avg_sq / (1 - beta2**step)
            param = param - lr * weight_decay * param
            param = param - lr * exp_avg_hat / (exp_avg_sq_hat.sqrt() + eps)
            return param, exp_avg, exp_avg_sq
    """
    correct_message = (
        f"Your step agrees with `torch.optim.AdamW` to {STEP_TOLERANCE:g} on every tensor, at every step, "
        "with and without weight decay."
    )

    def check_answer(self, my_adamw_step):
        if not callable(my_adamw_step):
            raise Incorrect(f"`my_adamw_step` should be a function (`def my_adamw_step(...):`), but it is {describe_value(my_adamw_step)}.")
        differences = []
        for name in STEP_PROBLEMS:
            initial_param, gradients, hyperparameters = step_problem(name)
            mine = self._run(my_adamw_step, initial_param, gradients, hyperparameters)
            expected = adamw.run_torch_adamw(initial_param, gradients, **hyperparameters)
            difference = first_difference(mine, expected)
            if difference is not None:
                differences.append((name, difference))
        if not differences:
            return None
        mistake = self._matching_mistake(my_adamw_step)
        if mistake is not None:
            raise Incorrect(mistake)
        problem, (step, key, gap) = differences[0]
        raise Incorrect(_explain_difference(problem, step, key, gap))

    def _run(self, function, initial_param, gradients, hyperparameters):
        """Return the learner's trajectory, like ``adamw.run_steps``, checking what each call returns."""
        param = initial_param.clone()
        exp_avg, exp_avg_sq = torch.zeros_like(param), torch.zeros_like(param)
        history = []
        for step, grad in enumerate(gradients, start=1):
            result = self.call_learner(
                function, param.clone(), grad.clone(), exp_avg.clone(), exp_avg_sq.clone(), step, **hyperparameters
            )
            if not (isinstance(result, (tuple, list)) and len(result) == 3 and all(torch.is_tensor(t) for t in result)):
                raise Incorrect(
                    "`my_adamw_step` should return three tensors, `return param, exp_avg, exp_avg_sq`, "
                    f"but it returned {_describe_result(result)}."
                )
            for label, tensor in zip(("param", "exp_avg", "exp_avg_sq"), result):
                if tensor.device.type == "meta" or not (tensor.is_floating_point()):
                    raise Incorrect(f"The `{label}` your step returns holds no real numbers ({tensor.dtype} on {tensor.device}).")
                if tensor.shape != param.shape:
                    raise Incorrect(
                        f"The `{label}` your step returns has shape {tuple(tensor.shape)}; it should keep the "
                        f"shape of `param`, {tuple(param.shape)}."
                    )
            param, exp_avg, exp_avg_sq = (t.detach().to(torch.float64) for t in result)
            history.append({"param": param, "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq})
        return history

    def _matching_mistake(self, function):
        """Return the explanation of the known mistake that behaves like ``function`` on every problem, or None."""
        for mistake, explanation in KNOWN_STEP_MISTAKES:
            if all(self._behaves_like(function, mistake, name) for name in STEP_PROBLEMS):
                return explanation
        return None

    def _behaves_like(self, function, mistake, problem):
        initial_param, gradients, hyperparameters = step_problem(problem)
        theirs = adamw.run_steps(mistake, initial_param, gradients, **hyperparameters)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mine = self._run(function, initial_param, gradients, hyperparameters)
        return first_difference(mine, theirs) is None


def first_difference(history, expected):
    """Return ``(step, key, largest gap)`` of the first tensor that differs by more than the tolerance, or None."""
    for step, (mine, theirs) in enumerate(zip(history, expected), start=1):
        for key in ("exp_avg", "exp_avg_sq", "param"):
            a, b = mine[key], theirs[key]
            # A mistake may give NaN or infinity; the same NaN or infinity at the same place is agreement.
            same = (a == b) | (a.isnan() & b.isnan())
            gap = torch.where(same, 0.0, (a - b).abs()).max().item()
            if not gap <= STEP_TOLERANCE:  # `not <=` also catches a NaN gap
                return step, key, gap
    return None


def _explain_difference(problem, step, key, gap):
    where = f"after step {step} of the {problem!r} problem"
    if not math.isfinite(gap):
        return (
            f"Your `{key}` is not finite (NaN or infinity) {where}. Is a bias correction dividing by "
            "`1 - beta**0`? `step` is 1 on the first call."
        )
    if key == "exp_avg":
        return f"`exp_avg` differs from torch's {where}: it should be `beta1 * exp_avg + (1 - beta1) * grad`."
    if key == "exp_avg_sq":
        return f"`exp_avg_sq` differs from torch's {where}: it should be `beta2 * exp_avg_sq + (1 - beta2) * grad**2`."
    return (
        f"Both moving averages are right, but `param` differs from torch's by up to {gap:.2e} {where}. "
        "Check the bias corrections, where `eps` goes, and the weight decay."
    )


def _describe_result(result):
    if isinstance(result, (tuple, list)):
        return f"{a_or_an(type(result).__name__)} of {len(result)} item{'s' if len(result) != 1 else ''}"
    return describe_value(result)


# --------------------------------------------------------------------------- q2: estimate the state

# Exercise 2 asks about bert-base-cased, a model the lesson prints nothing about, so that no stored
# output after the exercise shows its answer (the lesson then measures distilbert-base-cased).
BERT_BASE_CASED_PARAMETERS = 108_311_810  # BertForSequenceClassification(BertConfig(vocab_size=28_996)), counted
LLAMA_7B_PARAMETERS = 6_607_343_616  # the "Llama-2-7B body (no LM head)" of course_utils.models.well_known_architectures()
MIB = 1024**2
GIB = 1024**3


class EstimateAdamWState(ValueExercise):
    title = "Exercise 2"
    variables = ["estimated_mib"]
    expected = BERT_BASE_CASED_PARAMETERS * 8 / MIB
    # Rounding to the nearest MiB is fine; every mistake below is off by far more.
    rel_tol = 2e-3
    unit = "MiB"
    hints = [
        "AdamW keeps two tensors shaped like every parameter, `exp_avg` and `exp_avg_sq`, each in fp32.",
        "fp32 is 4 bytes per element, so the state costs 2 x 4 = 8 bytes per parameter.",
        "Multiply `bert_parameters` by 8 bytes, then divide by 1024**2 to get MiB.",
    ]
    solution_code = "estimated_mib = bert_parameters * 8 / 1024**2"
    correct_message = "About twice the weights themselves (4 bytes per parameter), before a single activation is stored."

    # (bytes per parameter, divisor) of each known mistake, with its explanation.
    mistakes = [
        (4, MIB, "That is one state (4 bytes per parameter). AdamW keeps two: `exp_avg` and `exp_avg_sq`."),
        (12, MIB, "That counts the weights too (12 bytes per parameter). Only the optimizer's two states are asked."),
        (16, MIB, "16 bytes per parameter is the whole training rule (weights, gradients and two states). "
                  "Only the optimizer's two states are asked."),
        (64, MIB, "That is 64 per parameter: 8 bytes is 64 *bits*. Count bytes: two fp32 states of 4 bytes each."),
        (8, 10**6, "That is in MB (10**6 bytes), the slides' rounding. The course uses MiB: divide by 1024**2."),
        (8, 1, "That is in bytes. Convert to MiB: divide by 1024**2."),
        (8, 1024, "That is in KiB. Convert to MiB: divide by 1024**2."),
        (8, GIB, "That is in GiB (you divided by 1024**3). Convert to MiB: divide by 1024**2."),
        (2, 1, "That is the number of state *elements* (2 per parameter), not memory. Each fp32 element takes 4 bytes."),
    ]

    def diagnose(self, name, value, expected):
        number = value  # already read as a Python number
        for bytes_per_parameter, divisor, explanation in self.mistakes:
            if math.isclose(number, BERT_BASE_CASED_PARAMETERS * bytes_per_parameter / divisor, rel_tol=self.rel_tol):
                return explanation
        return None


# --------------------------------------------------------------------------- q3: measure the state


def _reference_state_size(optimizer):
    return memory.count_optimizer_state_elements(optimizer), memory.measure_optimizer_state(optimizer)


class SharedTableSGD(torch.optim.SGD):
    """SGD with momentum that also keeps, for every parameter, a reference to one shared lookup table.

    It stands in for optimizers such as bitsandbytes' 8-bit Adam, whose
    parameters share their quantization tables: a shared tensor is one
    allocation and must be counted once.
    """

    def __init__(self, params, table_size=256, **options):
        super().__init__(params, momentum=0.9, **options)
        self.shared_table = torch.linspace(-1, 1, table_size)

    @torch.no_grad()
    def step(self, closure=None):
        loss = super().step(closure)
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is not None:
                    self.state[param]["table"] = self.shared_table
        return loss


def stepped_optimizer(optimizer_factory, model_factory, seed):
    """Return an optimizer after one step on a small model; the model is kept alive by the optimizer."""
    torch.manual_seed(seed)
    model = model_factory()
    optimizer = optimizer_factory(model.parameters())
    inputs = torch.randn(4, model[0].in_features, dtype=model[0].weight.dtype)
    model(inputs).float().pow(2).mean().backward()
    optimizer.step()
    return optimizer


def small_mlp(dtype=torch.float32):
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3)).to(dtype)


class MeasureOptimizerState(CodeExercise):
    title = "Exercise 3"
    variables = ["optimizer_state_size"]
    def reference(self, optimizer):
        return _reference_state_size(optimizer)

    hints = [
        "`optimizer.state` maps each parameter to a dict such as `{'step': ..., 'exp_avg': ..., 'exp_avg_sq': ...}`: "
        "loop over `optimizer.state.values()`, then over each dict's values.",
        "For a tensor `t`: `t.numel()` elements of `t.element_size()` bytes each. Skip values that are not tensors "
        "(some optimizers keep `step` as a Python int): `torch.is_tensor(value)`.",
        "Two entries can hold the same storage: one shared tensor, or views of one flat buffer. Count each storage "
        "once, whole: remember it by `t.untyped_storage().data_ptr()`, count `t.untyped_storage().nbytes()` bytes, "
        "that is `nbytes // t.element_size()` elements, and skip it the second time. Never copy a tensor to measure it.",
    ]
    solution_code = """
        def optimizer_state_size(optimizer):
            num_elements, num_bytes, seen = 0, 0, set()
            for state in optimizer.state.values():
                for value in state.values():
                    if not torch.is_tensor(value):
                        continue  # e.g. a Python int step: no tensor memory
                    storage = value.untyped_storage()
                    if storage.data_ptr() in seen:
                        continue  # one allocation shared by several entries
                    seen.add(storage.data_ptr())
                    num_bytes += storage.nbytes()  # the whole allocation, not the part this view shows
                    num_elements += storage.nbytes() // value.element_size()
            return num_elements, num_bytes
    """
    correct_message = "Your count matches `course_utils.memory`'s measurement on every optimizer tried."

    # How messages name each optimizer tried, with the factories that build it.
    case_specs = [
        ("AdamW on a small fp32 network", lambda params: torch.optim.AdamW(params), small_mlp),
        (
            "AdamW on the same network in bfloat16",
            lambda params: torch.optim.AdamW(params),
            lambda: small_mlp(torch.bfloat16),
        ),
        ("SGD with momentum", lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9), small_mlp),
        ("an optimizer whose parameters share one lookup table", lambda params: SharedTableSGD(params, lr=0.1), small_mlp),
        ("an optimizer whose `step` is a Python int", lambda params: _IntStepAdam(params), small_mlp),
        ("an optimizer whose states are views of one flat buffer", lambda params: FlatBufferMomentum(params),
         small_mlp),
    ]

    def cases(self):
        self._descriptions = {}
        cases = []
        for description, optimizer_factory, model_factory in self.case_specs:
            optimizer = stepped_optimizer(optimizer_factory, model_factory, seed=0)
            self._descriptions[id(optimizer)] = description
            cases.append((optimizer,))
        return cases

    def describe_case(self, args):
        return f"for {self._descriptions.get(id(args[0]), 'an optimizer')}"

    def check_answer(self, optimizer_state_size):
        if not callable(optimizer_state_size):
            raise Incorrect(
                f"`optimizer_state_size` should be a function (`def optimizer_state_size(optimizer):`), "
                f"but it is {describe_value(optimizer_state_size)}."
            )
        for (optimizer,) in self.cases():
            expected = self.reference(optimizer)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    got = self.call_learner(optimizer_state_size, optimizer)
                except Incorrect as signal:
                    if isinstance(optimizer, _IntStepAdam) and isinstance(signal.__cause__, (AttributeError, TypeError)):
                        raise Incorrect(
                            f"{signal.reason}\nThis optimizer keeps `step` as a Python int, which holds no tensor "
                            "memory: skip values that are not tensors (`torch.is_tensor(value)`)."
                        ) from signal.__cause__
                    raise
            if any("copy construct" in str(warning.message) for warning in caught):
                raise Incorrect(
                    "Your function copies tensors to measure them (`torch.tensor(t)` warns about it): for a "
                    f"7B-parameter model the copies would need another {LLAMA_7B_PARAMETERS * 8 / GIB:.0f} GiB. "
                    "Read `t.numel()` and `t.element_size()` on the tensor itself."
                )
            self.compare("optimizer_state_size", got, expected, (optimizer,))

    def compare(self, name, got, expected, args):
        if not (isinstance(got, (tuple, list)) and len(got) == 2):
            raise Incorrect(
                "`optimizer_state_size` should return two numbers, `return num_elements, num_bytes`, "
                f"but it returned {_describe_result(got)} {self.describe_case(args)}."
            )
        super().compare(name, tuple(got), expected, args)

    def diagnose(self, got, expected, args):
        (optimizer,) = args
        got_elements, got_bytes = (_as_int(value) for value in got)
        if any(isinstance(value, float) and not math.isfinite(value) for value in (got_elements, got_bytes)):
            return (
                f"Your function returned {got_elements} elements and {got_bytes} bytes {self.describe_case(args)}: "
                "not a count. A division by zero or an overflow?"
            )
        elements, num_bytes = expected
        if (got_elements, got_bytes) == (num_bytes, elements):
            return "The two numbers are swapped: return `num_elements, num_bytes`, in that order."
        if got_elements == elements and got_bytes is not None and math.isclose(got_bytes, num_bytes / MIB):
            return "The size is in MiB; return it in bytes (the lesson converts to MiB when it prints)."
        if got_elements == elements and got_bytes == 4 * elements and got_bytes != num_bytes:
            return (
                f"Your size assumes 4 bytes per element, but {self.describe_case(args)} each element takes "
                "`t.element_size()` bytes (2 in bfloat16)."
            )
        if isinstance(optimizer, FlatBufferMomentum) and got_elements is not None and got_elements < elements:
            return (
                "Your count stops at the part of the buffer the first view shows. The states are views of one flat "
                "buffer, one allocation: count the whole storage once, `t.untyped_storage().nbytes()` bytes."
            )
        shared = isinstance(optimizer, SharedTableSGD)
        if shared and got_elements is not None and got_elements > elements:
            return (
                "Your count includes the shared lookup table once per parameter. It is one tensor, one allocation: "
                "count each storage once (`t.untyped_storage().data_ptr()` identifies it)."
            )
        steps = sum(1 for state in optimizer.state.values() if torch.is_tensor(state.get("step")))
        if steps and got_elements == elements - steps:
            return "Your count leaves out the `step` tensors: they are state too (one 0-d tensor per parameter)."
        if got_elements == elements and got_bytes != num_bytes:
            return f"The number of elements is right {self.describe_case(args)}, but the number of bytes is not."
        return None


class FlatBufferMomentum(torch.optim.Optimizer):
    """SGD with momentum whose momentum tensors are views of one flat fp32 buffer, as in fused or ZeRO optimizers.

    Each parameter's ``momentum_buffer`` is a view of ``flat_buffer``; the views fill its start
    (53 numbers for :func:`small_mlp`), and the whole allocation, ``FLAT_BUFFER_ELEMENTS``
    floats, is the memory the optimizer holds.
    """

    def __init__(self, params, lr=0.1, momentum=0.9, buffer_elements=None):
        super().__init__(params, dict(lr=lr, momentum=momentum))
        parameters = [p for group in self.param_groups for p in group["params"]]
        needed = sum(p.numel() for p in parameters)
        self.flat_buffer = torch.zeros(buffer_elements or FLAT_BUFFER_ELEMENTS, dtype=torch.float32)
        if needed > self.flat_buffer.numel():
            raise ValueError(f"buffer_elements must be at least {needed}, the parameters' elements")
        offset = 0
        for p in parameters:
            view = self.flat_buffer[offset:offset + p.numel()].view_as(p)
            self.state[p]["momentum_buffer"] = view
            offset += p.numel()

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is not None:
                    buffer = self.state[param]["momentum_buffer"]
                    buffer.mul_(group["momentum"]).add_(param.grad)
                    param.add_(buffer, alpha=-group["lr"])


# One allocation of 1,010 fp32 numbers (4,040 bytes): the small network's 53 parameters take the
# start of it, and the rest is memory the optimizer holds all the same.
FLAT_BUFFER_ELEMENTS = 1_010


class _IntStepAdam(torch.optim.Optimizer):
    """A minimal Adam whose ``step`` counter is a Python int, as in transformers' Adafactor and bitsandbytes."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                state = self.state[param]
                if not state:
                    state.update(step=0, exp_avg=torch.zeros_like(param), exp_avg_sq=torch.zeros_like(param))
                state["step"] += 1
                state["exp_avg"].lerp_(param.grad, 1 - beta1)
                state["exp_avg_sq"].mul_(beta2).addcmul_(param.grad, param.grad, value=1 - beta2)
                param.addcdiv_(state["exp_avg"], state["exp_avg_sq"].sqrt().add_(group["eps"]), value=-group["lr"])


def _as_int(value):
    if torch.is_tensor(value) and value.numel() == 1:
        value = value.item()
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


q1 = AdamWStep()
q2 = EstimateAdamWState()
q3 = MeasureOptimizerState()
