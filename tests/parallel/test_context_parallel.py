"""Context parallelism in a transformers model (lesson 9): layouts.apply_layout with cp, on launched gloo processes.

A tiny Llama whose sequences are split over two processes, attention by the
course's ring put in through transformers' attention registry, equals the
one-process model: its output, its loss and its gradients.
"""

import sys

import pytest
import torch

from balanced_moe import balanced_moe
from course_utils import launcher, layouts, memory, ring_attention, sharding

# It launches worker processes: make test runs the `forks` tests in a pytest process of their own (the Makefile says why).
pytestmark = pytest.mark.forks

BATCH_SIZE, SEQ_LEN = 2, 16


@pytest.fixture(autouse=True)
def launchable(monkeypatch):
    monkeypatch.delitem(sys.modules, "bitsandbytes", raising=False)


def tiny_llama(layers=2):
    """A Llama with grouped-query attention (4 query heads, 2 key/value heads), drawn from seed 0."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return LlamaForCausalLM(config)


def _batch():
    return memory.training_batch(tiny_llama(), BATCH_SIZE, SEQ_LEN, torch.Generator().manual_seed(1))


def _context_parallel_step(cp):
    import torch.distributed as dist

    with sharding.gloo_group():
        layout = layouts.Layout("none", cp, cp=cp)
        model = layouts.apply_layout(tiny_llama(), layout)
        outputs = model(**layouts.context_batch(_batch(), layout, dist.get_rank()))
        outputs.loss.backward()
        return (outputs.logits.detach(), outputs.loss.detach(), model.config._attn_implementation,
                {name: p.grad for name, p in model.named_parameters()})


@pytest.mark.parametrize("cp", [2, 4])
def test_a_llama_split_by_sequence_over_processes_equals_the_one_process_model(cp):
    ran = launcher.launch(_context_parallel_step, (cp,), num_processes=cp, quiet=True, oversubscribe=True,
                          timeout=300)
    reference = tiny_llama()
    outputs = reference(**_batch())
    outputs.loss.backward()
    # Each process holds its chunk of the sequence: together, the whole sequence's logits.
    assert torch.allclose(torch.cat([logits for logits, *_ in ran], dim=1), outputs.logits, atol=1e-6, rtol=0)
    # The processes' losses average to the one-process loss (each token's prediction counted once).
    assert torch.allclose(torch.stack([loss for _, loss, *_ in ran]).mean(), outputs.loss, atol=1e-6, rtol=0)
    assert {implementation for *_, implementation, _ in ran} == {ring_attention.RING_ATTENTION}
    gradients = [grads for *_, grads in ran]
    for name, parameter in reference.named_parameters():
        # Averaged over the processes as they accumulate: every process holds the same gradients...
        assert all(torch.equal(grads[name], gradients[0][name]) for grads in gradients), name
        # ... the one-process model's.
        assert torch.allclose(gradients[0][name], parameter.grad, atol=1e-6, rtol=1e-5), name


def test_a_process_s_batch_is_its_chunk_of_tokens_positions_and_labels_shifted_across_the_cut():
    batch = {"input_ids": torch.arange(8).reshape(1, 8), "labels": torch.arange(8).reshape(1, 8) + 100}
    layout = layouts.Layout("none", 2, cp=2)
    first, second = (layouts.context_batch(batch, layout, rank) for rank in (0, 1))
    assert first["input_ids"].tolist() == [[0, 1, 2, 3]] and second["input_ids"].tolist() == [[4, 5, 6, 7]]
    assert second["position_ids"].tolist() == [[4, 5, 6, 7]]
    # Token 3 predicts token 4, which sits on the next process; the last token predicts nothing.
    assert first["shift_labels"].tolist() == [[101, 102, 103, 104]]
    assert second["shift_labels"].tolist() == [[105, 106, 107, -100]]
    # Seven predicted tokens in the whole batch: each process's loss is its sum over 7 / 2.
    assert first["num_items_in_batch"].item() == second["num_items_in_batch"].item() == 3.5


def test_ring_attention_in_a_model_refuses_what_it_does_not_compute():
    model = tiny_llama(1)
    ring_attention.use_ring_attention(model)
    attention = model.model.layers[0].self_attn
    q = torch.ones(1, 4, 8, 8)
    kv = torch.ones(1, 2, 8, 8)
    with pytest.raises(ValueError, match="attention_mask"):
        ring_attention.ring_attention_forward(attention, q, kv, kv, torch.ones(1, 8))
    with pytest.raises(ValueError, match="dropout"):
        ring_attention.ring_attention_forward(attention, q, kv, kv, None, dropout=0.1)
    with pytest.raises(ValueError, match="scaling"):
        ring_attention.ring_attention_forward(attention, q, kv, kv, None, scaling=1.0)
    attention.is_causal = False
    with pytest.raises(ValueError, match="causal"):
        ring_attention.ring_attention_forward(attention, q, kv, kv, None)


def _expert_parallel_step():
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    with sharding.gloo_group():
        layout = layouts.Layout("none", 2, cp=2, ep=2)
        model = layouts.apply_layout(balanced_moe(), layout)
        batch = memory.training_batch(balanced_moe(), BATCH_SIZE, SEQ_LEN, torch.Generator().manual_seed(1))
        outputs = model(**layouts.context_batch(batch, layout, dist.get_rank()))
        outputs.loss.backward()
        return outputs.logits.detach(), outputs.loss.detach(), {
            name: (p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad) for name, p in model.named_parameters()}


def test_a_mixture_of_experts_with_its_experts_divided_over_the_processes_equals_the_one_process_model():
    """transformers' own expert parallelism (two all-to-alls) over the context-parallel processes, its routing forced."""
    ran = launcher.launch(_expert_parallel_step, (), num_processes=2, quiet=True, oversubscribe=True, timeout=300)
    reference = balanced_moe()
    outputs = reference(**memory.training_batch(reference, BATCH_SIZE, SEQ_LEN, torch.Generator().manual_seed(1)))
    outputs.loss.backward()
    assert torch.allclose(torch.cat([logits for logits, *_ in ran], dim=1), outputs.logits, atol=1e-6, rtol=0)
    assert torch.allclose(torch.stack([loss for _, loss, _ in ran]).mean(), outputs.loss, atol=1e-6, rtol=0)
    for name, parameter in reference.named_parameters():
        mine = [grads[name] for *_, grads in ran]
        if ".experts." in name:
            # Each process holds half of the experts (dim 0), and their whole gradient.
            assert mine[0].shape[0] == parameter.shape[0] // 2, name
            assert torch.allclose(torch.cat(mine), parameter.grad, atol=1e-6, rtol=1e-5), name
        else:
            assert torch.equal(mine[0], mine[1]), name
            assert torch.allclose(mine[0], parameter.grad, atol=1e-6, rtol=1e-5), name
