"""The plain loop and the Accelerate loop (lesson 1) are twins, train identically, and are the loops the lesson runs."""

import ast
import html
import re
import textwrap
from pathlib import Path

import jupytext
import pytest
import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import DataLoader
from transformers import DataCollatorWithPadding, DistilBertConfig, DistilBertForSequenceClassification, Trainer

from course_utils import data, loop_diff, loops, models, schedules

LESSON_1 = Path(__file__).resolve().parents[2] / "lessons" / "01_from_loop_to_accelerator.py"

# The lesson's summary table, as code: what Accelerate removes from the plain loop and what it adds.
REMOVED_FROM_THE_PLAIN_LOOP = [
    "def train_plain(model, optimizer, lr_scheduler, train_dataloader, num_epochs, device):",
    "batch = {k: v.to(device) for k, v in batch.items()}",
    "loss.backward()",
]
ADDED_BY_ACCELERATE = [
    "def train_accelerate(model, optimizer, lr_scheduler, train_dataloader, num_epochs, accelerator):",
    "model, optimizer, train_dataloader, lr_scheduler = accelerator.prepare(",
    "model, optimizer, train_dataloader, lr_scheduler",
    ")",
    "accelerator.backward(loss)",
]


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


def train_from_seed(loop, device_or_accelerator, seed=0, num_epochs=2):
    set_seed(seed)
    model = tiny_classifier()
    dataloader = random_pair_batches(seed=seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    lr_scheduler = schedules.linear_schedule_with_warmup(optimizer, num_epochs * len(dataloader))
    losses = loop(model, optimizer, lr_scheduler, dataloader, num_epochs, device_or_accelerator)
    return model, losses, lr_scheduler


# --------------------------------------------------------------------------- the twins


def test_accelerate_removes_and_adds_exactly_the_lines_of_the_summary_table():
    removed, added = loop_diff.loop_changes(loops.train_plain, loops.train_accelerate)
    assert removed == REMOVED_FROM_THE_PLAIN_LOOP
    assert added == ADDED_BY_ACCELERATE


def test_loop_changes_sees_a_line_that_drifts():
    def drifted(model, optimizer, lr_scheduler, train_dataloader, num_epochs, device):
        model.train()
        losses = []
        for epoch in range(num_epochs):
            for step, batch in enumerate(train_dataloader):
                batch = {k: v.to(device) for k, v in batch.items()}
                outputs = model(**batch)
                loss = outputs.loss
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()
                losses.append(loss.item())
        return losses

    removed, added = loop_diff.loop_changes(loops.train_plain, drifted)
    assert added[1:] == ["torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)"]


def test_the_twins_show_no_validation_and_no_markers():
    for loop in (loops.train_plain, loops.train_accelerate):
        code = "\n".join(loop_diff.code_lines(loop))
        assert "raise" not in code and "isinstance" not in code and "[accelerate]" not in code


def test_loop_diff_shows_both_loops_and_the_changed_lines():
    table = loop_diff.loop_diff_html()
    text = html.unescape(re.sub(r"<[^>]+>", "", table)).replace("\xa0", " ")
    assert "train_plain" in text and "train_accelerate" in text
    for line in REMOVED_FROM_THE_PLAIN_LOOP[1:] + ADDED_BY_ACCELERATE[1:]:
        assert line in text
    assert table.count('class="diff_sub"') + table.count('class="diff_chg"') + table.count('class="diff_add"') > 0
    assert "Train ``model``" not in text  # the docstrings differ, so they stay out of the diff


def _long_lines_before(model, optimizer):
    model, optimizer, train_dataloader, lr_scheduler, another_identifier = prepare_everything(model, optimizer, 1)
    return model


def _long_lines_after(model, optimizer):
    model, optimizer, train_dataloader, lr_scheduler, another_identifier = prepare_everything_again(model, optimizer, 22)
    return model


def _numbered_cells(table):
    """Return (line number or ">" for a continuation, text) for every cell of a difflib side-by-side table."""
    pairs = re.findall(r'<td class="diff_header"[^>]*>(.*?)</td><td nowrap="nowrap">(.*?)</td>', table)
    return [(number, html.unescape(re.sub(r"<[^>]+>", "", text)).replace("\xa0", " ")) for number, text in pairs]


def _diff_pairs():
    from course_utils import feature_loops  # the pairs lesson 5 shows

    return [(_long_lines_before, _long_lines_after), (loops.train_plain, loops.train_accelerate),
            (loops.train_accelerate, feature_loops.train_accumulating), (feature_loops.train_accumulating, feature_loops.train_clipping),
            (feature_loops.train_accumulating, feature_loops.train_resumable)]


@pytest.mark.parametrize("pair", _diff_pairs())
def test_the_diff_table_wraps_long_lines_between_words_never_inside_an_identifier(pair):
    # difflib cut at column 76 exactly, e.g. "lr_sche" | "duler": a cut must fall after a space.
    cells = _numbered_cells(loop_diff.loop_diff_html(*pair))
    word = re.compile(r"\w")
    cuts = [(text, following) for (_, text), (number, following) in zip(cells, cells[1:]) if number == ">"]
    if pair[0] is _long_lines_before:
        assert cuts  # these lines are longer than the column
    for text, following in cuts:
        assert not (word.match(text[-1:]) and word.match(following[:1])), (text, following)
    assert all(len(text) <= 76 for _, text in cells)


def test_both_loops_give_the_same_losses_and_parameters_from_the_same_seed():
    plain_model, plain_losses, _ = train_from_seed(loops.train_plain, "cpu")
    accelerated_model, accelerated_losses, _ = train_from_seed(loops.train_accelerate, Accelerator(cpu=True))
    assert len(plain_losses) == len(accelerated_losses) == 12
    assert plain_losses == pytest.approx(accelerated_losses, abs=1e-6)
    for plain_param, accelerated_param in zip(plain_model.parameters(), accelerated_model.parameters()):
        torch.testing.assert_close(plain_param, accelerated_param, rtol=0, atol=1e-6)


def test_training_lowers_the_loss_and_steps_the_scheduler():
    _, losses, lr_scheduler = train_from_seed(loops.train_plain, "cpu", num_epochs=4)
    assert sum(losses[-6:]) / 6 < sum(losses[:6]) / 6
    assert lr_scheduler.last_epoch == len(losses)


# --------------------------------------------------------------------------- the lesson runs the twins


def lesson_code_cells():
    notebook = jupytext.read(LESSON_1)
    return [cell.source for cell in notebook.cells if cell.cell_type == "code"]


class _Rename(ast.NodeTransformer):
    """The lesson's global names for what the twins call by their parameters' names."""

    NAMES = {"NUM_EPOCHS": "num_epochs", "plain_losses": "losses", "accelerate_losses": "losses"}

    def visit_Name(self, node):
        return ast.copy_location(ast.Name(id=self.NAMES.get(node.id, node.id), ctx=node.ctx), node)


def training_statements(source, first_statement):
    """The statements of ``source`` from the one that starts with ``first_statement`` through the epoch loop."""
    body = _Rename().visit(ast.parse(source)).body
    dumps = [ast.dump(statement) for statement in body]
    start = next(i for i, statement in enumerate(body) if ast.unparse(statement).startswith(first_statement))
    end = next(i for i in range(start, len(body)) if isinstance(body[i], ast.For))
    return dumps[start:end + 1]


@pytest.mark.parametrize(
    "loop, marker, first_statement",
    [
        (loops.train_plain, "loss.backward()", "model.train()"),
        (loops.train_accelerate, "accelerator.backward(loss)", "model, optimizer, train_dataloader, lr_scheduler"),
    ],
)
def test_the_lesson_trains_with_the_loop_of_its_twin(loop, marker, first_statement):
    twin = training_statements(textwrap.dedent("\n".join(loop_diff.code_lines(loop)[1:])), first_statement)
    lesson_cells = [
        cell for cell in lesson_code_cells()
        if marker in cell and "for epoch in range(NUM_EPOCHS)" in cell and "def " not in cell
    ]
    assert len(lesson_cells) == 1, f"expected one lesson cell that trains with {marker}, found {len(lesson_cells)}"
    assert training_statements(lesson_cells[0], first_statement) == twin


def test_the_lessons_plain_loop_moves_the_model_before_it_builds_the_optimizer():
    # Issue 32: lesson 1 built the optimizer, then moved the model. torch.optim asks for the
    # model on its device first; Accelerate refuses the other order on TPUs ("created an
    # optimizer around your model **before** putting on the device", accelerator.py).
    (cell,) = [cell for cell in lesson_code_cells() if "loss.backward()" in cell and "for epoch in range(NUM_EPOCHS)" in cell
               and "def " not in cell]  # fmt: skip
    statements = [ast.unparse(statement) for statement in ast.parse(cell).body]
    moved = next(index for index, statement in enumerate(statements) if statement == "model.to(device)")
    built = next(index for index, statement in enumerate(statements) if statement.startswith("optimizer = "))
    assert moved < built, statements


def test_the_plain_twin_leaves_placing_the_model_to_its_caller():
    assert not [line for line in loop_diff.code_lines(loops.train_plain) if "model.to(" in line]


# --------------------------------------------------------------------------- schedule, Trainer, metrics


def test_warmup_is_ten_percent_of_training_steps_then_the_rate_falls_to_zero():
    optimizer = torch.optim.SGD(tiny_classifier().parameters(), lr=1.0)
    lr_scheduler = schedules.linear_schedule_with_warmup(optimizer, num_training_steps=100)
    learning_rates = []
    for _ in range(100):
        learning_rates.append(lr_scheduler.get_last_lr()[0])
        optimizer.step()
        lr_scheduler.step()
    assert learning_rates[0] == 0.0
    assert learning_rates[9] < 1.0
    assert learning_rates[10] == pytest.approx(1.0) == max(learning_rates)
    assert learning_rates[55] == pytest.approx(0.5)
    assert lr_scheduler.get_last_lr()[0] == 0.0


@pytest.mark.parametrize(
    "arguments, message",
    [
        ({"num_training_steps": 0}, "num_training_steps must be a positive int"),
        ({"num_training_steps": 2.5}, "num_training_steps must be a positive int"),
        ({"num_training_steps": 10, "warmup_fraction": 1.0}, r"warmup_fraction must be a number in \[0, 1\)"),
        ({"num_training_steps": 10, "warmup_fraction": -0.1}, "warmup_fraction must be"),
    ],
)
def test_the_schedule_names_a_bad_argument(arguments, message):
    optimizer = torch.optim.SGD(tiny_classifier().parameters(), lr=1.0)
    with pytest.raises(ValueError, match=message):
        schedules.linear_schedule_with_warmup(optimizer, **arguments)


def test_the_schedule_needs_an_optimizer():
    with pytest.raises(TypeError, match="optimizer must be a torch.optim.Optimizer"):
        schedules.linear_schedule_with_warmup(tiny_classifier(), 10)


def test_the_trainer_steps_our_optimizer_scores_as_evaluate_does_and_saves_nothing(tmp_path):
    tokenizer = data.load_tokenizer()
    tokenized = data.tokenize_dataset(data.load_paraphrase_dataset(), tokenizer)
    train_dataset, eval_dataset = tokenized["train"].select(range(64)), tokenized["validation"].select(range(64))
    set_seed(0)
    model = models.load_pretrained_classifier()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    lr_scheduler = schedules.linear_schedule_with_warmup(optimizer, 2)
    trainer = loops.train_with_trainer(model, optimizer, lr_scheduler, train_dataset, eval_dataset, tokenizer, 1, 0, tmp_path / "out")
    assert isinstance(trainer, Trainer)
    assert trainer.state.global_step == 2 and optimizer.state  # two batches of 32: two steps of our optimizer
    metrics = trainer.evaluate()
    expected = loops.evaluate(model, DataLoader(eval_dataset, batch_size=32, collate_fn=DataCollatorWithPadding(tokenizer)))
    assert metrics["eval_accuracy"] == pytest.approx(expected["accuracy"])
    assert metrics["eval_f1"] == pytest.approx(expected["f1"])
    assert list((tmp_path / "out").iterdir()) == []


def test_accuracy_and_f1_match_hand_counts():
    scores = loops.accuracy_and_f1(torch.tensor([1, 1, 0, 0, 1]), torch.tensor([1, 0, 0, 1, 1]))
    # TP=2, FP=1, FN=1 -> F1 = 4 / 6; 3 of 5 right.
    assert scores == pytest.approx({"accuracy": 0.6, "f1": 4 / 6})


class AlwaysSays(torch.nn.Module):
    """A classifier that answers ``label`` for every pair, whatever the input."""

    def __init__(self, label):
        super().__init__()
        self.label = label
        self.unused = torch.nn.Parameter(torch.zeros(()))

    def forward(self, input_ids, attention_mask):
        logits = torch.zeros(len(input_ids), 2)
        logits[:, self.label] = 1.0
        return type("Output", (), {"logits": logits})()


def test_evaluate_scores_the_predictions_on_the_whole_split():
    dataloader = data.make_dataloader("validation", batch_size=64)
    labels = torch.tensor(data.load_paraphrase_dataset()["validation"]["label"])
    positives = labels.float().mean().item()
    assert loops.evaluate(AlwaysSays(1), dataloader) == pytest.approx(
        {"accuracy": positives, "f1": 2 * positives / (1 + positives)}  # no false negatives; every negative a false positive
    )
    assert loops.evaluate(AlwaysSays(0), dataloader) == pytest.approx({"accuracy": 1 - positives, "f1": 0.0})


def test_evaluate_leaves_the_model_in_the_mode_it_found():
    model = tiny_classifier().train()
    loops.evaluate(model, random_pair_batches())
    assert model.training


def test_evaluate_names_a_bad_argument():
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        loops.evaluate("not a model", random_pair_batches())
    with pytest.raises(TypeError, match="dataloader must be a torch.utils.data.DataLoader"):
        loops.evaluate(tiny_classifier(), [1, 2])
