"""What a learner launches for a planned layout: the Accelerate config file, the launch commands, a scaled-down model (lesson 10).

- :func:`accelerate_config`: the config ``accelerate launch --config_file`` reads
  (Accelerate 1.15's ``ClusterConfig`` fields; FSDP2's options under ``fsdp_config``
  with the names of ``accelerate launch``'s ``--fsdp_*`` flags; ZeRO-1 through
  DeepSpeed's stage 1, which FSDP has no equivalent of);
- :func:`launch_commands`: the ``accelerate launch`` command on each node and the
  equivalent ``torchrun`` one, with the environment variables ``accelerate launch``
  would set from the file (``accelerate/utils/launch.py``, ``prepare_multi_gpu_env``);
- :func:`scaled_down_config`: the model's config with fewer, narrower blocks and
  a small vocabulary: the same family and code, a size two CPU processes train in seconds.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from course_utils import plan, sharding
from course_utils.validation import check_bool, check_choice, check_positive_int

__all__ = ["LAYOUTS", "SCRIPT", "accelerate_config", "write_yaml", "launch_commands", "block_class_of", "scaled_down_config"]

LAYOUTS = ("ddp", "zero1", "zero2", "zero3", "fsdp")
"""The layouts the files are written for (those :func:`course_utils.plan.plan_layouts` plans on several processes)."""

SCRIPT = "course_utils.your_run"
"""The training script the commands run (``python -m``): :mod:`course_utils.your_run`."""


def accelerate_config(layout: str, cards_per_node: int, nodes: int = 1, *, block_class: str, mixed_precision: str = "bf16",
                      checkpointing: bool = False, main_process_ip: str = "MAIN_NODE_ADDRESS",
                      main_process_port: int = 29500) -> dict:
    """Return the Accelerate config (a dict, as the YAML file holds it) that runs ``layout`` on ``nodes`` x ``cards_per_node`` GPUs.

    ``block_class``: the name of the model's repeated block (FSDP2 shards each,
    ``fsdp_transformer_layer_cls_to_wrap``); ``mixed_precision``: "no" or "bf16";
    ``checkpointing``: activation checkpointing on every block (FSDP's own option;
    under DDP the script's ``--checkpointing`` turns it on). ``machine_rank`` is 0: the file of node *i* says *i*.
    """
    check_choice(layout, "layout", LAYOUTS)
    check_positive_int(cards_per_node, "cards_per_node")
    check_positive_int(nodes, "nodes")
    if not isinstance(block_class, str) or not block_class.isidentifier():
        raise ValueError(f"block_class must be the block's class name (e.g. 'LlamaDecoderLayer'), got {block_class!r}")
    check_choice(mixed_precision, "mixed_precision", ("no", "bf16"))
    check_bool(checkpointing, "checkpointing")
    check_positive_int(main_process_port, "main_process_port")
    config = {"compute_environment": "LOCAL_MACHINE", "debug": False, "downcast_bf16": "no",
              "machine_rank": 0, "main_training_function": "main", "mixed_precision": mixed_precision,
              "num_machines": nodes, "num_processes": nodes * cards_per_node, "rdzv_backend": "static",
              "same_network": True, "use_cpu": False}
    if nodes > 1:
        config.update(main_process_ip=main_process_ip, main_process_port=main_process_port)
    if layout == "ddp":
        config["distributed_type"] = "MULTI_GPU"
    elif layout == "zero1":
        config["distributed_type"] = "DEEPSPEED"
        config["deepspeed_config"] = {"zero_stage": 1, "gradient_accumulation_steps": 1, "zero3_init_flag": False,
                                      "offload_optimizer_device": "none", "offload_param_device": "none"}
    else:
        config["distributed_type"] = "FSDP"
        config["fsdp_config"] = {
            "fsdp_version": 2,
            # ZeRO-2 keeps each block's gathered weights from its forward to its backward pass; ZeRO-3 frees them.
            "fsdp_reshard_after_forward": layout != "zero2",
            "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "fsdp_transformer_layer_cls_to_wrap": block_class,
            "fsdp_offload_params": False,
            "fsdp_state_dict_type": "SHARDED_STATE_DICT",
            "fsdp_cpu_ram_efficient_loading": True,
            "fsdp_sync_module_states": True,
            "fsdp_activation_checkpointing": checkpointing,
        }
    return config


def write_yaml(config: dict, path: str | Path) -> Path:
    """Write ``config`` (from :func:`accelerate_config`) to ``path`` as YAML, the format ``accelerate config`` writes; return the path."""
    import yaml

    if not isinstance(config, dict) or "distributed_type" not in config:
        raise TypeError(f"config must be accelerate_config()'s dict, got {config!r:.80}")
    path = Path(path)
    path.write_text(yaml.safe_dump(config, sort_keys=True), encoding="utf-8")
    return path


def _environment(config: dict) -> dict[str, str]:
    """The variables ``accelerate launch`` sets from ``config`` for the script's Accelerator (prepare_multi_gpu_env)."""
    environment = {"ACCELERATE_MIXED_PRECISION": config["mixed_precision"]}
    if config["distributed_type"] == "FSDP":
        fsdp = config["fsdp_config"]
        environment.update(
            ACCELERATE_USE_FSDP="true", FSDP_VERSION=str(fsdp["fsdp_version"]),
            FSDP_RESHARD_AFTER_FORWARD=str(fsdp["fsdp_reshard_after_forward"]).lower(),
            FSDP_OFFLOAD_PARAMS=str(fsdp["fsdp_offload_params"]).lower(),
            FSDP_AUTO_WRAP_POLICY=fsdp["fsdp_auto_wrap_policy"],
            FSDP_TRANSFORMER_CLS_TO_WRAP=fsdp["fsdp_transformer_layer_cls_to_wrap"],
            FSDP_STATE_DICT_TYPE=fsdp["fsdp_state_dict_type"],
            FSDP_CPU_RAM_EFFICIENT_LOADING=str(fsdp["fsdp_cpu_ram_efficient_loading"]).lower(),
            FSDP_SYNC_MODULE_STATES=str(fsdp["fsdp_sync_module_states"]).lower(),
            FSDP_ACTIVATION_CHECKPOINTING=str(fsdp["fsdp_activation_checkpointing"]).lower())
    elif config["distributed_type"] == "DEEPSPEED":
        environment.update(ACCELERATE_USE_DEEPSPEED="true",
                           ACCELERATE_DEEPSPEED_ZERO_STAGE=str(config["deepspeed_config"]["zero_stage"]))
    return environment


def launch_commands(config: dict, config_path: str | Path, script_arguments: list[str]) -> dict[str, str]:
    """Return ``{"accelerate": ..., "torchrun": ...}``: the command to run on node 0 of ``config``'s cluster, both ways.

    ``config``: :func:`accelerate_config`'s dict, written at ``config_path``;
    ``script_arguments``: the training script's own arguments. On node *i* the
    commands differ only in ``--machine_rank i`` / ``--node_rank i``. The
    ``torchrun`` command carries the variables ``accelerate launch`` would set
    (ZeRO-1's DeepSpeed needs Accelerate's launcher: no torchrun form).
    """
    if not isinstance(config, dict) or "distributed_type" not in config:
        raise TypeError(f"config must be accelerate_config()'s dict, got {config!r:.80}")
    if not isinstance(script_arguments, list) or not all(isinstance(a, str) for a in script_arguments):
        raise TypeError(f"script_arguments must be a list of strings, got {script_arguments!r:.80}")
    script = ["-m", SCRIPT, *script_arguments]
    nodes, processes = config["num_machines"], config["num_processes"]
    accelerate = ["accelerate", "launch", "--config_file", str(config_path)]
    if nodes > 1:
        accelerate += ["--machine_rank", "0"]
    commands = {"accelerate": shlex.join(accelerate + script)}
    if config["distributed_type"] == "DEEPSPEED":
        commands["torchrun"] = "(none: DeepSpeed's ZeRO-1 through Accelerate needs accelerate launch)"
        return commands
    torchrun = ["torchrun", "--nnodes", str(nodes), "--nproc_per_node", str(processes // nodes)]
    if nodes > 1:
        torchrun += ["--node_rank", "0", "--master_addr", config["main_process_ip"],
                     "--master_port", str(config["main_process_port"])]
    variables = [f"{name}={shlex.quote(value)}" for name, value in _environment(config).items()]
    commands["torchrun"] = " ".join([*variables, shlex.join(torchrun + script)])
    return commands


def block_class_of(model: str) -> str:
    """Return the class name of ``model``'s repeated block (a name or config.json that :func:`plan.load_model` takes)."""
    return type(sharding.sharded_blocks(plan.load_model(model))[0]).__name__


def scaled_down_config(model: str, folder: str | Path, *, layers: int = 2, width: int = 64, vocab_size: int = 512) -> Path:
    """Write ``model``'s config.json with ``layers`` blocks ``width`` wide and a ``vocab_size`` vocabulary into ``folder``; return its path.

    ``model``: a name of :data:`course_utils.plan.SHIPPED_CONFIGS` or a
    config.json. The MLP keeps its ratio to the width, attention its ratio of
    query to key/value heads (4 query heads of ``width / 4``), a mixture of experts at most 4 experts, 2 per token.
    """
    check_positive_int(layers, "layers")
    check_positive_int(width, "width")
    check_positive_int(vocab_size, "vocab_size")
    if width % 4:
        raise ValueError(f"width must be a multiple of 4 (4 attention heads), got {width}")
    source = plan.SHIPPED_CONFIGS.get(model, Path(model))
    if source.is_dir():
        source = source / "config.json"
    if not source.is_file():
        raise ValueError(f"model must be a shipped config ({', '.join(plan.SHIPPED_CONFIGS)}) or a config.json, got {model!r}")
    config = json.loads(source.read_text(encoding="utf-8"))
    heads, kv_heads = config["num_attention_heads"], config.get("num_key_value_heads", config["num_attention_heads"])
    ratio, hidden = config["intermediate_size"] / config["hidden_size"], config["hidden_size"]
    config.update(num_hidden_layers=layers, hidden_size=width, intermediate_size=int(ratio * width),
                  num_attention_heads=4, num_key_value_heads=max(1, 4 * kv_heads // heads), head_dim=width // 4,
                  vocab_size=vocab_size)
    for key, value in (("bos_token_id", 1), ("eos_token_id", 2), ("pad_token_id", 0)):
        if key in config:
            config[key] = value
    if "moe_intermediate_size" in config:
        config["moe_intermediate_size"] = max(1, int(config["moe_intermediate_size"] / hidden * width))
    for experts in ("num_local_experts", "num_experts"):
        if experts in config:
            config[experts] = min(config[experts], 4)
    if "num_experts_per_tok" in config:
        config["num_experts_per_tok"] = min(config["num_experts_per_tok"], 2)
    if "max_window_layers" in config:
        config["max_window_layers"] = layers
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "config.json"
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return path
