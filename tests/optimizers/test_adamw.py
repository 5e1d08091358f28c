"""The from-scratch AdamW of lesson 2 is torch.optim.AdamW, written out (course_utils.adamw)."""

import inspect

import pytest
import torch

from course_utils import adamw


def make_problem(num_steps=8, shape=(5, 3), dtype=torch.float64, seed=0):
    """A starting weight and a gradient per step. float64, so that agreement is not blurred by rounding."""
    generator = torch.Generator().manual_seed(seed)
    initial_param = torch.randn(shape, generator=generator, dtype=dtype)
    gradients = [torch.randn(shape, generator=generator, dtype=dtype) for _ in range(num_steps)]
    return initial_param, gradients


def max_difference(history_a, history_b):
    return max((a[key] - b[key]).abs().max().item() for a, b in zip(history_a, history_b) for key in a)


@pytest.mark.parametrize("weight_decay", [0.0, 0.01, 0.3])
@pytest.mark.parametrize("lr", [1e-3, 0.1])
def test_from_scratch_step_matches_torch_adamw_over_several_steps(weight_decay, lr):
    initial_param, gradients = make_problem()
    ours = adamw.run_steps(adamw.adamw_step, initial_param, gradients, lr=lr, weight_decay=weight_decay)
    torchs = adamw.run_torch_adamw(initial_param, gradients, lr=lr, weight_decay=weight_decay)
    assert len(ours) == len(torchs) == len(gradients)
    assert max_difference(ours, torchs) < 1e-6


def test_from_scratch_step_matches_torch_adamw_with_other_betas_and_eps():
    initial_param, gradients = make_problem()
    hyperparameters = dict(lr=0.05, beta1=0.5, beta2=0.9, eps=1e-3, weight_decay=0.1)
    ours = adamw.run_steps(adamw.adamw_step, initial_param, gradients, **hyperparameters)
    assert max_difference(ours, adamw.run_torch_adamw(initial_param, gradients, **hyperparameters)) < 1e-6


def test_float32_steps_agree_with_torch_up_to_rounding():
    initial_param, gradients = make_problem(dtype=torch.float32)
    ours = adamw.run_steps(adamw.adamw_step, initial_param, gradients, weight_decay=0.01)
    assert max_difference(ours, adamw.run_torch_adamw(initial_param, gradients, weight_decay=0.01)) < 1e-5


def test_adam_with_l2_is_torch_adam_with_weight_decay():
    initial_param, gradients = make_problem()
    ours = adamw.run_steps(adamw.adam_l2_step, initial_param, gradients, lr=0.01, weight_decay=0.1)
    param = torch.nn.Parameter(initial_param.clone())
    optimizer = torch.optim.Adam([param], lr=0.01, weight_decay=0.1)
    for grad in gradients:
        param.grad = grad.clone()
        optimizer.step()
    assert torch.allclose(ours[-1]["param"], param.detach(), atol=1e-10)


def test_adam_with_l2_differs_from_adamw_when_weight_decay_is_positive():
    initial_param, gradients = make_problem()
    decoupled = adamw.run_steps(adamw.adamw_step, initial_param, gradients, lr=0.01, weight_decay=0.1)
    through_gradient = adamw.run_steps(adamw.adam_l2_step, initial_param, gradients, lr=0.01, weight_decay=0.1)
    assert (decoupled[-1]["param"] - through_gradient[-1]["param"]).abs().max() > 1e-4
    # Through the gradient, the decay also changes the moving averages; decoupled, it cannot.
    assert not torch.allclose(decoupled[-1]["exp_avg"], through_gradient[-1]["exp_avg"])


def test_adam_with_l2_equals_adamw_without_weight_decay():
    initial_param, gradients = make_problem()
    decoupled = adamw.run_steps(adamw.adamw_step, initial_param, gradients, weight_decay=0.0)
    through_gradient = adamw.run_steps(adamw.adam_l2_step, initial_param, gradients, weight_decay=0.0)
    assert max_difference(decoupled, through_gradient) == 0


@pytest.mark.parametrize("gradient_scale", [1e-3, 1.0, 1e3])
def test_bias_correction_makes_the_first_step_size_lr_whatever_the_gradient_scale(gradient_scale):
    param = torch.ones(4, dtype=torch.float64)
    grad = gradient_scale * torch.tensor([1.0, -2.0, 0.5, 3.0], dtype=torch.float64)
    zeros = torch.zeros_like(param)
    new_param, _, _ = adamw.adamw_step(param, grad, zeros, zeros, step=1, lr=1e-3, weight_decay=0.0)
    assert torch.allclose((param - new_param).abs(), torch.full_like(param, 1e-3), rtol=1e-4)


def test_without_bias_correction_the_first_update_would_be_about_three_times_lr():
    traces = adamw.ema_traces([0.7, 0.7], beta1=0.9, beta2=0.999, lr=1e-3)
    assert traces["update"][0].item() == pytest.approx(1e-3, rel=1e-4)
    # (1 - beta1) / sqrt(1 - beta2) = 0.1 / 0.0316 = 3.16
    assert traces["update_without_bias_correction"][0].item() == pytest.approx(1e-3 * 0.1 / 0.001**0.5, rel=1e-4)


def test_a_constant_gradient_moves_the_weight_by_lr_every_step():
    traces = adamw.ema_traces([2.5] * 50, lr=1e-2)
    assert torch.allclose(traces["exp_avg_hat"], torch.full((50,), 2.5, dtype=torch.float64))
    assert torch.allclose(traces["update"], torch.full((50,), 1e-2, dtype=torch.float64), rtol=1e-6)


def test_ema_traces_are_the_exp_avg_and_exp_avg_sq_torch_keeps():
    gradients = adamw.noisy_gradients(num_steps=30, seed=1).double()
    traces = adamw.ema_traces(gradients, beta1=0.8, beta2=0.95)
    history = adamw.run_torch_adamw(
        torch.zeros(1, dtype=torch.float64), [g.reshape(1) for g in gradients], beta1=0.8, beta2=0.95
    )
    assert torch.allclose(traces["exp_avg"], torch.cat([h["exp_avg"] for h in history]))
    assert torch.allclose(traces["exp_avg_sq"], torch.cat([h["exp_avg_sq"] for h in history]))


def test_the_step_leaves_its_inputs_untouched():
    param, (grad,) = make_problem(num_steps=1)
    exp_avg, exp_avg_sq = torch.ones_like(param), torch.ones_like(param)
    copies = [t.clone() for t in (param, grad, exp_avg, exp_avg_sq)]
    adamw.adamw_step(param, grad, exp_avg, exp_avg_sq, step=3, weight_decay=0.1)
    for before, after in zip(copies, (param, grad, exp_avg, exp_avg_sq)):
        assert torch.equal(before, after)


def test_noisy_gradients_are_reproducible_with_a_clear_then_noisy_then_reversed_signal():
    gradients = adamw.noisy_gradients(num_steps=300, seed=0)
    assert gradients.shape == (300,) and gradients.dtype == torch.float32
    assert torch.equal(gradients, adamw.noisy_gradients(num_steps=300, seed=0))
    first, second, third = gradients[:100], gradients[100:200], gradients[200:]
    assert first.mean() > 0.8 and third.mean() < -0.8
    assert second.std() > 2 * first.std()


@pytest.mark.parametrize(
    "overrides, argument",
    [
        ({"lr": 0.0}, "lr"),
        ({"beta1": 1.0}, "beta1"),
        ({"beta2": -0.1}, "beta2"),
        ({"eps": 0}, "eps"),
        ({"weight_decay": -0.01}, "weight_decay"),
    ],
)
def test_bad_hyperparameters_are_named_where_a_step_function_is_run(overrides, argument):
    for run in (lambda: adamw.run_steps(adamw.adamw_step, torch.zeros(2), [torch.ones(2)], **overrides),
                lambda: adamw.run_torch_adamw(torch.zeros(2), [torch.ones(2)], **overrides)):
        with pytest.raises(ValueError, match=rf"^{argument} must"):
            run()


def test_the_displayed_step_checks_in_one_line_and_has_torch_adamws_defaults():
    source = inspect.getsource(adamw.adamw_step)
    # Lesson 2 shows this source: one line checks the arguments (step 0 returned NaN weights, issue 22), no more.
    assert "raise" not in source and source.count("_check") == 1
    with pytest.raises(ValueError, match="^step must be a positive int"):
        adamw.adamw_step(torch.ones(1), torch.ones(1), torch.zeros(1), torch.zeros(1), step=0)
    defaults = {name: p.default for name, p in inspect.signature(adamw.adamw_step).parameters.items()
                if p.default is not inspect.Parameter.empty}
    torch_defaults = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))]).defaults
    assert defaults == {"lr": torch_defaults["lr"], "beta1": torch_defaults["betas"][0], "beta2": torch_defaults["betas"][1],
                        "eps": torch_defaults["eps"], "weight_decay": torch_defaults["weight_decay"]}


def test_the_module_docstring_gives_the_update_the_step_computes():
    assert "param = param - lr * wd * param - lr * m_hat / (sqrt(v_hat) + eps)" in adamw.__doc__
    param, grad = torch.tensor([2.0], dtype=torch.float64), torch.tensor([0.5], dtype=torch.float64)
    zeros = torch.zeros_like(param)
    new_param, _, _ = adamw.adamw_step(param, grad, zeros, zeros, step=1, lr=0.1, weight_decay=0.5)
    # First step: m_hat = g and sqrt(v_hat) = |g|, so the step is lr * g / (|g| + eps); decay from the old weight.
    assert new_param.item() == pytest.approx(2.0 - 0.1 * 0.5 * 2.0 - 0.1 * 0.5 / (0.5 + 1e-8), abs=1e-12)


@pytest.mark.parametrize("gradient", [1e-11, 1e-12, -3e-12])
def test_below_eps_adam_steps_like_sgd_with_learning_rate_lr_over_eps(gradient):
    param, grad = torch.zeros(1, dtype=torch.float64), torch.tensor([gradient], dtype=torch.float64)
    zeros = torch.zeros_like(param)
    new_param, _, _ = adamw.adamw_step(param, grad, zeros, zeros, step=1, lr=1e-3, eps=1e-8, weight_decay=0.0)
    sgd_step = 1e-3 / 1e-8 * gradient
    assert -new_param.item() == pytest.approx(sgd_step, rel=2e-3)
    assert abs(new_param.item()) < 1e-5  # a thousandth of lr or less: nothing like the step of size lr above eps


def test_bad_inputs_to_the_helpers_name_the_argument():
    with pytest.raises(ValueError, match="gradients must"):
        adamw.ema_traces([])
    with pytest.raises(ValueError, match="beta2 must"):
        adamw.ema_traces([1.0], beta2=1.5)
    with pytest.raises(ValueError, match="num_steps must"):
        adamw.noisy_gradients(num_steps=0)
    with pytest.raises(TypeError, match="step_function must be callable"):
        adamw.run_steps("adamw", torch.zeros(2), [torch.ones(2)])
    with pytest.raises(ValueError, match=r"gradients\[1\] must"):
        adamw.run_torch_adamw(torch.zeros(2), [torch.ones(2), torch.ones(3)])
    with pytest.raises(TypeError, match="hyperparameters has unknown names"):
        adamw.run_torch_adamw(torch.zeros(2), [torch.ones(2)], betas=(0.9, 0.99))
    with pytest.raises(TypeError, match="optimizer must be"):
        adamw.optimizer_state_table({})


def test_state_table_shows_shapes_and_dtypes_and_stays_short():
    model = torch.nn.Sequential(*[torch.nn.Linear(3, 3) for _ in range(4)])
    optimizer = torch.optim.AdamW(model.parameters())
    assert "empty" in adamw.optimizer_state_table(optimizer)
    model(torch.randn(2, 3)).sum().backward()
    optimizer.step()
    table = adamw.optimizer_state_table(optimizer, model, max_rows=2)
    assert "0.weight" in table and "exp_avg: 3x3 float32" in table and "step: scalar float32" in table
    assert "... and 6 more parameters" in table
    assert "tensor(" not in table
