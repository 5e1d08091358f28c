"""QLoRA: a frozen 4-bit bitsandbytes base with trained LoRA adapters, built without downloads and planned (lesson 4).

A QLoRA recipe loads a model with ``BitsAndBytesConfig(load_in_4bit=True)``:
each ``nn.Linear`` of its blocks becomes a bitsandbytes ``Linear4bit`` whose
weight is a ``Params4bit``, two 4-bit codes per byte, with a ``QuantState``
beside it (one scale per block of 64 weights, themselves quantised to 8 bits
with double quantisation, and the code table). ``peft.prepare_model_for_kbit_training``
then freezes everything, casts what is left in 16 bits to fp32 and turns on
activation checkpointing, and ``peft.get_peft_model`` adds the LoRA adapters,
the only parameters trained. The optimizer is usually bitsandbytes' 8-bit or
paged AdamW.

- :func:`qlora_model` builds that model from a transformers config, on the
  meta device (no memory: a 70B-shaped one in seconds) or for real, with the
  same modules, shapes and dtypes as the recipe's loaded model.
- :func:`keep_weights_trainable` undoes and turns off bitsandbytes' CPU
  inference repack (below); :func:`qlora_model` builds its models with it off.
- :func:`refuse_what_cannot_be_followed` names the one QLoRA state the planner
  does not follow (weights repacked for CPU inference), and that remedy.
- :func:`fake_quant_states` gives the planner's fake copy of the model its
  quantisation states: a fake tensor cannot be a ``Params4bit`` (both are
  tensor subclasses), so the copy's weight is a plain fake uint8 parameter
  carrying a fake twin of the ``QuantState``, which is all ``Linear4bit``'s
  forward reads. bitsandbytes registers fake kernels for its 4-bit operations,
  so the step then runs on fake tensors as on real ones.

On a CPU with AVX512-BF16, bitsandbytes 0.50 repacks a ``Linear4bit``'s
weight for its CPU inference kernel the first time the layer runs in eval
mode on an input without gradients (``Linear4bit.support_avx512bf16_for_cpu``,
set at construction from ``bitsandbytes.functional.has_avx512bf16()``). Two
things then go wrong for a learner: on a layer whose shape the repack does
not accept (:func:`cpu_repack_accepts`: in_features not a multiple of the
block size, out_features not a multiple of 32) the evaluation itself raises
inside bitsandbytes; on the others every later call takes the inference
kernel, training included, which has no backward: no gradient reaches the
layer's input through the base layer, silently.

The quantisation states are plain tensors beside the weights, not parameters
or buffers, so MemTracker does not see them by itself; yet the allocator holds
them as long as the weights (:func:`quant_state_bytes` gives them): an fp32
scale per 64 weights is 0.5 bit per weight; double quantisation stores it in
8 bits with an fp32 scale per 256 blocks, 8/64 + 32/(64 * 256) = about 0.127
bit (the QLoRA paper's figures). :func:`track_quant_states` shows them to the
tracker as parameters, so the measured step and the plan count them in the
weights part.

Checked on bitsandbytes 0.50, peft 0.21, transformers 5.24 and torch 2.13
(MemTracker's registration, in :func:`track_quant_states`); after upgrading,
rerun ``pytest tests/memory/test_planner_families.py``.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable

import torch

from course_utils.validation import check_bool, check_instance

__all__ = [
    "qlora_model", "quant_state_bytes", "quant_state_tensors", "track_quant_states", "four_bit_weights",
    "refuse_what_cannot_be_followed", "fake_quant_states", "keep_weights_trainable", "cpu_repack_accepts",
]

# bitsandbytes' CPU repack (functional._convert_weight_packed_for_cpu) packs the output rows in blocks of this many.
_CPU_REPACK_ROWS = 32


def qlora_model(
    config, head: type | None = None, *, on_meta_device: bool = True, dtype: torch.dtype = torch.bfloat16,
    quantization=None, lora=None, checkpointing: bool = True, gradient_checkpointing_kwargs: dict | None = None,
) -> torch.nn.Module:
    """Return the QLoRA model a recipe trains: ``head`` built from ``config``, its linear layers 4-bit, LoRA on top.

    - ``config``: a transformers config; ``head`` an Auto class or model class
      (default ``AutoModelForCausalLM``).
    - ``dtype``: the dtype the base is loaded in before quantising (the
      recipe's ``dtype=torch.bfloat16``); what stays unquantised is cast to fp32
      by ``prepare_model_for_kbit_training``, as in the recipe.
    - ``quantization``: a ``transformers.BitsAndBytesConfig`` (default: NF4,
      double quantisation, bf16 compute, the QLoRA paper's choice).
    - ``lora``: a ``peft.LoraConfig`` (default: rank 16, alpha 32, every linear
      layer of the blocks, ``task_type`` from the head).
    - ``checkpointing``: ``prepare_model_for_kbit_training``'s
      ``use_gradient_checkpointing`` (its default, True), with
      ``gradient_checkpointing_kwargs`` (default ``{"use_reentrant": False}``,
      what torch recommends and TRL's trainers pass).

    bitsandbytes' CPU inference repack is off (:func:`keep_weights_trainable`),
    on every CPU: evaluating the model does not change how it trains.

    On the meta device (the default) nothing is allocated: the weights are
    quantised on meta tensors, which gives their shapes and dtypes. With
    ``on_meta_device=False`` the base's weights are initialised and quantised
    for real on the CPU (small configs only).
    """
    import transformers
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
    from transformers.integrations.bitsandbytes import replace_with_bnb_linear

    check_instance(config, "config", transformers.PretrainedConfig, "a transformers config (e.g. LlamaConfig(...))")
    check_bool(on_meta_device, "on_meta_device")
    check_bool(checkpointing, "checkpointing")
    check_instance(dtype, "dtype", torch.dtype, "a torch.dtype")
    head = head or transformers.AutoModelForCausalLM
    quantization = quantization or transformers.BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch.bfloat16,
    )
    check_instance(quantization, "quantization", transformers.BitsAndBytesConfig, "a transformers.BitsAndBytesConfig")
    if not quantization.load_in_4bit:
        raise ValueError("quantization must load in 4 bits (load_in_4bit=True): QLoRA's base is 4-bit")
    device = torch.device("meta") if on_meta_device else torch.device("cpu")
    with torch.device(device):
        model = head.from_config(config, dtype=dtype)
    bnb = _import_bitsandbytes()
    # As transformers' loader does: every linear layer but the output head (it stays in dtype).
    originals = {name: module for name, module in model.named_modules() if type(module) is torch.nn.Linear}
    task = lora.task_type if lora is not None else _task_type(model)
    saved = _trained_whole(model, task, getattr(lora, "modules_to_save", None))
    replace_with_bnb_linear(model, modules_to_not_convert=sorted({*_kept_unquantised(model, quantization), *saved}),
                            quantization_config=quantization)
    for name, module in model.named_modules():
        if isinstance(module, bnb.nn.Linear4bit):
            original = originals[name]
            _quantise(module, original.weight.detach().to(dtype), quantization, bnb)
            if original.bias is not None:
                module.bias = torch.nn.Parameter(original.bias.detach().to(dtype), requires_grad=False)
    model.is_loaded_in_4bit = True  # what transformers' 4-bit loader sets; peft reads it
    model.quantization_method = "bitsandbytes"
    with warnings.catch_warnings():
        # peft 0.21 reads transformers' deprecated `is_gradient_checkpointing`: theirs to update.
        warnings.simplefilter("ignore", FutureWarning)
        model = prepare_model_for_kbit_training(
            model, use_gradient_checkpointing=checkpointing,
            gradient_checkpointing_kwargs=gradient_checkpointing_kwargs or {"use_reentrant": False},
        )
        # peft trains the head whole (modules_to_save), so LoRA must not target it too.
        lora = lora or LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", task_type=task,
                                  exclude_modules=saved or None)
        model = get_peft_model(model, lora)
    keep_weights_trainable(model)
    return model


def _trained_whole(model: torch.nn.Module, task: str | None, modules_to_save: list[str] | None) -> list[str]:
    """Return the modules peft will train whole for ``task`` (its ``modules_to_save``): they stay unquantised.

    peft's classification models add their head's usual names ("classifier",
    "score"; "qa_outputs" for question answering) and match a module by the
    end of its name, so DistilBERT's ``pre_classifier`` is trained whole too.
    A 4-bit weight cannot train, and peft refuses a module both saved and
    LoRA-wrapped: the recipe that works skips these at quantisation
    (``BitsAndBytesConfig(llm_int8_skip_modules=...)``) and LoRA leaves them out.
    """
    names = list(modules_to_save or [])
    if task in ("SEQ_CLS", "TOKEN_CLS"):
        names += ["classifier", "score"]
    elif task == "QUESTION_ANS":
        names += ["qa_outputs"]
    return sorted({key for key, _ in model.named_modules() if key and any(key.endswith(name) for name in names)})


def _kept_unquantised(model: torch.nn.Module, quantization) -> list[str]:
    """Return the modules transformers' 4-bit loader leaves unquantised (the output head, tied or not, and its skips).

    transformers 5.24 names the model's last *parameter* and strips only a
    ``.weight`` suffix; where the last parameter is a bias (DistilBERT's
    ``classifier.bias``) the name matches no module and the head would be
    quantised, which peft then refuses to train (``modules_to_save``). Its
    intent, "remove last module", is kept here: each parameter name becomes
    the module that holds it.
    """
    from transformers.quantizers.quantizer_bnb_4bit import Bnb4BitHfQuantizer

    names = Bnb4BitHfQuantizer.get_modules_to_not_convert(
        model, quantization.llm_int8_skip_modules, getattr(model, "_keep_in_fp32_modules", None)
    )
    parameters = dict(model.named_parameters())
    return sorted({name.rpartition(".")[0] if name in parameters else name for name in names})


def _quantise(module, weight: torch.Tensor, quantization, bnb) -> None:
    """Replace ``module``'s weight by its 4-bit ``Params4bit`` (on ``weight``'s device) and its quantisation state."""
    # bitsandbytes caches its 8-bit code table on the device of the first call; made on meta, every later real
    # quantisation fails ("Cannot copy out of meta tensor"). Keep the cached table on the CPU; each call moves a copy.
    qmaps = bnb.functional.name2qmap
    if "dynamic" not in qmaps or qmaps["dynamic"].is_meta:
        qmaps["dynamic"] = bnb.functional.create_dynamic_map()
    data, state = bnb.functional.quantize_4bit(
        weight, blocksize=64, compress_statistics=quantization.bnb_4bit_use_double_quant,
        quant_type=quantization.bnb_4bit_quant_type, quant_storage=quantization.bnb_4bit_quant_storage,
    )
    module.weight = bnb.nn.Params4bit(
        data, requires_grad=False, quant_state=state, blocksize=64,
        compress_statistics=quantization.bnb_4bit_use_double_quant, quant_type=quantization.bnb_4bit_quant_type,
        quant_storage=quantization.bnb_4bit_quant_storage, module=module, bnb_quantized=True,
    )
    module.quant_state = state


def _task_type(model: torch.nn.Module) -> str:
    """Return peft's task type for ``model``'s head (what a recipe passes to LoraConfig)."""
    name = type(model).__name__
    for suffix, task in (("ForCausalLM", "CAUSAL_LM"), ("ForSequenceClassification", "SEQ_CLS"),
                         ("ForTokenClassification", "TOKEN_CLS"), ("ForQuestionAnswering", "QUESTION_ANS"),
                         ("ForConditionalGeneration", "SEQ_2_SEQ_LM")):
        if name.endswith(suffix):
            return task
    return "FEATURE_EXTRACTION"


def _import_bitsandbytes():
    """Import bitsandbytes as the course's optimizers do (quietly; see ``course_utils.optimizers``)."""
    from course_utils.optimizers import import_bitsandbytes_optim

    import_bitsandbytes_optim()
    import bitsandbytes

    return bitsandbytes


def four_bit_weights(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module, torch.Tensor]]:
    """Return (module name, module, weight) for every module whose weight carries a bitsandbytes quantisation state."""
    # From _parameters, not getattr: a parametrized weight (weight norm) would be computed by reading it.
    return [
        (name, module, module._parameters["weight"]) for name, module in model.named_modules()
        if getattr(module._parameters.get("weight"), "quant_state", None) is not None
    ]


def quant_state_tensors(model: torch.nn.Module) -> list[torch.Tensor]:
    """Return the tensors of every 4-bit weight's quantisation state (scales, code tables, nested state), each once."""
    seen, tensors = set(), []
    for _, _, weight in four_bit_weights(model):
        for tensor in _state_tensors(weight.quant_state):
            if id(tensor) not in seen:
                seen.add(id(tensor))
                tensors.append(tensor)
    return tensors


def quant_state_bytes(model: torch.nn.Module) -> int:
    """Return the bytes of every 4-bit weight's quantisation state (scales, code tables): part of the weights the step holds."""
    check_instance(model, "model", torch.nn.Module, "a torch.nn.Module")
    return sum(tensor.numel() * tensor.element_size() for tensor in quant_state_tensors(model))


def track_quant_states(tracker, model: torch.nn.Module) -> None:
    """Show ``tracker`` (a MemTracker, before it is entered) ``model``'s quantisation states as parameters.

    MemTracker counts a module's parameters and buffers; a ``QuantState``'s
    tensors are neither, yet live as long as the weights. Registered here as
    parameters, they are counted in the weights part of every snapshot, as
    the allocator holds them. Uses MemTracker's own registration
    (``_update_and_maybe_create_winfos``, torch 2.13), as ``_step_tracker`` does.
    """
    from torch.distributed._tools.mem_tracker import _MemRefType

    for tensor in quant_state_tensors(model):
        tracker._update_and_maybe_create_winfos(tensor, _MemRefType.PARAM)


def _state_tensors(state) -> list[torch.Tensor]:
    """Return the tensors of a bitsandbytes ``QuantState`` and of its nested state."""
    tensors = [value for value in vars(state).values() if isinstance(value, torch.Tensor)]
    nested = getattr(state, "state2", None)
    return tensors + (_state_tensors(nested) if nested is not None else [])


def cpu_repack_accepts(module: torch.nn.Module) -> bool:
    """Return whether bitsandbytes' CPU inference repack accepts ``module``'s 4-bit weight (else it raises).

    The repack reshapes the block scales to (out_features, in_features / block
    size) and packs the rows in blocks of 32: in_features must be a multiple of
    the block size (64 by default) and out_features a multiple of 32.
    """
    state = getattr(module._parameters.get("weight"), "quant_state", None)
    if state is None:
        raise ValueError(f"module must have a 4-bit bitsandbytes weight, got {type(module).__name__}")
    rows, columns = state.shape
    return columns % state.blocksize == 0 and rows % _CPU_REPACK_ROWS == 0


def _is_packed(weight) -> bool:
    return bool(getattr(weight.quant_state, "packing_format_for_cpu", False))


def keep_weights_trainable(model: torch.nn.Module) -> int:
    """Undo bitsandbytes' CPU inference repack of ``model``'s 4-bit weights and turn it off; return how many were packed.

    Each packed weight goes back to the layout it was loaded in, through
    bitsandbytes' own inverse (what its ``state_dict()`` does before saving),
    its block scales in fp32 again (the repack rounded them to bf16);
    then every ``Linear4bit`` is told its CPU has no AVX512-BF16
    (``support_avx512bf16_for_cpu = False``), so that an evaluation runs the
    general kernel, on any shape, and training keeps its gradients. On a CPU
    without AVX512-BF16 nothing changes. Call it after loading a QLoRA model
    (``qlora_model`` does) or after an evaluation that repacked it.
    """
    check_instance(model, "model", torch.nn.Module, "a torch.nn.Module")
    packed = 0
    for _, module, weight in four_bit_weights(model):
        if _is_packed(weight):
            _unpack(weight)
            module.quant_state = weight.quant_state
            packed += 1
        if hasattr(module, "support_avx512bf16_for_cpu"):
            module.support_avx512bf16_for_cpu = False
    return packed


def _unpack(weight) -> None:
    """Put a weight bitsandbytes repacked for CPU inference back in its loaded layout, block scales in fp32."""
    from bitsandbytes.functional import _convert_weight_packed_for_cpu_inverse, quantize_blockwise

    state = weight.quant_state
    # The repack stored the block scales in bf16, transposed; bitsandbytes' inverse (0.50) re-nests them
    # in bf16 (its 4-bit kernels then refuse them) or leaves them as they are when not nested. Rebuilt
    # here in fp32 as loaded (rounded to bf16 once, by the repack: that rounding cannot be undone).
    scales = state.absmax.T.reshape(-1).float()
    weight.data, state = _convert_weight_packed_for_cpu_inverse(weight.data, state)
    if state.nested:
        state.offset = scales.mean()
        state.absmax, state.state2 = quantize_blockwise(scales - state.offset, blocksize=state.state2.blocksize)
    else:
        state.absmax = scales
    weight.quant_state = state


def refuse_what_cannot_be_followed(model: torch.nn.Module, refusal: Callable[[str], Exception]) -> None:
    """Raise ``refusal(message)`` if ``model`` has 4-bit weights the planner cannot follow a training step of.

    Weights bitsandbytes repacked for its CPU inference kernel (see the module's
    docstring): the step would take that kernel, which has no backward, so it
    is not the step a QLoRA recipe trains. The message names the remedy,
    :func:`keep_weights_trainable`, after which the model is planned.
    """
    packed = [name for name, _, weight in four_bit_weights(model) if _is_packed(weight)]
    if packed:
        raise refusal(
            f"model: {type(model).__name__}'s 4-bit weights ({packed[0]} and {len(packed) - 1} more) are packed for "
            f"bitsandbytes' CPU inference kernel (it repacks them when the model first runs in eval mode without "
            f"gradients on a CPU with AVX512-BF16); that kernel has no backward pass, so no gradient would flow "
            f"through the base layers. Call course_utils.memory.qlora.keep_weights_trainable(model), which restores "
            f"the weights as loaded and turns the repack off, then plan again (or reload it, or build it with "
            f"course_utils.memory.qlora.qlora_model, and train it before evaluating)"
        )


def fake_quant_states(model: torch.nn.Module, memo: dict[int, object], fake_twin: Callable, skipped: set[int]) -> None:
    """Add to a deep-copy ``memo`` (which maps ``model``'s tensors to fake twins) the fake twins of its quantisation states.

    For each 4-bit weight of a module not in ``skipped`` (module ids): its
    ``QuantState`` (and nested state) maps to a copy whose tensors are
    ``fake_twin`` of the originals, and the weight's twin in ``memo`` carries it
    as ``quant_state``, as ``Params4bit`` does. Call it inside the fake mode.
    """
    for _, module, weight in four_bit_weights(model):
        if id(module) in skipped:
            continue
        state = _fake_state(weight.quant_state, memo, fake_twin)
        twin = memo.get(id(weight))
        if twin is not None:
            twin.quant_state = state


def _fake_state(state, memo: dict[int, object], fake_twin: Callable):
    """Return (and remember in ``memo``) a copy of ``state`` whose tensors are fake twins."""
    if state is None or id(state) in memo:
        return memo.get(id(state))
    twin = copy.copy(state)
    for name, value in vars(state).items():
        if isinstance(value, torch.Tensor):
            if id(value) not in memo:
                memo[id(value)] = fake_twin(value)
            setattr(twin, name, memo[id(value)])
    twin.state2 = _fake_state(getattr(state, "state2", None), memo, fake_twin)
    memo[id(state)] = twin
    return twin
