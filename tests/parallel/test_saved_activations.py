"""The activation meter counts what autograd keeps for the backward pass, while autograd keeps it."""

import torch

from course_utils.saved_activations import ActivationMeter


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.GELU(), torch.nn.Linear(32, 8))


def test_it_counts_the_saved_activations_and_not_the_weights():
    model, x = mlp(), torch.randn(4, 8)
    with ActivationMeter(model) as meter:
        model(x).sum().backward()
    # saved: the input (for the first weight's gradient), the first output (GELU's input), GELU's output.
    assert meter.saved == 4 * (4 * 8 + 4 * 32 + 4 * 32)


def test_what_the_backward_pass_used_is_released():
    model = mlp()
    with ActivationMeter(model) as meter:
        losses = [model(torch.randn(4, 8)).sum() for _ in range(3)]
        held = meter.live
        losses[0].backward()
        assert meter.live == held * 2 // 3
        for loss in losses[1:]:
            loss.backward()
    assert meter.live == 0 and meter.peak == held


def test_a_storage_saved_twice_counts_once():
    x = torch.randn(16, requires_grad=True)
    with ActivationMeter() as meter:
        (x * x).sum().backward()
    assert meter.saved == 16 * 4  # x * x saves x as both operands: one storage
