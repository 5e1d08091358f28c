"""Specification of course_utils.memory, part 1: optimizer state, estimated exactly to the byte (lesson 2).

Every estimate is checked against a real optimizer after one real step with
real gradients: the difference must be 0 bytes.
"""

import inspect
import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForSequenceClassification, DistilBertConfig

from course_utils import memory, models, optimizers

# One of the longest modules: make test hands the `slow` ones out before the other unit tests (tests/conftest.py).
pytestmark = pytest.mark.slow

# --------------------------------------------------------------------------- small architectures


class ConvNetWithBatchNorm(torch.nn.Module):
    """4-D conv kernels below and above 4096 elements, batch-norm vectors, a Linear head."""

    def __init__(self):
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1),  # 216-element kernel
            torch.nn.BatchNorm2d(8),
            torch.nn.ReLU(),
            torch.nn.Conv2d(8, 64, 3, padding=1),  # 4608-element kernel
            torch.nn.BatchNorm2d(64),
            torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1),
        )
        self.head = torch.nn.Linear(64, 10)

    def forward(self, x):
        return self.head(self.features(x).flatten(1))

    def example_input(self, dtype):
        return (torch.randn(2, 3, 8, 8, dtype=dtype),)


class EmbeddingHeavy(torch.nn.Module):
    """Almost all parameters in one embedding table, plus a 3-D parameter and a 0-d temperature."""

    def __init__(self):
        super().__init__()
        self.embedding = torch.nn.Embedding(3000, 24)
        self.mixer = torch.nn.Parameter(torch.randn(3, 24, 24) * 0.1)
        self.temperature = torch.nn.Parameter(torch.tensor(1.0))
        self.head = torch.nn.Linear(24, 5)

    def forward(self, ids):
        x = self.embedding(ids).mean(dim=1)
        x = torch.einsum("bi,kij->bj", x, self.mixer)
        return self.head(x) / self.temperature

    def example_input(self, dtype):
        return (torch.randint(0, 3000, (4, 7)),)


class TiedLanguageModel(torch.nn.Module):
    """The output layer reuses the embedding matrix: one tensor, one state."""

    def __init__(self):
        super().__init__()
        self.embedding = torch.nn.Embedding(500, 32)
        self.norm = torch.nn.LayerNorm(32)
        self.output = torch.nn.Linear(32, 500, bias=False)
        self.output.weight = self.embedding.weight

    def forward(self, ids):
        return self.output(self.norm(self.embedding(ids)))

    def example_input(self, dtype):
        return (torch.randint(0, 500, (2, 6)),)


class PartlyFrozen(torch.nn.Module):
    """A frozen 'backbone' (no gradient, so no state) and a trainable head."""

    def __init__(self):
        super().__init__()
        self.backbone = torch.nn.Sequential(torch.nn.Linear(40, 128), torch.nn.GELU(), torch.nn.Linear(128, 64))
        self.backbone.requires_grad_(False)
        self.head = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.Tanh(), torch.nn.Linear(96, 3))

    def forward(self, x):
        return self.head(self.backbone(x))

    def example_input(self, dtype):
        return (torch.randn(4, 40, dtype=dtype),)


class TinyDistilBert(torch.nn.Module):
    """A two-layer DistilBERT classifier built from its config (no download)."""

    def __init__(self):
        super().__init__()
        config = DistilBertConfig(vocab_size=300, dim=32, hidden_dim=64, n_layers=2, n_heads=2, num_labels=3)
        self.model = AutoModelForSequenceClassification.from_config(config)

    def forward(self, ids):
        return self.model(input_ids=ids).logits

    def example_input(self, dtype):
        return (torch.randint(0, 300, (2, 9)),)


ARCHITECTURES = {
    "distilbert": TinyDistilBert,
    "conv_batchnorm": ConvNetWithBatchNorm,
    "embedding_heavy": EmbeddingHeavy,
    "tied_weights": TiedLanguageModel,
    "partly_frozen": PartlyFrozen,
}

# Every optimizer, with the options that change its state and a few that do not.
OPTIMIZER_SETTINGS = [
    ("sgd", {}),
    ("sgd", {"momentum": 0.9}),
    ("sgd", {"momentum": 0.9, "nesterov": True, "lr": 0.1, "weight_decay": 0.01}),
    ("adam", {}),
    ("adam", {"amsgrad": True}),
    ("adamw", {}),
    ("adamw", {"amsgrad": True}),
    ("adamw", {"foreach": True}),
    ("adamw", {"fused": True}),
    pytest.param(
        ("adamw", {"capturable": True}),
        marks=pytest.mark.skip(reason="torch.optim.AdamW refuses capturable=True for CPU parameters"),
    ),
    ("adafactor", {}),
    ("adafactor", {"beta1": 0.9}),
    ("adafactor", {"scale_parameter": False, "relative_step": False, "lr": 1e-3}),
    ("adafactor", {"beta1": 0.9, "relative_step": False, "warmup_init": False, "lr": 1e-2}),
    ("torch_adafactor", {}),
    ("torch_adafactor", {"foreach": True}),
    ("adam8bit", {}),
    ("adamw8bit", {}),
    ("adamw8bit", {"min_8bit_size": 100}),
    ("adam8bit", {"min_8bit_size": 1_000_000}),
]


def _settings_id(setting):
    name, options = setting.values[0] if hasattr(setting, "values") else setting
    return name + "".join(f"-{key}={value}" for key, value in options.items())


def _one_real_step(model, optimizer_name, options):
    """Build the real optimizer over all of ``model``'s parameters, take one step, return it."""
    optimizer = memory.make_optimizer(optimizer_name, model.parameters(), **options)
    dtype = next(model.parameters()).dtype
    output = model(*model.example_input(dtype))
    output.float().square().mean().backward()
    optimizer.step()
    return optimizer


# Built once per (architecture, dtype): the tests only read shapes and take steps.
@pytest.fixture(scope="module", params=[torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def dtype(request):
    return request.param


@pytest.mark.parametrize("setting", OPTIMIZER_SETTINGS, ids=[_settings_id(s) for s in OPTIMIZER_SETTINGS])
@pytest.mark.parametrize("architecture", list(ARCHITECTURES))
def test_estimate_equals_measured_state_after_one_step(architecture, setting, dtype):
    name, options = setting
    torch.manual_seed(0)
    model = ARCHITECTURES[architecture]().to(dtype)
    estimate = memory.estimate_optimizer_state(model, name, **options)
    optimizer = _one_real_step(model, name, options)
    assert memory.measure_optimizer_state(optimizer) - estimate == 0


# --------------------------------------------------------------------------- what the state is made of


def _linear_model(in_features=64, out_features=128, dtype=torch.float32):
    return torch.nn.Linear(in_features, out_features).to(dtype)


def test_adamw_state_is_eight_bytes_per_fp32_parameter_plus_a_four_byte_step_per_tensor():
    model = _linear_model()
    parameters = 64 * 128 + 128
    assert memory.estimate_optimizer_state(model, "adamw") == 8 * parameters + 4 * 2


def test_adamw_moments_follow_the_parameter_dtype_but_step_stays_fp32():
    model = _linear_model(dtype=torch.bfloat16)
    optimizer = _step(model, "adamw")
    table = memory.describe_optimizer_state(optimizer)
    assert table["exp_avg"]["dtype"] == "bfloat16" and table["exp_avg_sq"]["dtype"] == "bfloat16"
    assert table["step"] == {"dtype": "float32", "tensors": 2, "elements": 2, "bytes": 8}


def test_sgd_without_momentum_keeps_no_state():
    model = _linear_model()
    assert memory.estimate_optimizer_state(model, "sgd") == 0
    assert memory.measure_optimizer_state(_step(model, "sgd")) == 0


def test_transformers_adafactor_keeps_fp32_row_and_column_statistics_and_an_rms_tensor():
    model = _linear_model(dtype=torch.bfloat16)
    table = memory.describe_optimizer_state(_step(model, "adafactor"))
    assert table["exp_avg_sq_row"] == {"dtype": "float32", "tensors": 1, "elements": 128, "bytes": 512}
    assert table["exp_avg_sq_col"] == {"dtype": "float32", "tensors": 1, "elements": 64, "bytes": 256}
    assert table["exp_avg_sq"] == {"dtype": "float32", "tensors": 1, "elements": 128, "bytes": 512}  # the bias
    # `RMS` is a 0-d tensor per parameter; `step` is a Python int, so it is not in the table.
    assert table["RMS"] == {"dtype": "float32", "tensors": 2, "elements": 2, "bytes": 8}
    assert "step" not in table


def test_torch_adafactor_keeps_its_statistics_in_the_gradient_dtype():
    model = _linear_model(dtype=torch.bfloat16)
    table = memory.describe_optimizer_state(_step(model, "torch_adafactor"))
    assert table["row_var"]["dtype"] == "bfloat16" and table["row_var"]["elements"] == 128
    assert table["col_var"]["dtype"] == "bfloat16" and table["col_var"]["elements"] == 64
    assert table["variance"]["dtype"] == "bfloat16" and table["variance"]["elements"] == 128
    assert table["step"]["dtype"] == "float32"


def test_eight_bit_adamw_stores_one_byte_per_element_a_scale_per_256_and_two_shared_tables():
    model = _linear_model()  # weight: 8192 elements (8-bit); bias: 128 elements (fp32)
    table = memory.describe_optimizer_state(_step(model, "adamw8bit"))
    assert table["state1"] == {"dtype": "float32, uint8", "tensors": 2, "elements": 8192 + 128, "bytes": 8192 + 512}
    assert table["absmax1"] == {"dtype": "float32", "tensors": 1, "elements": 32, "bytes": 128}
    # One 256-entry fp32 table per state, shared by every 8-bit tensor: counted once.
    assert table["qmap1"] == {"dtype": "float32", "tensors": 1, "elements": 256, "bytes": 1024}
    assert memory.estimate_optimizer_state(model, "adamw8bit") == 2 * (8192 + 4 * 32) + 2 * 4 * 128 + 2 * 1024


def test_the_per_name_table_adds_up_to_the_measured_bytes():
    optimizer = _step(_linear_model(), "adamw8bit")
    table = memory.describe_optimizer_state(optimizer)
    assert sum(row["bytes"] for row in table.values()) == memory.measure_optimizer_state(optimizer)
    assert sum(row["elements"] for row in table.values()) == memory.count_optimizer_state_elements(optimizer)


def test_tied_parameters_get_one_state():
    model = TiedLanguageModel()
    untied_bytes = 8 * (500 * 32) + 4
    assert memory.estimate_optimizer_state(model, "adamw") == untied_bytes + 8 * (2 * 32) + 2 * 4


def test_frozen_parameters_get_no_state_and_no_trainable_parameters_means_zero_bytes():
    model = _linear_model()
    model.requires_grad_(False)
    for name in memory.ESTIMATED_OPTIMIZERS:
        assert memory.estimate_optimizer_state(model, name) == 0


def test_estimate_works_on_the_meta_device_for_a_7b_model():
    model = models.well_known_architectures()["Llama-2-7B body (no LM head)"]
    parameters = list(model.parameters())
    assert all(p.device.type == "meta" for p in parameters)
    elements = sum(p.numel() for p in parameters)
    assert memory.estimate_optimizer_state(model, "adamw") == 8 * elements + 4 * len(parameters)


# --------------------------------------------------------------------------- distilbert-base-cased


def test_distilbert_base_cased_adamw_state_is_131_566_188_elements_and_502_mib():
    torch.manual_seed(0)
    on_meta = models.build_distilbert_base_cased(on_meta_device=True)
    model = models.build_distilbert_base_cased(on_meta_device=False)
    optimizer = memory.make_optimizer("adamw", model.parameters())
    ids = torch.randint(0, models.DISTILBERT_BASE_CASED_VOCAB_SIZE, (2, 16))
    model(input_ids=ids, labels=torch.tensor([0, 1])).loss.backward()
    optimizer.step()

    assert models.count_parameters(model) == 65_783_042
    assert len(list(model.parameters())) == 104
    # exp_avg and exp_avg_sq per parameter, plus one 0-d `step` per parameter tensor.
    assert memory.count_optimizer_state_elements(optimizer) == 2 * 65_783_042 + 104 == 131_566_188
    assert memory.measure_optimizer_state(optimizer) == 4 * 131_566_188 == 526_264_752
    assert round(526_264_752 / 2**20, 3) == 501.885
    assert memory.estimate_optimizer_state(on_meta, "adamw") == 526_264_752


# --------------------------------------------------------------------------- errors


def test_unknown_optimizer_name_lists_the_supported_ones():
    with pytest.raises(ValueError, match="optimizer must be one of sgd, adam, adamw, adafactor"):
        memory.estimate_optimizer_state(_linear_model(), "lion")
    with pytest.raises(ValueError, match="adamw8bit"):
        memory.make_optimizer("lion", _linear_model().parameters())


def test_a_model_that_is_not_a_module_is_refused_by_name():
    with pytest.raises(TypeError, match="model must be a torch.nn.Module, got list"):
        memory.estimate_optimizer_state([torch.zeros(3)], "adamw")


def test_unknown_option_is_named():
    with pytest.raises(TypeError, match="unknown option 'momentum' for optimizer 'adamw'"):
        memory.estimate_optimizer_state(_linear_model(), "adamw", momentum=0.9)
    with pytest.raises(TypeError, match="unknown option 'optim_bits'"):
        memory.make_optimizer("adam8bit", _linear_model().parameters(), optim_bits=8)


@pytest.mark.parametrize(
    "name, options, message",
    [
        ("sgd", {"momentum": -0.5}, "option 'momentum' must be a number >= 0"),
        ("adam", {"amsgrad": "yes"}, "option 'amsgrad' must be True or False"),
        ("adafactor", {"beta1": 1.5}, r"option 'beta1' must be None or a number in \[0, 1\)"),
        ("adamw8bit", {"min_8bit_size": 10.5}, "option 'min_8bit_size' must be an int >= 0"),
    ],
)
def test_bad_option_values_are_refused(name, options, message):
    with pytest.raises(ValueError, match=message):
        memory.estimate_optimizer_state(_linear_model(), name, **options)


def test_measuring_something_that_is_not_an_optimizer_is_refused_by_name():
    with pytest.raises(TypeError, match="optimizer must be a torch.optim.Optimizer, got dict"):
        memory.measure_optimizer_state({})


def test_accepted_options_are_real_constructor_options():
    """The option table must not drift from the constructors it describes."""
    from transformers.optimization import Adafactor

    bnb_optim = optimizers._import_bitsandbytes_optim()

    constructors = {
        "sgd": torch.optim.SGD,
        "adam": torch.optim.Adam,
        "adamw": torch.optim.AdamW,
        "adafactor": Adafactor,
        "torch_adafactor": torch.optim.Adafactor,
        "adam8bit": bnb_optim.Adam8bit,
        "adamw8bit": bnb_optim.AdamW8bit,
    }
    for name, constructor in constructors.items():
        signature = set(inspect.signature(constructor).parameters) - {"params"}
        accepted = set(optimizers.STATE_OPTIONS[name]) | optimizers.OTHER_OPTIONS[name]
        assert accepted <= signature, (name, accepted - signature)


def _step(model, name, **options):
    optimizer = memory.make_optimizer(name, model.parameters(), **options)
    model(torch.randn(3, model.in_features, dtype=model.weight.dtype)).float().sum().backward()
    optimizer.step()
    return optimizer


def test_bitsandbytes_is_imported_only_to_build_its_optimizer_and_silently():
    """accelerate.notebook_launcher refuses to start once bitsandbytes is imported, so estimating must not."""
    code = (
        "import sys, torch; from course_utils import memory; "
        "memory.estimate_optimizer_state(torch.nn.Linear(5000, 2), 'adamw8bit'); "
        "print('bitsandbytes' in sys.modules); "
        "memory.make_optimizer('adamw8bit', torch.nn.Linear(5000, 2).parameters()); "
        "print('bitsandbytes' in sys.modules)"
    )
    # A fresh interpreter: this test process may have imported bitsandbytes already.
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["False", "True"]
    assert result.stderr == ""


def test_every_other_torch_optimizer_is_built_by_name_and_its_state_left_to_the_planner():
    model = _linear_model()
    optimizer = memory.make_optimizer("rmsprop", model.parameters(), momentum=0.9, centered=True)
    assert isinstance(optimizer, torch.optim.RMSprop) and optimizer.defaults["centered"]
    with pytest.raises(TypeError, match="unknown option 'betas' for optimizer 'rmsprop'"):
        memory.make_optimizer("rmsprop", model.parameters(), betas=(0.9, 0.99))
    with pytest.raises(ValueError, match="the state of 'nadam' is followed.*estimate_training_memory"):
        memory.estimate_optimizer_state(model, "nadam")
