"""The step-time model, term by term: compute, recomputation, each collective, overlap, the optimizer step (issue 35)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from course_utils import comm_time, hardware, speed, step_time, utilisation


def _tiny_llama(layers: int = 2) -> torch.nn.Module:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return AutoModelForCausalLM.from_config(config)


def _cluster(world: int = 2, overlaps: bool = False, nodes: int = 1) -> step_time.Cluster:
    device = step_time.Device("test", "fp32", 1e12, "given", 0.5, "given", 1e11, "given")
    intra = step_time.Link("fast", 1e10, 1e-5, "given")
    inter = step_time.Link("slow", 1e9, 1e-4, "given") if nodes > 1 else None
    return step_time.Cluster(device, world, nodes, intra, inter, overlaps)


def test_the_workload_counts_what_lesson_8_counts():
    model = _tiny_llama()
    workload = step_time.workload_of(model)
    assert workload.matmul_weights == speed.matmul_weights(model)
    assert (workload.layers, workload.width) == speed.model_shape(model)
    assert workload.parameters == sum(p.numel() for p in model.parameters())
    assert workload.units == 3  # two blocks and the root
    assert (workload.stored_bytes, workload.parameter_bytes, workload.gradient_bytes) == (4, 4, 4)


def test_compute_is_lesson_8s_flops_over_peak_times_fraction():
    workload = step_time.workload_of(_tiny_llama())
    predicted = step_time.predict_step(workload, _cluster(1), "none", 4, 32)
    flops = 4 * 32 * speed.flops_per_token(workload.matmul_weights, workload.layers, 32, workload.width)
    assert predicted.model_flops == flops
    assert predicted.compute == pytest.approx(flops / (1e12 * 0.5))
    assert predicted.communication == () and predicted.exposed == 0


def test_the_steps_flops_are_what_flop_counter_mode_counts():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=100, n_positions=64, n_embd=64, n_layer=2, n_head=2))
    ids = torch.randint(100, (2, 64))
    counted = utilisation.count_flops(lambda: model(input_ids=ids, labels=ids).loss.backward())
    predicted = step_time.predict_step(step_time.workload_of(model), _cluster(1), "none", 2, 64).model_flops
    assert predicted == pytest.approx(counted, rel=0.01)  # lesson 8's check, on the model's own count


def _tiny_mixtral(top_k: int, implementation: str = "eager") -> torch.nn.Module:
    from transformers import MixtralConfig

    torch.manual_seed(0)
    config = MixtralConfig(vocab_size=64, hidden_size=64, intermediate_size=256, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                           num_experts_per_tok=top_k, max_position_embeddings=64)
    # Eager experts and attention: FlopCounterMode has no formula for torch._grouped_mm (transformers' default
    # experts) nor for the CPU's fused attention, so only the eager kernels are counted whole.
    return AutoModelForCausalLM.from_config(config, experts_implementation=implementation, attn_implementation="eager")


@pytest.mark.parametrize("top_k", [1, 2])
def test_a_mixture_of_experts_step_counts_the_active_experts_as_flop_counter_mode_does(top_k):
    model = _tiny_mixtral(top_k)
    ids = torch.randint(64, (2, 32))
    counted = utilisation.count_flops(lambda: model(input_ids=ids, labels=ids).loss.backward())
    workload = step_time.workload_of(model)
    predicted = step_time.predict_step(workload, _cluster(1), "none", 2, 32)
    assert predicted.model_flops == counted
    # Every expert on every token would be 4 / top_k times the experts' FLOPs: shown, not run.
    every, active = speed.expert_weights(model)
    assert every == 4 * active // top_k
    assert predicted.every_expert_flops == counted + 2 * 32 * 6 * (every - active) > counted


def test_fused_experts_are_counted_though_they_are_not_linear_layers():
    # transformers 5's default experts are 3-D parameters: before the count knew them, no expert was counted.
    model = _tiny_mixtral(2, "grouped_mm")
    dense = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    every, active = speed.expert_weights(model)
    router = 2 * 4 * 64  # experts x width per layer
    assert speed.matmul_weights(model) == dense + router + active
    assert speed.matmul_weights(model, experts="all") == dense + router + every
    assert speed.expert_weights(_tiny_llama()) == (0, 0)
    assert step_time.predict_step(step_time.workload_of(_tiny_llama()), _cluster(1), "none", 1, 8).every_expert_flops is None


def test_checkpointing_recomputes_one_forward_a_third_of_the_step():
    workload = step_time.workload_of(_tiny_llama())
    plain = step_time.predict_step(workload, _cluster(1), "none", 4, 32)
    checkpointed = step_time.predict_step(workload, _cluster(1), "none", 4, 32, checkpointing=True)
    assert checkpointed.recompute == pytest.approx(plain.compute / 3)
    assert checkpointed.hardware_flops == pytest.approx(plain.model_flops * 4 / 3)
    assert checkpointed.hfu == pytest.approx(checkpointed.mfu * 4 / 3)
    assert plain.hfu == plain.mfu


def test_frozen_weights_do_no_weight_gradient():
    model = _tiny_llama()
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            module.weight.requires_grad_(False)
    workload = step_time.workload_of(model)
    assert workload.frozen_matmul_weights == workload.matmul_weights
    full = step_time.predict_step(dataclasses.replace(workload, frozen_matmul_weights=0), _cluster(1), "none", 1, 16)
    frozen = step_time.predict_step(workload, _cluster(1), "none", 1, 16)
    assert full.model_flops - frozen.model_flops == 16 * 2 * workload.matmul_weights


def test_ddp_all_reduces_the_gradients_in_25_mib_buckets():
    workload = dataclasses.replace(step_time.workload_of(_tiny_llama()), trainable=20 * 1024**2)  # 80 MiB of fp32
    (reduce,) = step_time.collectives_of(workload, "ddp", 4)
    assert (reduce.name, reduce.payload, reduce.messages) == ("all_reduce", 80 * 1024**2, 4)


def test_each_layout_runs_the_collectives_torch_runs():
    workload = step_time.workload_of(_tiny_llama())
    names = {layout: [c.name for c in step_time.collectives_of(workload, layout, 2)] for layout in step_time.LAYOUTS}
    assert names["none"] == []
    assert names["ddp"] == ["all_reduce"]
    assert names["zero1"] == ["all_reduce", "broadcast"]
    assert names["zero2"] == ["all_gather_single", "reduce_scatter_single"]
    assert names["zero3"] == names["fsdp"] == ["all_gather_single", "all_gather_single", "reduce_scatter_single"]
    assert step_time.collectives_of(workload, "zero3", 1) == []


def test_communication_is_lesson_7s_wire_bytes_over_the_link_plus_latency_per_message():
    workload = step_time.workload_of(_tiny_llama())
    predicted = step_time.predict_step(workload, _cluster(2), "zero3", 2, 16)
    for (name, wire, seconds), collective in zip(predicted.communication,
                                                 step_time.collectives_of(workload, "zero3", 2)):
        assert wire == comm_time.wire_bytes(name, collective.payload, 2)
        assert seconds == pytest.approx(collective.messages * 1e-5 + wire / 1e10)
    assert predicted.exposed == pytest.approx(predicted.communication_total)  # nothing overlaps on this cluster


def test_a_ring_over_several_nodes_runs_at_the_networks_speed():
    workload = step_time.workload_of(_tiny_llama())
    one_node = step_time.predict_step(workload, _cluster(4), "ddp", 2, 16)
    two_nodes = step_time.predict_step(workload, _cluster(2, nodes=2), "ddp", 2, 16)
    assert two_nodes.communication_total > 5 * one_node.communication_total


def test_overlap_hides_communication_behind_its_pass_but_never_the_first_message():
    workload = step_time.workload_of(_tiny_llama())
    hidden = step_time.predict_step(workload, _cluster(2, overlaps=True), "zero3", 8, 64)
    exposed = step_time.predict_step(workload, _cluster(2, overlaps=False), "zero3", 8, 64)
    assert 0 < hidden.exposed < exposed.exposed == pytest.approx(exposed.communication_total)
    assert hidden.step == pytest.approx(hidden.compute + hidden.recompute + hidden.exposed + hidden.optimizer)


def test_zero1s_broadcasts_follow_the_optimizer_step_and_hide_behind_nothing():
    workload = step_time.workload_of(_tiny_llama())
    predicted = step_time.predict_step(workload, _cluster(2, overlaps=True), "zero1", 64, 64)
    broadcast = dict((name, seconds) for name, _, seconds in predicted.communication)["broadcast"]
    assert predicted.exposed >= broadcast


def test_the_optimizer_step_reads_and_writes_adamws_bytes_at_the_memory_bandwidth_sharded_under_zero():
    workload = step_time.workload_of(_tiny_llama())
    alone = step_time.predict_step(workload, _cluster(1), "none", 1, 16)
    assert alone.optimizer == pytest.approx(workload.trainable * 28 / 1e11)  # fp32: 4 read, 3 written, 4 bytes each
    sharded = step_time.predict_step(workload, _cluster(2), "zero2", 1, 16)
    assert sharded.optimizer == pytest.approx(alone.optimizer / 2)


def test_tokens_per_second_mfu_and_hfu_follow_from_the_step():
    workload = step_time.workload_of(_tiny_llama())
    predicted = step_time.predict_step(workload, _cluster(2), "ddp", 4, 32, gradient_accumulation_steps=2)
    assert predicted.tokens_per_second == pytest.approx(2 * 4 * 32 * 2 / predicted.step)
    assert predicted.mfu == pytest.approx(predicted.model_flops / predicted.step / 1e12)


def test_a_gpu_cluster_takes_the_cards_sourced_figures():
    cluster = step_time.gpu_cluster("H100 SXM", 8, 2, "bf16", "InfiniBand NDR 400 Gb/s per GPU")
    assert cluster.world_size == 16
    assert cluster.device.peak == hardware.peak_flops("H100 SXM", "bf16")
    assert cluster.device.fraction == hardware.achievable_fraction("H100 SXM", "bf16").value
    assert cluster.intra.bandwidth == 450e9 and cluster.ring_link.bandwidth == 50e9 and cluster.overlaps


def test_a_card_without_a_published_matmul_measurement_runs_at_its_peak_and_says_so():
    device = step_time.gpu_device("L4", "bf16")
    assert device.fraction == 1 and "lower bound" in device.fraction_source


def test_several_nodes_need_a_network():
    with pytest.raises(ValueError, match="network"):
        step_time.gpu_cluster("A100 80GB", 8, 2)
