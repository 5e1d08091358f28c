"""The plain loop and the Accelerate loop (lesson 1) are twins and train identically."""

import pytest
import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import DataLoader
from transformers import DistilBertConfig, DistilBertForSequenceClassification

from course_utils import loops


def tiny_classifier():
    config = DistilBertConfig(vocab_size=50, dim=16, n_layers=1, n_heads=2, hidden_dim=32, max_position_embeddings=16)
    return DistilBertForSequenceClassification(config)


def random_pair_batches(num_examples=48, seq_len=10, batch_size=8, seed=0):
    generator = torch.Generator().manual_seed(seed)
    examples = [
        {
            "input_ids": torch.randint(0, 50, (seq_len,), generator=generator),
            "attention_mask": torch.ones(seq_len, dtype=torch.long),
            "labels": torch.randint(0, 2, (), generator=generator),
        }
        for _ in range(num_examples)
    ]
    return DataLoader(examples, batch_size=batch_size, shuffle=True, generator=torch.Generator().manual_seed(seed))


def train_from_seed(loop, seed=0, num_epochs=2, **loop_options):
    set_seed(seed)
    model = tiny_classifier()
    dataloader = random_pair_batches(seed=seed)
    optimizer, lr_scheduler = loops.make_optimizer_and_scheduler(model, num_epochs * len(dataloader), lr=1e-2)
    losses = loop(model, optimizer, lr_scheduler, dataloader, num_epochs=num_epochs, show_progress=False, **loop_options)
    return model, losses, lr_scheduler


def without_signature_name(lines):
    return [lines[0].replace("train_plain", "LOOP").replace("train_accelerate", "LOOP")] + lines[1:]


def test_accelerate_loop_is_the_plain_loop_plus_marked_changes():
    plain = loops.loop_source(loops.train_plain, drop_marker=loops.PLAIN_MARKER)
    accelerated = loops.loop_source(loops.train_accelerate, drop_marker=loops.ACCELERATE_MARKER)
    assert without_signature_name(plain) == without_signature_name(accelerated)


def test_each_loop_has_the_changes_the_lesson_teaches():
    plain = "\n".join(loops.loop_source(loops.train_plain))
    accelerated = "\n".join(loops.loop_source(loops.train_accelerate))
    assert "loss.backward()" in plain and "loss.backward()" not in accelerated
    assert "accelerator.backward(loss)" in accelerated
    assert ".to(device)" in plain and ".to(device)" not in accelerated
    assert "accelerator.prepare(" in accelerated


def test_loop_diff_shows_both_loops_without_markers():
    html = loops.loop_diff_html()
    assert "train_plain" in html and "train_accelerate" in html
    assert "[plain]" not in html and "[accelerate]" not in html
    assert "accelerator.backward(loss)" in html


def test_both_loops_give_the_same_losses_and_parameters_from_the_same_seed():
    plain_model, plain_losses, _ = train_from_seed(loops.train_plain)
    accelerated_model, accelerated_losses, _ = train_from_seed(loops.train_accelerate, accelerator=Accelerator(cpu=True))
    assert len(plain_losses) == len(accelerated_losses) == 12
    assert plain_losses == pytest.approx(accelerated_losses, abs=1e-6)
    for plain_param, accelerated_param in zip(plain_model.parameters(), accelerated_model.parameters()):
        torch.testing.assert_close(plain_param, accelerated_param, rtol=0, atol=1e-6)


def test_training_lowers_the_loss_and_steps_the_scheduler():
    _, losses, lr_scheduler = train_from_seed(loops.train_plain, num_epochs=4)
    assert sum(losses[-6:]) / 6 < sum(losses[:6]) / 6
    assert lr_scheduler.last_epoch == len(losses)


def test_warmup_is_ten_percent_of_training_steps():
    model = tiny_classifier()
    optimizer, lr_scheduler = loops.make_optimizer_and_scheduler(model, num_training_steps=100, lr=1.0)
    learning_rates = []
    for _ in range(100):
        learning_rates.append(lr_scheduler.get_last_lr()[0])
        optimizer.step()
        lr_scheduler.step()
    assert learning_rates[0] == 0.0
    assert learning_rates[10] == pytest.approx(1.0)
    assert max(learning_rates) == pytest.approx(1.0)
    assert learning_rates[9] < 1.0


def test_accuracy_and_f1_match_hand_counts():
    scores = loops.accuracy_and_f1(torch.tensor([1, 1, 0, 0, 1]), torch.tensor([1, 0, 0, 1, 1]))
    # TP=2, FP=1, FN=1 -> F1 = 4 / 6; 3 of 5 right.
    assert scores == pytest.approx({"accuracy": 0.6, "f1": 4 / 6})


def test_evaluate_returns_fractions():
    set_seed(0)
    scores = loops.evaluate(tiny_classifier(), random_pair_batches())
    assert set(scores) == {"accuracy", "f1"}
    assert all(0.0 <= value <= 1.0 for value in scores.values())


@pytest.mark.parametrize(
    "argument, value, message",
    [
        ("model", "not a model", "model must be a torch.nn.Module"),
        ("num_epochs", 0, "num_epochs must be a positive int"),
        ("train_dataloader", [1, 2], "train_dataloader must be a torch.utils.data.DataLoader"),
    ],
)
def test_bad_arguments_name_the_argument(argument, value, message):
    model = tiny_classifier()
    dataloader = random_pair_batches()
    optimizer, lr_scheduler = loops.make_optimizer_and_scheduler(model, 10)
    arguments = dict(model=model, optimizer=optimizer, lr_scheduler=lr_scheduler, train_dataloader=dataloader, num_epochs=1)
    arguments[argument] = value
    for loop in (loops.train_plain, loops.train_accelerate):
        with pytest.raises((TypeError, ValueError), match=message):
            loop(**arguments)


@pytest.mark.parametrize("bad_steps", [0, -3, 2.5])
def test_scheduler_needs_a_positive_step_count(bad_steps):
    with pytest.raises(ValueError, match="num_training_steps"):
        loops.make_optimizer_and_scheduler(tiny_classifier(), bad_steps)
