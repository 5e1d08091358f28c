"""Every branch a library takes on this CPU's features, forced both ways, so that the tests pass on any CPU.

The branches found in what the course imports (torch 2.13, bitsandbytes 0.50,
transformers 5.24, accelerate 1.15; grep for ``has_avx512bf16``,
``get_cpu_capability``, ``mkldnn``, ``cpuinfo``, ``amx``, ``bf16`` checks):

1. bitsandbytes ``functional.has_avx512bf16()`` (the native
   ``lib.has_avx512bf16_cpu()``), read at two places:

   a. ``nn.Linear4bit.__init__`` sets ``support_avx512bf16_for_cpu``; with it,
      ``Linear4bit.forward`` in eval mode on an input without gradients repacks
      the weight for the CPU inference kernel (``functional._convert_weight_packed_for_cpu``,
      plain torch operations). Forced here by setting the attribute: the repack
      runs on any CPU, and raises on a layer whose shape it does not accept.
   b. ``backends/cpu/ops.py`` at import registers the CPU kernel of
      ``bitsandbytes::gemv_4bit`` (native ``gemv_4bit_inference_cpu_*_bf16``, or
      the ``kernels`` package's, whose absence it logs as a WARNING). Which
      kernel a packed weight's forward (``autograd._functions.matmul_4bit``,
      ``packing_format_for_cpu``) then runs is native: its test runs on a CPU
      with AVX512-BF16 and is skipped, with the reason, elsewhere. The import-time
      branch and its log line are forced in ``tests/lessons/test_notebook_kernel.py``
      (``has_avx512bf16`` replaced before ``ops.py`` is imported); the course
      silences the line (``optimizers.import_bitsandbytes_optim``, the course kernel).
   c. ``Linear4bit._save_to_state_dict`` and ``Params4bit.to`` undo the repack
      (``_convert_weight_packed_for_cpu_inverse``) when a weight is packed:
      reached by the forced repack; ``qlora.keep_weights_trainable`` uses the inverse.

   The planner refuses packed weights by name with the remedy
   (``qlora.keep_weights_trainable``), then plans; ``qlora.qlora_model`` turns the repack off.
2. bf16 matrix units (x86 ``amx_bf16`` / ``avx512_bf16``, Arm ``bf16``): torch's
   oneDNN bf16 matrix products use them when present (native, results equal
   within bf16 rounding; only the speed differs, which lessons 5 and 8 measure).
   torch reports no such thing (``torch.backends.cpu.get_cpu_capability()`` says
   "AVX512" either way); the course reads the flags:
   ``course_utils.cpu_features.has_bf16_matrix_units(flags=...)``, forced both ways here.
3. torch's ATen kernels dispatch on ``torch.backends.cpu.get_cpu_capability()``
   (DEFAULT, AVX2, AVX512...), which lesson 5 prints. Forced down with
   ``ATEN_CPU_CAPABILITY`` in a child process: the report follows, and a training
   step's loss agrees with this process's to rounding.
4. Inductor (lesson 8's ``torch.compile``) picks its vector instruction set from the
   CPU (``torch._inductor.cpu_vec_isa.pick_vec_isa``, reading ``/proc/cpuinfo`` and
   compiling probes): the course only counts graphs and times them, and does not
   branch on it; not forced here (a compile per instruction set costs minutes on 2 busy cores).
"""

import os
import subprocess
import sys

import pytest
import torch
import transformers as tf

from course_utils import cpu_features, memory
from course_utils.memory import PlannerRefused, qlora

pytestmark = pytest.mark.slow

bnb = pytest.importorskip("bitsandbytes")
THIS_CPU_HAS_AVX512_BF16 = bool(bnb.functional.has_avx512bf16())
NEEDS_AVX512_BF16 = pytest.mark.skipif(
    not THIS_CPU_HAS_AVX512_BF16, reason="bitsandbytes' packed CPU kernel is native code for CPUs with AVX512-BF16")
NEEDS_NO_AVX512_BF16 = pytest.mark.skipif(
    THIS_CPU_HAS_AVX512_BF16, reason="this CPU has AVX512-BF16: bitsandbytes sets the flag on every Linear4bit")


def llama_config(hidden):
    # hidden 32: in_features below the 4-bit block size (64), which the repack does not accept; 64: it does.
    return tf.LlamaConfig(vocab_size=128, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)


def real_qlora(hidden, avx512_bf16):
    """Return a real (CPU) QLoRA model whose Linear4bit layers take the AVX512-BF16 branch or not, as forced."""
    torch.manual_seed(0)
    model = qlora.qlora_model(llama_config(hidden), on_meta_device=False)
    for _, module, _ in qlora.four_bit_weights(model):
        module.support_avx512bf16_for_cpu = avx512_bf16  # what Linear4bit.__init__ sets from has_avx512bf16()
    return model


def measured(model):
    optimizer = memory.make_optimizer("paged_adamw8bit", [p for p in model.parameters() if p.requires_grad])
    batch = memory.training_batch(model, 2, 16, generator=torch.Generator().manual_seed(1))
    return memory.measure_training_step_peak(model, optimizer, batch)


def evaluate(model):
    model.eval()
    with torch.no_grad():
        model(**memory.training_batch(model, 1, 8))
    model.train()


def repack_as_an_evaluation_does(model):
    """Repack every 4-bit weight as ``Linear4bit.forward`` does in eval mode with the flag set (CPU-independent).

    Its two lines, without the packed kernel call that follows them (native on CPUs with AVX512-BF16).
    """
    for _, module, weight in qlora.four_bit_weights(model):
        module.weight.data, _ = bnb.functional._convert_weight_packed_for_cpu(weight.data, weight.quant_state)


def packed(model):
    return [getattr(w.quant_state, "packing_format_for_cpu", False) for _, _, w in qlora.four_bit_weights(model)]


# --------------------------------------------------------------------------- 1a. the flag and the repack


def test_the_course_built_qlora_model_has_the_repack_off_on_every_cpu():
    model = qlora.qlora_model(llama_config(32), on_meta_device=False)
    assert {m.support_avx512bf16_for_cpu for _, m, _ in qlora.four_bit_weights(model)} == {False}
    evaluate(model)
    assert not any(packed(model))


def test_flag_off_an_evaluation_keeps_the_weights_and_the_plan_is_the_measured_step():
    model = real_qlora(32, avx512_bf16=False)
    measured(model)  # a real step first, as in training
    evaluate(model)
    assert not any(packed(model))
    assert memory.estimate_training_memory(model, "paged_adamw8bit", 2, 16) == measured(model)


def test_flag_on_a_layer_narrower_than_a_block_makes_bitsandbytes_raise_until_the_repack_is_turned_off():
    model = real_qlora(32, avx512_bf16=True)
    assert not qlora.cpu_repack_accepts(qlora.four_bit_weights(model)[0][1])
    with pytest.raises(RuntimeError, match=r"shape '\[\d+, 0\]' is invalid"):  # inside bitsandbytes' repack
        evaluate(model)
    assert qlora.keep_weights_trainable(model) == 0  # nothing was packed; the repack is off from now on
    evaluate(model)
    assert not any(packed(model))
    assert memory.estimate_training_memory(model, "paged_adamw8bit", 2, 16) == measured(model)


def test_flag_on_repacked_weights_are_refused_by_name_with_the_remedy_and_planned_after_it():
    model = real_qlora(64, avx512_bf16=True)
    assert all(qlora.cpu_repack_accepts(m) for _, m, _ in qlora.four_bit_weights(model))
    loaded = [w.data.clone() for _, _, w in qlora.four_bit_weights(model)]
    repack_as_an_evaluation_does(model)
    assert all(packed(model))
    with pytest.raises(PlannerRefused, match=r"PeftModelForCausalLM's 4-bit weights .* packed for bitsandbytes' CPU "
                                             r"inference kernel .*AVX512-BF16.*keep_weights_trainable\(model\)"):
        memory.estimate_training_memory(model, "paged_adamw8bit", 2, 16)
    assert qlora.keep_weights_trainable(model) == len(loaded)
    assert not any(packed(model))
    assert all(torch.equal(w.data, codes) for (_, _, w), codes in zip(qlora.four_bit_weights(model), loaded))
    evaluate(model)  # turned off: no second repack
    assert not any(packed(model))
    assert memory.estimate_training_memory(model, "paged_adamw8bit", 2, 16) == measured(model)


def test_unpacked_weights_compute_what_they_computed_before_the_repack_to_bf16_rounding():
    model = real_qlora(64, avx512_bf16=False)
    batch = memory.training_batch(model, 2, 8, generator=torch.Generator().manual_seed(2))
    model.eval()
    with torch.no_grad():
        before = model(**batch).logits
    repack_as_an_evaluation_does(model)
    qlora.keep_weights_trainable(model)
    with torch.no_grad():
        after = model(**batch).logits
    assert torch.allclose(before, after, atol=0.05, rtol=0.02), (before - after).abs().max()


# --------------------------------------------------------------------------- 1b. the native packed kernel


@NEEDS_AVX512_BF16
def test_on_this_avx512_bf16_cpu_bitsandbytes_sets_the_flag_and_packed_training_loses_the_input_gradient():
    model = qlora.qlora_model(llama_config(64), on_meta_device=False)
    layer = qlora.four_bit_weights(model)[0][1]
    assert bnb.nn.Linear4bit(64, 64).support_avx512bf16_for_cpu  # as a recipe's loader builds them here
    layer.support_avx512bf16_for_cpu = True
    layer.eval()
    with torch.no_grad():
        layer(torch.randn(2, 64, dtype=torch.bfloat16))  # the real evaluation repacks, then runs the native kernel
    assert packed(model)[0]
    layer.train()
    inputs = torch.randn(2, 64, requires_grad=True)
    with pytest.warns(UserWarning, match="gemv_4bit: an autograd kernel was not registered"):
        layer(inputs).float().sum().backward()
    assert inputs.grad is None  # what the planner's refusal says: no gradient through the base layer


@pytest.mark.parametrize("probe", [True, False], ids=["avx512-bf16", "without"])
def test_a_linear4bit_takes_its_flag_from_bitsandbytes_probe_both_ways(monkeypatch, probe):
    monkeypatch.setattr(bnb.nn.modules, "has_avx512bf16", lambda: probe)  # the name Linear4bit.__init__ calls
    assert bnb.nn.Linear4bit(64, 64).support_avx512bf16_for_cpu is probe


@NEEDS_NO_AVX512_BF16
def test_on_a_cpu_without_avx512_bf16_bitsandbytes_leaves_the_flag_off():
    assert not bnb.nn.Linear4bit(64, 64).support_avx512bf16_for_cpu


# --------------------------------------------------------------------------- 2. bf16 matrix units


CPUINFO = {
    "intel-sapphire-rapids": ("processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n", True),
    "amd-zen4": ("processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16\n", True),
    "intel-skylake-x": ("processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512bw\n", False),
    "arm-neoverse-v1": ("processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n", True),
    "arm-graviton2": ("processor\t: 0\nFeatures\t: fp asimd asimddp\n", False),
    "unreadable": ("", False),
}


@pytest.mark.parametrize("cpu", CPUINFO)
def test_bf16_matrix_units_are_read_from_the_cpus_flags_both_ways(cpu):
    text, expected = CPUINFO[cpu]
    assert cpu_features.has_bf16_matrix_units(cpu_features.cpu_flags(text)) is expected


def test_this_cpus_bf16_matrix_units_agree_with_bitsandbytes_probe_on_x86():
    flags = cpu_features.cpu_flags()
    if "avx512f" not in flags:
        pytest.skip("not an x86 CPU with AVX-512 (or not Linux): bitsandbytes' probe looks for AVX512-BF16 only")
    assert ("avx512_bf16" in flags) == THIS_CPU_HAS_AVX512_BF16
    assert cpu_features.has_bf16_matrix_units() == bool(cpu_features.BF16_MATRIX_FLAGS & flags)


def test_has_bf16_matrix_units_refuses_what_is_not_a_collection_of_flags():
    with pytest.raises(TypeError, match="flags"):
        cpu_features.has_bf16_matrix_units("avx512_bf16")
    with pytest.raises(TypeError, match="flags"):
        cpu_features.has_bf16_matrix_units([1])
    with pytest.raises(TypeError, match="cpuinfo"):
        cpu_features.cpu_flags(5)


# --------------------------------------------------------------------------- 3. torch's CPU capability


LOSS_OF_ONE_STEP = """
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 2))
inputs, labels = torch.randn(16, 64), torch.randint(0, 2, (16,))
torch.nn.functional.cross_entropy(model(inputs), labels).backward()
torch.optim.AdamW(model.parameters()).step()
print(torch.backends.cpu.get_cpu_capability(), torch.nn.functional.cross_entropy(model(inputs), labels).item())
"""


def test_forcing_torchs_cpu_capability_down_changes_the_report_not_the_step():
    def run(capability):
        environment = {**os.environ, "OMP_NUM_THREADS": "1"}
        environment.pop("ATEN_CPU_CAPABILITY", None)
        if capability:
            environment["ATEN_CPU_CAPABILITY"] = capability
        out = subprocess.run([sys.executable, "-c", LOSS_OF_ONE_STEP], env=environment, capture_output=True,
                             text=True, check=True, timeout=300).stdout.split()
        return out[0], float(out[1])

    native, native_loss = run(None)
    forced, forced_loss = run("default")
    assert native in {"DEFAULT", "AVX2", "AVX512", "ZVECTOR", "VSX", "SVE256", "NO AVX"} or native.startswith("SVE")
    assert forced == "DEFAULT"
    assert forced_loss == pytest.approx(native_loss, rel=1e-5)
