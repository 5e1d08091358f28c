"""The tracker and the planner count what the CPU allocator holds, where kernels allocate beyond their outputs (course_utils.memory: kernel_buffers, _step_tracker, fake_kernels).

Each family below was once tracked (and so planned) off the allocator's
record of the same step: convolutions and batch norm's backward allocate
buffers inside their kernels (ResNet, SegFormer), 16-bit matrix products pack
an operand (SigLIP in pure bf16, SegFormer under bf16 autocast), autograd sums
a gradient out of place under any dispatch mode where an untracked step sums
it in place (Mamba's and Jamba's slow scan), and layer norm's backward meta
kernel kept a transposed gradient's strides (Swin). Each test holds
planned == tracked, and the tracked rise equal to the allocator's.
"""

import pytest
import torch
import transformers as tf

from course_utils import memory
from course_utils.memory import kernel_buffers

pytestmark = pytest.mark.slow

BF16 = torch.bfloat16
SMALLEST_TENSOR_A_TRACKER_MISSES = 8  # bytes: a 0-dim float64 or int64 made inside a kernel


def resnet():
    return tf.ResNetForImageClassification(tf.ResNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1],
                                                           num_labels=3))


def segformer():
    return tf.SegformerForImageClassification(tf.SegformerConfig(
        num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32], num_attention_heads=[1, 2],
        patch_sizes=[7, 3], strides=[4, 2], mlp_ratios=[2, 2], decoder_hidden_size=32, num_labels=3))


def siglip_bf16():
    config = tf.SiglipConfig(vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                                num_attention_heads=2, image_size=32, patch_size=8), num_labels=3)
    return tf.SiglipForImageClassification._from_config(config, dtype=BF16)


def mamba():
    return tf.MambaForCausalLM(tf.MambaConfig(vocab_size=128, hidden_size=32, state_size=8, num_hidden_layers=2,
                                              expand=2, conv_kernel=4))


def jamba():
    return tf.JambaForCausalLM(tf.JambaConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, num_experts=2, num_experts_per_tok=1, expert_layer_period=2, expert_layer_offset=1,
        attn_layer_period=2, attn_layer_offset=1, mamba_d_state=8, mamba_expand=2, use_mamba_kernels=False))


def swin():
    return tf.SwinForImageClassification(tf.SwinConfig(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1],
                                                       num_heads=[1, 2], window_size=4, num_labels=3))


# (cause, build, optimizer, options, mixed_precision)
FAMILIES = [
    ("convolution and batch norm buffers: resnet, sgd momentum", resnet, "sgd", {"momentum": 0.9}, "no"),
    ("convolution and bf16 product buffers: segformer, bf16 autocast", segformer, "adamw", {}, "bf16"),
    ("bf16 product buffers: siglip vision, pure bf16", siglip_bf16, "adamw", {}, "no"),
    ("gradient sums in place: mamba slow scan", mamba, "adamw", {}, "no"),
    ("gradient sums in place: jamba", jamba, "adamw", {}, "no"),
    ("layer norm backward's contiguous gradient: swin", swin, "adamw", {}, "no"),
]


def _built(build, optimizer, options):
    torch.manual_seed(0)
    model = build()
    real_optimizer = memory.make_optimizer(optimizer, [p for p in model.parameters() if p.requires_grad], **options)
    batch = memory.training_batch(model, 2, 32, generator=torch.Generator().manual_seed(1))
    return model, real_optimizer, batch


@pytest.mark.parametrize("family", FAMILIES, ids=[f[0] for f in FAMILIES])
def test_planned_tracked_and_the_allocator_agree(family):
    _, build, optimizer, options, mixed_precision = family
    model, real_optimizer, batch = _built(build, optimizer, options)
    planned = memory.estimate_training_memory(model, optimizer, 2, 32, mixed_precision=mixed_precision, **options)
    tracked = memory.measure_training_step_peak(model, real_optimizer, batch, mixed_precision=mixed_precision)
    assert planned == tracked and planned.peak_by_phase == tracked.peak_by_phase, (planned, tracked)

    model, real_optimizer, batch = _built(build, optimizer, options)
    allocator = memory.measure_allocator_rise(model, real_optimizer, batch, mixed_precision=mixed_precision)
    tracked_rise = tracked.peak - tracked.weights - tracked.optimizer_state
    unseen = sum(size for size, _ in allocator.live_at_peak if size <= SMALLEST_TENSOR_A_TRACKER_MISSES)
    assert 0 <= allocator.rise - tracked_rise <= unseen, (allocator.rise, tracked_rise, allocator.live_at_peak[-8:])


def test_a_convolution_s_kernel_holds_more_than_its_output_and_a_fp32_product_only_its_output():
    aten = torch.ops.aten
    image, weight = torch.randn(2, 8, 16, 16), torch.randn(16, 8, 3, 3)
    convolution = (image, weight, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    output_bytes = 2 * 16 * 16 * 16 * 4
    assert kernel_buffers.probed(aten.convolution.default, convolution)
    assert kernel_buffers.rise_inside(aten.convolution.default, convolution) > output_bytes
    product = (torch.randn(64, 32), torch.randn(32, 48))
    assert not kernel_buffers.probed(aten.mm.default, product)  # fp32: no buffer, nothing probed
    with memory.recording_allocator() as record:
        aten.mm.default(*product)
    assert record.rise == 64 * 48 * 4


def test_a_probe_reads_only_shapes_so_a_fake_input_gets_the_real_kernel_s_answer():
    from torch._subclasses.fake_tensor import FakeTensorMode

    aten = torch.ops.aten
    a, b = torch.randn(17, 23, dtype=BF16), torch.randn(23, 41, dtype=BF16)  # shapes no other test probes
    a @ b  # oneDNN's first call of a shape may set up what later calls reuse
    with memory.recording_allocator() as real:
        aten.mm.default(a, b)
    with FakeTensorMode():
        fake = kernel_buffers.rise_inside(aten.mm.default, (torch.randn(17, 23, dtype=BF16),
                                                            torch.randn(23, 41, dtype=BF16)))
    assert fake == real.rise >= 17 * 41 * 2
