"""The step-time model, term by term: compute, recomputation, each collective, overlap, the optimizer step (issue 35)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from course_utils import comm_time, hardware, pipeline, speed, step_time, utilisation


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


def test_zero1s_broadcasts_are_issued_together_their_latency_paid_once_per_owner():
    workload = step_time.workload_of(_tiny_llama())
    (_, broadcast) = step_time.collectives_of(workload, "zero1", 2)
    assert broadcast.messages == 2 and broadcast.payload == workload.trainable * workload.parameter_bytes


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


# --------------------------------------------------------------------------- tensor and pipeline parallelism


def _two_nodes(per_node: int = 4, overlaps: bool = False) -> step_time.Cluster:
    return _cluster(per_node, overlaps=overlaps, nodes=2)


def test_tensor_parallelism_all_reduces_each_blocks_activation_twice_forward_and_twice_backward():
    workload = step_time.workload_of(_tiny_llama())
    rows = step_time.model_parallel_collectives(workload, 2, 1, tokens=4 * 32, activation_bytes=4)
    assert [(c.name, c.messages, c.during) for c in rows] == [("all_reduce", 4, "forward"), ("all_reduce", 4, "backward")]
    assert all(c.payload == 4 * (4 * 32 * 64 * 4) for c in rows)  # 4 messages of the whole activation: tokens x width x bytes


def test_sequence_parallelism_gathers_and_scatters_the_same_bytes_on_the_ring():
    workload = step_time.workload_of(_tiny_llama())
    plain = step_time.predict_step(workload, _cluster(2), "none", 4, 32, tp=2)
    sequence = step_time.predict_step(workload, _cluster(2), "none", 4, 32, tp=2, sequence_parallel=True)
    assert sum(w for _, w, _ in plain.communication) == pytest.approx(sum(w for _, w, _ in sequence.communication))
    assert {name.split()[1] for name, _, _ in sequence.communication} == {"all_gather_single", "reduce_scatter_single"}


def test_each_process_computes_its_share_of_the_replica_and_holds_its_share_of_the_gradients():
    workload = step_time.workload_of(_tiny_llama())
    alone = step_time.predict_step(workload, _cluster(2), "ddp", 4, 32)
    split = step_time.predict_step(workload, _cluster(8), "ddp", 4, 32, tp=2, pp=2, microbatches=2)
    assert split.model_flops == pytest.approx(alone.model_flops / 4)
    (ddp_alone,) = [w for name, w, _ in alone.communication if name == "all_reduce"]
    (ddp_split,) = [w for name, w, _ in split.communication if name == "all_reduce"]
    assert ddp_split == pytest.approx(ddp_alone / 4, rel=0.01)


def test_the_tp_group_runs_on_the_node_link_when_it_fits_in_a_node_and_on_the_network_when_it_does_not():
    workload = step_time.workload_of(_tiny_llama())
    inside = step_time.predict_step(workload, _two_nodes(4), "none", 4, 32, tp=4, pp=2, microbatches=2)
    across = step_time.predict_step(workload, _two_nodes(4), "none", 4, 32, tp=8)
    tp_seconds = lambda step: sum(s for name, _, s in step.communication if name.startswith("tp "))  # noqa: E731
    tp_wire = lambda step: sum(w for name, w, _ in step.communication if name.startswith("tp "))  # noqa: E731
    # 1e10 B/s and 1e-5 s inside a node, 1e9 B/s and 1e-4 s between. Inside: 1 block per stage, 4 all-reduces
    # per micro-batch, 2 micro-batches; across: 2 blocks, 8 all-reduces.
    assert tp_seconds(inside) == pytest.approx(tp_wire(inside) / 1e10 + 8 * 1e-5)
    assert tp_seconds(across) == pytest.approx(tp_wire(across) / 1e9 + 8 * 1e-4)


def test_the_pipeline_bubble_is_p_minus_1_over_m_plus_p_minus_1_of_the_pipelined_passes():
    workload = step_time.workload_of(_tiny_llama(4))
    for pp, microbatches in ((2, 1), (2, 4), (4, 8)):
        step = step_time.predict_step(workload, _cluster(pp), "none", 8, 32, pp=pp, microbatches=microbatches)
        pipelined = step.compute + step.bubble
        assert step.bubble / pipelined == pytest.approx(pipeline.bubble_formula(pp, microbatches))
        assert step.bubble / pipelined == pytest.approx((pp - 1) / (microbatches + pp - 1))
        assert step.parts()["pipeline bubble"] == step.bubble


def test_a_stage_sends_each_microbatchs_activation_and_receives_its_gradient_and_only_the_fill_is_exposed():
    workload = step_time.workload_of(_tiny_llama(4))
    exposed = step_time.predict_step(workload, _cluster(2), "none", 8, 32, pp=2, microbatches=4)
    sends = [(name, wire, seconds) for name, wire, seconds in exposed.communication if name.startswith("pp send")]
    assert [name for name, _, _ in sends] == ["pp send (forward)", "pp send (backward)"]
    assert all(wire == 4 * (8 // 4) * 32 * 64 * 4 for _, wire, _ in sends)  # 4 micro-batches of 2 x 32 x 64 fp32
    assert exposed.exposed == pytest.approx(sum(seconds for _, _, seconds in sends))
    overlapped = step_time.predict_step(workload, _cluster(2, overlaps=True), "none", 8, 32, pp=2, microbatches=4)
    assert overlapped.exposed == pytest.approx(exposed.exposed / 4)  # p - 1 = 1 of the 4 sends each way
    assert set(step_time.EXPOSURE) == {"tp", "pp send", "bubble", "dp"}


def test_model_parallel_degrees_that_do_not_fit_the_cluster_or_the_batch_are_refused():
    workload = step_time.workload_of(_tiny_llama())
    with pytest.raises(ValueError, match="tp x pp must divide"):
        step_time.predict_step(workload, _cluster(4), "none", 4, 32, tp=3)
    with pytest.raises(ValueError, match="microbatches must divide"):
        step_time.predict_step(workload, _cluster(2), "none", 4, 32, pp=2, microbatches=3)
    with pytest.raises(ValueError, match="microbatches cut a batch"):
        step_time.predict_step(workload, _cluster(2), "ddp", 4, 32, microbatches=2)


# --------------------------------------------------------------------------- the framework's own work, where measured


def _costs() -> step_time.FrameworkCosts:
    return step_time.FrameworkCosts({"ddp": 1e-3, "zero1": 1e-3, "zero2": 2e-3, "zero3": 3e-3},
                                    {"ddp": 0.0, "zero1": 1e-5, "zero2": 1e-4, "zero3": 1e-4}, 1e10, "given")


def test_the_framework_costs_per_unit_per_tensor_and_per_byte_copied():
    workload = step_time.workload_of(_tiny_llama())
    cluster = dataclasses.replace(_cluster(2), framework=_costs())
    seconds = step_time.framework_seconds(workload, cluster, "zero3", gradient_accumulation_steps=2)
    copies = step_time.copy_bytes(workload, "zero3", 2)
    assert seconds == pytest.approx(3e-3 * workload.units * 2 + 1e-4 * workload.tensors + 2 * copies / 1e10)
    assert step_time.framework_seconds(workload, cluster, "fsdp") == step_time.framework_seconds(workload, cluster, "zero3")
    predicted = step_time.predict_step(workload, cluster, "zero3", 4, 32)
    assert predicted.framework == step_time.framework_seconds(workload, cluster, "zero3") > 0
    assert predicted.parts()["framework (exposed)"] == predicted.framework
    assert step_time.predict_step(workload, _cluster(2), "zero3", 4, 32).framework == 0  # GPUs: not measured, hidden


def test_the_copies_into_and_out_of_the_buffers_follow_each_layouts_collectives():
    workload = step_time.workload_of(_tiny_llama())
    full, gradients = workload.parameters * 4, workload.trainable * 4
    assert step_time.copy_bytes(workload, "ddp", 2) == step_time.copy_bytes(workload, "zero1", 2) == 4 * gradients
    zero2 = step_time.copy_bytes(workload, "zero2", 2)
    assert step_time.copy_bytes(workload, "zero3", 2) - zero2 == pytest.approx(2 * (full + full / 2))  # the second gather
    assert step_time.copy_bytes(workload, "zero3", 1) == step_time.copy_bytes(workload, "none", 4) == 0


def test_a_link_runs_a_collective_measured_apart_at_its_own_bandwidth():
    link = step_time.Link("gloo", 1e9, 0.0, "given", {"all_gather_single": 5e8})
    assert link.bandwidth_of("all_gather_single") == 5e8 and link.bandwidth_of("all_reduce") == 1e9
