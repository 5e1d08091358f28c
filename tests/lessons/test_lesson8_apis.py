"""Every API lesson 8's prose names exists in the pinned libraries, with the arguments the prose gives it.

The prose once named `TrainingArguments(group_by_length=True)`, which raises TypeError in
transformers 5.24 (the argument is now `train_sampling_strategy="group_by_length"`). The test
reads every `code span` of the lesson's Markdown: each is either an API, checked here against the
installed version (resolved, and its arguments bound to its signature, or constructed where that is
cheap), or listed as not an API (a variable, a value, a path). A new span in neither list fails,
so a new sentence cannot name an API unchecked.
"""

import importlib
import inspect
import re

import jupytext
import pytest
import torch

from course_utils import REPO_DIR

LESSON = REPO_DIR / "lessons" / "08_speed.py"


def resolve(dotted):
    """Return the object a dotted name names, importing its modules as needed."""
    parts = dotted.split(".")
    for index in range(len(parts), 0, -1):
        try:
            target = importlib.import_module(".".join(parts[:index]))
        except ImportError:
            continue
        for part in parts[index:]:
            target = getattr(target, part)
        return target
    raise ImportError(dotted)


def binds(dotted, *args, **kwargs):
    """Check that ``dotted`` exists and accepts ``args`` and ``kwargs`` by its signature."""
    def check():
        inspect.signature(resolve(dotted)).bind_partial(*args, **kwargs)
    return check


def exists(*dotted):
    def check():
        for name in dotted:
            resolve(name)
    return check


def training_arguments_strategy(strategy):
    def check():
        from transformers import TrainingArguments

        assert TrainingArguments(output_dir="unused", train_sampling_strategy=strategy).train_sampling_strategy == strategy
    return check


def attention_implementation(name):
    def check():
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        assert name in ALL_ATTENTION_FUNCTIONS or name == "eager", sorted(ALL_ATTENTION_FUNCTIONS)
    return check


def logging_artifact(name):
    def check():
        from torch._logging._internal import log_registry

        assert name in log_registry.artifact_names
    return check


ADAMW = ("torch.optim.AdamW", [torch.nn.Parameter(torch.zeros(1))])
APIS = {
    ".item()": exists("torch.Tensor.item"),
    "CheckpointPolicy.MUST_SAVE": exists("torch.utils.checkpoint.CheckpointPolicy.MUST_SAVE"),
    "DataCollatorWithFlattening": exists("transformers.DataCollatorWithFlattening"),
    "DataCollatorWithPadding": exists("transformers.DataCollatorWithPadding"),
    "FlopCounterMode": exists("torch.utils.flop_counter.FlopCounterMode"),
    "LengthGroupedSampler": exists("transformers.trainer_pt_utils.LengthGroupedSampler"),
    'TORCH_LOGS="graph_breaks"': logging_artifact("graph_breaks"),
    'TrainingArguments(train_sampling_strategy="group_by_length")': training_arguments_strategy("group_by_length"),
    'train_sampling_strategy="batch_rebalance"': training_arguments_strategy("batch_rebalance"),
    "aten::addmm": exists("torch.ops.aten.addmm"),
    "aten::mm": exists("torch.ops.aten.mm"),
    "attn_implementation=": binds("transformers.PreTrainedModel.from_pretrained", "unused", attn_implementation="sdpa"),
    'attn_implementation="flash_attention_2"': attention_implementation("flash_attention_2"),
    'attn_implementation="sdpa"': attention_implementation("sdpa"),
    'backend="eager"': binds("torch.compile", None, backend="eager"),
    "dataset.map": exists("datasets.Dataset.map"),
    "dynamic=False": binds("torch.compile", None, dynamic=False),
    "foreach": binds(*ADAMW, foreach=True),
    "foreach=False": binds(*ADAMW, foreach=False),
    "foreach=True": binds(*ADAMW, foreach=True),
    "fused": binds(*ADAMW, fused=True),
    "fused=True": binds(*ADAMW, fused=True),
    "is_causal=True": lambda: torch.nn.functional.scaled_dot_product_attention(  # a builtin: no signature to bind, so run it
        *[torch.zeros(1, 1, 2, 4)] * 3, is_causal=True),
    'load_dataset("glue", "mrpc")': binds("datasets.load_dataset", "glue", "mrpc"),
    'models.load_pretrained_classifier("distilbert-base-cased")':
        binds("course_utils.models.load_pretrained_classifier", "distilbert-base-cased"),
    "num_workers": binds("torch.utils.data.DataLoader", [], num_workers=1),
    "num_workers=1": binds("torch.utils.data.DataLoader", [], num_workers=1),
    "persistent_workers=True": binds("torch.utils.data.DataLoader", [], persistent_workers=True),
    'prof.export_chrome_trace("step.json")': binds("torch.profiler.profile.export_chrome_trace", None, "step.json"),
    "scaled_dot_product_attention": exists("torch.nn.functional.scaled_dot_product_attention"),
    "sdpa_kernel": exists("torch.nn.attention.sdpa_kernel"),
    "speed.time_call": exists("course_utils.speed.time_call"),
    "speed.time_interleaved": exists("course_utils.speed.time_interleaved"),
    "torch._dynamo.explain": exists("torch._dynamo.explain"),
    "torch._foreach_*": exists("torch._foreach_add", "torch._foreach_mul", "torch._foreach_addcmul"),
    "torch._fused_adamw_": exists("torch._fused_adamw_"),
    'torch.autocast("cpu", dtype=torch.bfloat16)': binds("torch.autocast", "cpu", dtype=torch.bfloat16),
    "torch.backends.cuda.matmul.allow_tf32 = True": exists("torch.backends.cuda.matmul.allow_tf32"),
    "torch.compile": exists("torch.compile"),
    'torch.compile(mode="reduce-overhead")': binds("torch.compile", None, mode="reduce-overhead"),
    "torch.compile(model)": binds("torch.compile", None),
    "torch.cuda.max_memory_allocated()": binds("torch.cuda.max_memory_allocated"),
    "torch.cuda.synchronize()": binds("torch.cuda.synchronize"),
    "torch.optim": exists("torch.optim"),
    "torch.optim.AdamW": exists("torch.optim.AdamW"),
    "torch.profiler": exists("torch.profiler"),
    "torch.profiler.record_function": exists("torch.profiler.record_function"),
    'torch.set_float32_matmul_precision("high")': binds("torch.set_float32_matmul_precision", "high"),
    "torch.utils.checkpoint.create_selective_checkpoint_contexts":
        binds("torch.utils.checkpoint.create_selective_checkpoint_contexts", []),
    "with sdpa_kernel(SDPBackend.FLASH_ATTENTION):":
        lambda: binds("torch.nn.attention.sdpa_kernel", resolve("torch.nn.attention.SDPBackend.FLASH_ATTENTION"))(),
    # Sections 10-15 (merged from l8new)
    "_foreach_*": exists("torch._foreach_add", "torch._foreach_mul"),
    "torch._foreach": exists("torch._foreach_add"),
    "activation_checkpointing_enable()": binds("transformers.PreTrainedModel.activation_checkpointing_enable", None),
    "activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]": lambda: binds(
        "torch.profiler.profile", activities=[resolve("torch.profiler.ProfilerActivity.CPU"),
                                              resolve("torch.profiler.ProfilerActivity.CUDA")])(),
    "chunked_loss.ChunkedLossLM": exists("course_utils.chunked_loss.ChunkedLossLM"),
    "input_pipeline.WithReadLatency": exists("course_utils.input_pipeline.WithReadLatency"),
    "memory.measure_allocator_rise": exists("course_utils.memory.measure_allocator_rise"),
    "on_trace_ready": binds("torch.profiler.profile", on_trace_ready=None),
    "persistent_workers": binds("torch.utils.data.DataLoader", [], persistent_workers=True),
    "prof.export_chrome_trace": exists("torch.profiler.profile.export_chrome_trace"),
    "prof.step()": binds("torch.profiler.profile.step", None),
    "python -m benchmarks.bench_llama_compile": lambda: (REPO_DIR / "benchmarks" / "bench_llama_compile.py").is_file() or (_ for _ in ()).throw(FileNotFoundError("benchmarks/bench_llama_compile.py")),
    "record_shapes=True": binds("torch.profiler.profile", record_shapes=True),
    'torch.cuda.memory._dump_snapshot("snapshot.pickle")': binds("torch.cuda.memory._dump_snapshot", "snapshot.pickle"),
    "torch.cuda.memory._record_memory_history()": binds("torch.cuda.memory._record_memory_history"),
    "torch.profiler.tensorboard_trace_handler(dir)": binds("torch.profiler.tensorboard_trace_handler", "dir"),
    "torch.utils.checkpoint": exists("torch.utils.checkpoint"),
    "torch.profiler.schedule(wait, warmup, active, repeat)":
        binds("torch.profiler.schedule", wait=1, warmup=1, active=1, repeat=1),
    "wait=1, warmup=1, active=2, repeat=2": binds("torch.profiler.schedule", wait=1, warmup=1, active=2, repeat=2),
    "wait": binds("torch.profiler.schedule", wait=1, active=1),
    "warmup": binds("torch.profiler.schedule", warmup=1, active=1),
    "active": binds("torch.profiler.schedule", active=1),
    "repeat": binds("torch.profiler.schedule", active=1, repeat=1),
}
# Spans that name no library API: the lesson's own variables and exercise names, values, paths, plain Python, a URL.
NOT_APIS = {
    "(timing, tokens_per_step, peak_bytes)", "-100", "/proc/cpuinfo", "None", "attention_mask", "budget_bytes",
    "chrome://tracing", "data/paraphrase/", "data/tiny-distilbert/", "distilbert-base-cased",
    "estimate_mfu",  # nanoGPT's function, linked beside it, not an installed library's
    "fastest_that_fits(setups, budget_bytes)", "if tensor > 0:", "input_ids", "new_gelu", "padding_waste(batches)",
    "print", "setups", "speed_and_memory",
    "GPTConfig", "model.py", "vocab_size = 50304",  # nanoGPT's class, file and setting, linked beside them
    "multi_tensor_apply",  # the CUDA C++ helper behind torch._foreach_*, named with its source, not a Python API
}


def prose_spans():
    notebook = jupytext.read(LESSON, fmt="py:percent")
    # A span may wrap onto the next line of the source: read it with its whitespace made single spaces.
    return {" ".join(span.split()) for cell in notebook.cells if cell.cell_type == "markdown"
            for span in re.findall(r"`([^`]+)`", cell.source)}


def test_every_code_span_of_the_prose_is_an_api_checked_here_or_listed_as_none():
    unclassified = prose_spans() - set(APIS) - NOT_APIS
    assert not unclassified, f"lesson 8's prose names {sorted(unclassified)}: add each to APIS (with a check) or NOT_APIS"


@pytest.mark.parametrize("span", sorted(APIS))
def test_each_api_the_prose_names_exists_with_those_arguments(span):
    APIS[span]()


def test_the_old_spelling_of_grouping_by_length_raises_in_the_pinned_transformers():
    from transformers import TrainingArguments

    with pytest.raises(TypeError, match="group_by_length"):
        TrainingArguments(output_dir="unused", group_by_length=True)
