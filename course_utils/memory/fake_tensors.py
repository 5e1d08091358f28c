"""The planner's fake-tensor tools: a model's fake copy, and what a step on fake tensors needs answered or refused.

A fake tensor (torch's ``FakeTensorMode``) has a shape, a dtype and a device
but no data: no memory is allocated, no arithmetic done. :func:`fake_copy`
copies a model onto fake tensors (the first blocks only, for the probes);
:func:`fake_optimizer` builds the step's optimizer over them. What a fake
step cannot do by itself is answered where the real step's answer is known
(:func:`an_unpadded_batch`: transformers' mask builder; :class:`ScalarsInOptimizerStep`:
an optimizer's value reads; :func:`modules_cast_in_forward`: a cast that changes
nothing) and refused otherwise (:func:`refusing_what_needs_values`).
:func:`quietly` silences what the library says while a copy runs;
:func:`fake_process_group` makes this process one process of a layout's, in a
group whose collectives send nothing.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import warnings

import torch
from torch._subclasses.fake_tensor import (
    DataDependentOutputException, DynamicOutputShapeException, FakeTensorMode,
)
from torch.utils._python_dispatch import TorchDispatchMode

from course_utils.memory.plan_cache import PlannerRefused
from course_utils.memory.probes import config_with_layers, repeated_layers
from course_utils.memory.qlora import fake_quant_states
from course_utils.memory.setup import TrainingSetup
from course_utils.optimizers import make_optimizer

BNB_OPTIMIZERS = ("adam8bit", "adamw8bit", "paged_adamw8bit", "paged_adamw32bit")


def fake_copy(model: torch.nn.Module, mode: FakeTensorMode, layers: int | None) -> torch.nn.Module:
    """Return a copy of ``model`` whose tensors are fake CPU tensors, keeping only the first ``layers`` blocks.

    ``copy.deepcopy`` with a memo that maps each parameter, buffer and tensor
    attribute to a fake twin: ties stay tied, ``requires_grad``, checkpointing
    flags and wrappers (LoRA, checkpoint wrappers) are copied with the modules.
    """
    memo: dict[int, object] = {}
    dropped: set[int] = set()
    if layers is not None:
        count, layer_list = repeated_layers(model)
        # The blocks left out need no fake twins: most of a deep model's tensors.
        dropped = {id(m) for block in list(layer_list)[layers:] for m in block.modules()}
    with mode:
        for module in model.modules():
            if id(module) in dropped:
                continue
            for tensor in [*module._parameters.values(), *module._buffers.values(), *vars(module).values()]:
                if isinstance(tensor, torch.Tensor) and id(tensor) not in memo:
                    memo[id(tensor)] = fake_twin(tensor)
        # A 4-bit (QLoRA) weight's quantisation state is not a tensor attribute of its module.
        fake_quant_states(model, memo, fake_twin, dropped)
    if layers is not None:
        memo[id(model.config)] = config_with_layers(model.config, layers, count)
        memo[id(layer_list)] = copy.deepcopy(torch.nn.ModuleList(list(layer_list)[:layers]), memo)
    return copy.deepcopy(model, memo)


def fake_twin(tensor: torch.Tensor) -> torch.Tensor:
    """Return a fake CPU tensor shaped like ``tensor`` (a Parameter stays a Parameter, with its requires_grad)."""
    twin = torch.empty_strided(tensor.shape, tensor.stride(), dtype=tensor.dtype, device="cpu")
    if isinstance(tensor, torch.nn.Parameter):
        return torch.nn.Parameter(twin, requires_grad=tensor.requires_grad)
    return twin


def fake_optimizer(fake: torch.nn.Module, step: TrainingSetup, mode: FakeTensorMode) -> torch.optim.Optimizer:
    """Return the step's optimizer over ``fake``'s trainable parameters, its tensors fake."""
    trainable = [p for p in fake.parameters() if p.requires_grad]
    if step.optimizer not in BNB_OPTIMIZERS:
        with mode:
            return make_optimizer(step.optimizer, trainable, **step.optimizer_options)
    # bitsandbytes computes its quantisation tables from values when it is built: build it
    # outside fake mode, then give it fake twins of its 1 KiB tables.
    optimizer = make_optimizer(step.optimizer, trainable, **step.optimizer_options)
    with mode:
        optimizer.name2qmap = {key: fake_twin(table) for key, table in optimizer.name2qmap.items()}
    return optimizer


@contextlib.contextmanager
def modules_cast_in_forward():
    """Let a model cast one of its modules inside its forward pass (``module.to(dtype)``) where the cast changes nothing.

    Switch Transformers' router calls ``self.classifier.to(router_dtype)`` on
    every forward pass. On real weights of that dtype it is a no-op; on a fake
    copy torch's ``Module._apply`` tries to swap each fake parameter for
    itself, and fails ("Couldn't swap Linear.weight"). Here a cast that returns
    every tensor unchanged leaves the module as it is; one that would convert
    the weights (a bf16 router asked for fp32) is refused: the real step would
    change the model's own weights on its first call.
    """
    from torch._subclasses.fake_tensor import FakeTensor

    original = torch.nn.Module._apply

    def _apply(module, fn, recurse=True):
        tensors = [*module.parameters(recurse=recurse), *module.buffers(recurse=recurse)]
        if not any(isinstance(t, FakeTensor) for t in tensors):
            return original(module, fn, recurse)
        if all(fn(t) is t for t in tensors):
            return module
        changed = sorted({f"{t.dtype} to {fn(t).dtype}" for t in tensors if fn(t) is not t})
        raise PlannerRefused(
            f"model: its forward pass converts its own {type(module).__name__}'s weights ({', '.join(changed)}) "
            f"on its first call, which changes the model the plan is of (Switch Transformers' router casts its "
            f"classifier to config.router_dtype). Build the model with those weights in that dtype already (train "
            f"in fp32, or under bf16 autocast), or measure the step for real with measure_training_step_peak"
        )

    torch.nn.Module._apply = _apply
    try:
        yield
    finally:
        torch.nn.Module._apply = original


@contextlib.contextmanager
def an_unpadded_batch():
    """Let transformers' mask builder find what the real step finds by reading values: no padding, no packing.

    Before building an attention mask, transformers reads values to see whether
    it can skip the mask (SDPA's ``is_causal``): whether a padding mask the
    model made itself is all ones (BART's decoder makes one), and, with no cache
    (checkpointing turns it off), whether the position ids pack several
    sequences in a row. A fake tensor has no values, so transformers assumes it
    is being traced and builds a (batch, 1, seq, seq) mask the real step skips
    (and checkpointing keeps alive). The course's batch has no attention mask,
    no padding token and no position ids (the model numbers each row 0, 1,
    2... itself): any padding mask is all ones and each row one sequence, which
    is what the real step finds and what these answer.
    """
    from torch._subclasses.fake_tensor import FakeTensor
    from transformers import masking_utils

    def all_ones_when_fake(decide):
        def decision(padding_mask, *args, **kwargs):
            return decide(None if isinstance(padding_mask, FakeTensor) else padding_mask, *args, **kwargs)
        return decision

    answers = {
        "find_packed_sequence_indices": lambda original: lambda position_ids: None,
        "_ignore_causal_mask_sdpa": all_ones_when_fake,
        "_ignore_bidirectional_mask_sdpa": all_ones_when_fake,
    }
    # A transformers release without one of these functions does not make that decision.
    originals = {name: getattr(masking_utils, name) for name in answers if hasattr(masking_utils, name)}
    for name, original in originals.items():
        setattr(masking_utils, name, answers[name](original))
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(masking_utils, name, original)


@contextlib.contextmanager
def refusing_what_needs_values():
    """Turn an error of an operation that needs real values (a data-dependent shape, a custom kernel), or of the model itself, into a refusal."""
    try:
        yield
    except PlannerRefused:
        raise
    except (DynamicOutputShapeException, DataDependentOutputException) as error:
        raise PlannerRefused(
            f"the planner cannot follow this step on fake tensors: the model's forward or loss calls {error.func}, "
            f"whose result depends on tensor values, which fake tensors do not have (a shape or a branch taken "
            f"from the data: in a mixture-of-experts layer, which tokens each expert gets). Measure the step for "
            f"real instead (measure_training_step_peak on a small config of the same family)"
        ) from error
    except (RuntimeError, NotImplementedError, ArithmeticError) as error:
        # The library's own words are the cause (chained), not the reason: they name torch's internals.
        raise PlannerRefused(
            f"the planner could not follow this step on fake tensors: an operation of the model's step has no "
            f"fake-tensor counterpart the planner can run (torch raised {type(error).__name__}; its message is this "
            f"refusal's cause). Measure the step for real instead (measure_training_step_peak on a small config of "
            f"the same family)"
        ) from error
    except (AttributeError, TypeError, ValueError, LookupError) as error:
        # Raised by the model's own code, which a real step on the same batch runs too.
        raise PlannerRefused(
            f"model: its forward pass fails on the course's batch ({type(error).__name__}, its message is this "
            f"refusal's cause): it needs an input or an option that batch (training_batch: the model's main input "
            f"and its head's labels) does not give it. Measure the step for real on your own batch with "
            f"measure_training_step_peak"
        ) from error


class ScalarsInOptimizerStep(TorchDispatchMode):
    """Answer a fake tensor's value read as a Python number (0.5, or 1 for integers); entered around ``optimizer.step()`` only.

    A fake tensor has no values. Both Adafactors and NAdam read numbers back
    (the step count, a root mean square, a product of betas) to compute scalar
    factors; no tensor's size depends on them, so the step's allocations are
    the same whatever the number. Outside the optimizer step a value read is
    still refused, because a model's shapes may depend on it; and forward and
    backward do not pay for one more dispatch layer on every operation.
    """

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            dtype = args[0].dtype
            # 0.5, not 1: optimizers divide by 1 - a product of betas or by a step count.
            return False if dtype == torch.bool else 0.5 if dtype.is_floating_point else 1
        return func(*args, **(kwargs or {}))


def quietly(function, *args):
    """Return ``function(*args)`` with transformers' config notes, MemTracker's skipped-hook warning and fake
    tensors' own traceback log silenced."""
    from transformers.utils import logging as transformers_logging

    # The copy runs the model's forward, and transformers logs its notes about the config there
    # ("loss_type=None ... default loss", "use_cache=True is incompatible with gradient
    # checkpointing"): the user's own run of the model says them; the planner has nothing to add.
    verbosity = transformers_logging.get_verbosity()
    transformers_logging.set_verbosity_error()
    # An operation with no fake counterpart makes torch log its traceback at ERROR, then raise: the planner turns
    # the error into a refusal that says it in one line (and chains the raw cause), so the log is noise.
    fake_log = logging.getLogger("torch._subclasses.fake_tensor")
    fake_level = fake_log.level
    fake_log.setLevel(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            # transformers builds some modules inside forward (the classifier's ReLU,
            # CrossEntropyLoss); they are gone by backward, and MemTracker warns that it
            # skips their hooks. Totals are unaffected.
            warnings.filterwarnings("ignore", message="Module is None. Skipping", category=UserWarning)
            return function(*args)
    finally:
        transformers_logging.set_verbosity(verbosity)
        fake_log.setLevel(fake_level)


@contextlib.contextmanager
def fake_process_group(world_size: int, rank: int):
    """Within this block, this process is process ``rank`` of a fake group of ``world_size`` (collectives do nothing)."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise PlannerRefused(
            "the per-process planner runs its own fake process group, and this process is already in a process "
            "group (inside a launched worker?): plan from the notebook's own process"
        )
    dist.init_process_group("fake", rank=rank, world_size=world_size, store=FakeStore())
    try:
        yield
    finally:
        dist.destroy_process_group()
        _forget_fake_meshes()


def _forget_fake_meshes() -> None:
    """Empty DTensor's caches of sharding decisions, which hold the fake group's meshes.

    A cached decision keeps the mesh it was made on, and torch 2.13 compares
    meshes by shape and names, not by process group: a real run in a process
    forked later (a lesson plans, then launches) would otherwise reach the
    fake group's subgroups through it ("Could not resolve the process group
    registered under the name 3", seen on a 2 x 2 mesh).
    """
    from torch.distributed.tensor import _collective_utils, _redistribute
    from torch.distributed.tensor.debug import _clear_sharding_prop_cache

    _clear_sharding_prop_cache()
    for cached in (getattr(_redistribute, "_gen_transform_infos", None),
                   getattr(getattr(_collective_utils, "MeshTopoInfo", None), "build_from_mesh", None)):
        if hasattr(cached, "cache_clear"):
            cached.cache_clear()
