"""What lesson 10 writes for a learner to launch: Accelerate reads the config file as written, the torchrun command
carries the variables accelerate launch would set, the scaled-down model is the same family, and the script's
measured memory per process equals the plan of that scaled-down run."""

import pytest
from accelerate.commands.config.config_args import load_config_from_file
from accelerate.commands.launch import launch_command_parser
from accelerate.utils import prepare_multi_gpu_env

from course_utils import launch_files, memory, parallel, plan, sharding, your_run


@pytest.mark.parametrize("layout", launch_files.LAYOUTS)
def test_accelerate_reads_the_written_file_as_the_layout_it_was_written_for(layout, tmp_path):
    config = launch_files.accelerate_config(layout, 8, 2, block_class="LlamaDecoderLayer")
    loaded = load_config_from_file(str(launch_files.write_yaml(config, tmp_path / "config.yaml")))
    expected = {"ddp": "MULTI_GPU", "zero1": "DEEPSPEED"}.get(layout, "FSDP")
    assert loaded.distributed_type == expected
    assert (loaded.num_processes, loaded.num_machines) == (16, 2)
    flags = {action.dest for action in launch_command_parser()._actions}
    assert all(key in flags for key in loaded.fsdp_config)
    if expected == "FSDP":
        assert loaded.fsdp_config["fsdp_reshard_after_forward"] is (layout != "zero2")


@pytest.mark.parametrize("layout", ["ddp", "zero2", "zero3"])
def test_the_torchrun_command_sets_what_accelerate_launch_sets_from_the_file(layout, tmp_path, monkeypatch):
    config = launch_files.accelerate_config(layout, 4, block_class="LlamaDecoderLayer", checkpointing=True)
    command = launch_files.launch_commands(config, tmp_path / "config.yaml", ["--model", "Llama 3.1 8B"])["torchrun"]
    ours = dict(word.split("=", 1) for word in command.split() if "=" in word and word.isascii() and word[0].isupper())
    # accelerate launch's own conversion of the same settings (its flags, as the file gives them)
    flags = ["--num_processes", "4", "--mixed_precision", "bf16", "--dynamo_backend", "no", "--num_machines", "1",
             "--main_process_port", "29511"]
    if layout != "ddp":
        fsdp = config["fsdp_config"]
        flags += ["--use_fsdp", *[item for key, value in fsdp.items()
                                  for item in (f"--{key}", str(value).lower() if isinstance(value, bool) else str(value))]]
    else:
        flags += ["--multi_gpu"]
    arguments = launch_command_parser().parse_args([*flags, "-m", "course_utils.your_run"])
    monkeypatch.setattr("accelerate.utils.launch.is_port_in_use", lambda port: False)
    theirs = prepare_multi_gpu_env(arguments)
    assert ours == {name: theirs[name] for name in ours}
    assert "--nproc_per_node 4" in command


def test_zero1_has_no_torchrun_form_and_names_why(tmp_path):
    config = launch_files.accelerate_config("zero1", 8, block_class="LlamaDecoderLayer")
    assert "DeepSpeed" in launch_files.launch_commands(config, tmp_path / "c.yaml", [])["torchrun"]


@pytest.mark.parametrize("name", list(plan.SHIPPED_CONFIGS))
def test_the_scaled_down_model_is_the_same_family_with_two_narrow_blocks(name, tmp_path):
    full, small = plan.load_model(name), plan.load_model(str(launch_files.scaled_down_config(name, tmp_path)))
    assert type(small) is type(full)
    assert len(sharding.sharded_blocks(small)) == 2 and small.config.hidden_size == 64
    assert sum(p.numel() for p in small.parameters()) < 10**6


@pytest.mark.forks
@pytest.mark.parametrize("layout, checkpointing", [("ddp", False), ("zero2", False), ("zero3", False), ("zero3", True)])
def test_the_scripts_measured_memory_per_process_equals_the_plan_of_the_scaled_down_run(layout, checkpointing,
                                                                                         tmp_path):
    path = str(launch_files.scaled_down_config("Llama 3.1 8B", tmp_path))
    run = your_run.RunConfig(path, layout, batch_size=2, seq_len=32, steps=1, cpu=True, measure=True,
                             checkpointing=checkpointing)
    results = parallel.launch(your_run.training_function, (run,), num_processes=2, quiet=True, timeout=300)
    model = plan.load_model(path, "fp32", checkpointing)
    slack = sharding.largest_unit_bytes(model, world_size=2) if layout != "ddp" else 0
    for rank, result in enumerate(results):
        planned = memory.estimate_training_memory(model, "adamw", 2, 32, world_size=2, sharding=layout, rank=rank)
        assert sharding.agrees_with_plan(planned, result["memory"], slack), (planned, result["memory"])
        assert result["processes"] == 2 and len(result["losses"]) == 1
