"""Specification of course_utils.fidelity: the same recorded gradients replayed through any optimizer."""

import pytest
import torch

from course_utils.fidelity import record_gradients, relative_distance, replay_gradients


class _TinyClassifier(torch.nn.Module):
    """A model with the Hugging Face call signature, small enough for a unit test."""

    def __init__(self):
        super().__init__()
        self.embedding = torch.nn.Embedding(20, 8)
        self.head = torch.nn.Linear(8, 2)

    def forward(self, input_ids, attention_mask, labels):
        pooled = (self.embedding(input_ids) * attention_mask[..., None]).mean(dim=1)
        loss = torch.nn.functional.cross_entropy(self.head(pooled), labels)
        return type("Output", (), {"loss": loss})()


def _batches(count):
    generator = torch.Generator().manual_seed(0)
    return [
        {
            "input_ids": torch.randint(0, 20, (4, 5), generator=generator),
            "attention_mask": torch.ones(4, 5),
            "labels": torch.randint(0, 2, (4,), generator=generator),
        }
        for _ in range(count)
    ]


def test_record_gradients_returns_one_copy_per_batch_and_parameter_and_leaves_the_model_alone():
    torch.manual_seed(0)
    model = _TinyClassifier()
    before = [p.detach().clone() for p in model.parameters()]
    gradients = record_gradients(model, _batches(5), max_batches=3)
    assert len(gradients) == 3 and all(len(step) == 3 for step in gradients)
    assert gradients[0][1].shape == model.head.weight.shape
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))


def test_replaying_through_plain_sgd_moves_weights_by_minus_lr_times_the_summed_gradients():
    torch.manual_seed(0)
    model = _TinyClassifier()
    gradients = record_gradients(model, _batches(3))
    updates, optimizer = replay_gradients(model, gradients, "sgd", lr=0.1)
    assert isinstance(optimizer, torch.optim.SGD)
    for index, update in enumerate(updates):
        expected = -0.1 * sum(step[index] for step in gradients)
        torch.testing.assert_close(update, expected)


def test_relative_distance_is_zero_for_identical_updates_and_one_for_no_update():
    torch.manual_seed(0)
    reference = [torch.randn(3, 4), torch.randn(5)]
    assert relative_distance(reference, reference) == 0.0
    assert relative_distance([torch.zeros(3, 4), torch.zeros(5)], reference) == pytest.approx(1.0)


def test_relative_distance_rejects_mismatched_lists():
    with pytest.raises(ValueError, match="equal length"):
        relative_distance([torch.zeros(2)], [])
    with pytest.raises(ValueError, match="shape"):
        relative_distance([torch.zeros(2)], [torch.ones(3)])
    with pytest.raises(ValueError, match="all zeros"):
        relative_distance([torch.zeros(2)], [torch.zeros(2)])


def test_replay_leaves_the_original_model_untouched_and_names_a_mismatched_gradient_list():
    torch.manual_seed(0)
    model = _TinyClassifier()
    before = [p.detach().clone() for p in model.parameters()]
    gradients = record_gradients(model, _batches(2))
    replay_gradients(model, gradients, "adamw", lr=0.1)
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))
    with pytest.raises(ValueError, match=r"gradients\[0\] must be a list of 3 tensors, one per trainable parameter; got 1 tensors"):
        replay_gradients(model, [gradients[0][:1]], "sgd", lr=0.1)
    with pytest.raises(ValueError, match="gradients must be a non-empty list of steps"):
        replay_gradients(model, [], "sgd", lr=0.1)
