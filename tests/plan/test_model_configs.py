"""The shipped Hub configs (data/model_configs) build with transformers on the meta device, at their published sizes."""

import json

import pytest

from course_utils import plan

# The published parameter counts, as data/model_configs/README.md sources them (total parameters).
PUBLISHED = {
    "Llama 3.1 8B": 8.03e9,
    "Llama 3.1 70B": 70.6e9,
    "Qwen3 8B": 8.2e9,
    "Mistral 7B v0.3": 7.25e9,
    "Gemma 3 12B (text)": 11.771e9,  # 1,012M embedding + 10,759M non-embedding, the vision encoder left out
    "Mixtral 8x7B": 46.7e9,
    "Qwen3 30B-A3B": 30.5e9,
}


def test_every_shipped_config_has_a_published_size_and_a_readme_row():
    readme = (plan.MODEL_CONFIGS / "README.md").read_text()
    assert set(PUBLISHED) == set(plan.SHIPPED_CONFIGS)
    for name, path in plan.SHIPPED_CONFIGS.items():
        assert path.is_file(), path
        assert f"| {name} | `{path.parent.name}/` |" in readme, name


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_each_config_builds_on_meta_by_name_with_its_published_parameter_count(name):
    model = plan.load_model(name)
    parameters = sum(p.numel() for p in model.parameters())
    assert all(p.device.type == "meta" for p in model.parameters())
    assert type(model).__name__ == json.loads(plan.SHIPPED_CONFIGS[name].read_text())["architectures"][0]
    assert abs(parameters / PUBLISHED[name] - 1) < 0.03, f"{name}: {parameters:,}"


def test_a_shipped_config_loads_by_its_path_as_by_its_name():
    by_path = plan.load_model(str(plan.SHIPPED_CONFIGS["Mistral 7B v0.3"].parent))
    by_name = plan.load_model("Mistral 7B v0.3")
    assert [p.shape for p in by_path.parameters()] == [p.shape for p in by_name.parameters()]

