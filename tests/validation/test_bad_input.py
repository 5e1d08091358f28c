"""Bad input to a public function of course_utils is refused at once, naming the argument (issue 22, point 6).

One row per bad call a user plausibly makes: the wrong type, 0, a negative
number, NaN, inf, an empty list, the wrong shape, a string where a number goes,
two options that exclude each other, a size that would run for minutes. Each
row says which exception is expected and a fragment of its message that names
the argument (and, where it helps, what was expected).

Run as a script, the table is tallied the way issue 22 reported it: clear
errors, obscure errors (another exception, or a message that does not name the
argument), silent results (no exception at all) and hangs (still running after
``HANG_SECONDS``)::

    .venv/bin/python tests/validation/test_bad_input.py

On commit 58d4b94 (before issue 22, point 6) the 218 calls to 101 functions gave
128 clear errors, 46 obscure, 43 silent results and 1 hang; every row is clear now.

Issue 31 (part 5) added a row for every public function of every module
(``test_every_public_function_has_a_bad_input_row`` enumerates them and names
any without one; ``EXEMPT`` lists, with the reason, what no bad value reaches).
On commit 27095e6 (before it) the table's 367 calls gave 306 clear errors, 41
obscure and 20 silent results (all in the 149 new rows); every row is clear now.
"""

from __future__ import annotations

import functools
import sys

import pytest
import torch

from course_utils import meshes, pipeline, saved_activations, tensor_parallel
from course_utils import accelerate_state, adamw, command_line, data, fidelity, gpus, launcher, levers, loop_diff, loops, memory
from course_utils import models, optimizers, parallel, quantization, schedules, speed, train, units
from course_utils import hardware, launch_files, layout_choice, plan, step_time, step_time_checks, your_run
from course_utils.exercises import lesson10 as lesson10_exercises
from course_utils.memory import per_process, planner
from course_utils.exercises.limits import time_limit
from course_utils.plots import levers as lever_plots
from course_utils.plots import memory_explorer as explorer_plots
from course_utils.plots import adamw as adamw_plots
from course_utils.plots import parallel as parallel_plots
from course_utils.plots import pipeline as pipeline_plots
from course_utils.plots import state_memory as state_memory_plots
from course_utils.plots import training_memory as training_memory_plots
from course_utils.plots import memory_efficient as memory_efficient_plots
from course_utils.plots import training as training_plots

# A guard, not a speed target: a row that runs this long is reported as a hang instead of blocking the run.
HANG_SECONDS = 30
NAN, INF = float("nan"), float("inf")


# --------------------------------------------------------------------------- small, valid things to pass beside the bad one


def _param():
    return torch.tensor([1.0, -2.0])


def _zeros():
    return torch.zeros(2)


def _linear():
    torch.manual_seed(0)
    return torch.nn.Linear(2, 2)


@functools.cache
def _tiny_lm():
    """A one-block GPT-2 language model with random weights (a few thousand parameters)."""
    from transformers import GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(_tiny_config())


def _llama_lm(tied: bool = False):
    """A two-block Llama causal LM with random weights (a few thousand parameters), its head untied unless ``tied``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=20, hidden_size=8, intermediate_size=16, num_hidden_layers=2,
                                        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=16,
                                        tie_word_embeddings=tied))


def _tiny_config():
    from transformers import GPT2Config

    return GPT2Config(vocab_size=64, n_embd=16, n_layer=1, n_head=2, n_positions=32, bos_token_id=0, eos_token_id=0)


def _report():
    return parallel.ProcessReport(worker=0, process_index=0, num_processes=1, distributed_type="NO",
                                  num_batches=3, last_loss=0.5, gradient_checksum=1.0)


def _plan():
    return memory.TrainingMemory(weights=100, gradients=100, optimizer_state=200, activations=50, peak=450,
                                 phase_of_peak="backward")


def _quiet_launch(*args, **kwargs):
    return launcher.launch(lambda: None, *args, **kwargs)


# --------------------------------------------------------------------------- the table

# (what is called, the call, the exception expected, a fragment of its message)
ROWS = [
    # adamw: the step the lesson shows, and the helpers around it
    ("adamw_step step=0", lambda: adamw.adamw_step(_param(), _param(), _zeros(), _zeros(), step=0), ValueError, "step"),
    ("adamw_step step=-3", lambda: adamw.adamw_step(_param(), _param(), _zeros(), _zeros(), step=-3), ValueError, "step"),
    ("adamw_step step=1.5", lambda: adamw.adamw_step(_param(), _param(), _zeros(), _zeros(), step=1.5), ValueError, "step"),
    ("adamw_step beta1=1", lambda: adamw.adamw_step(_param(), _param(), _zeros(), _zeros(), 1, beta1=1.0), ValueError, "beta1"),
    ("adamw_step beta2=1.5", lambda: adamw.adamw_step(_param(), _param(), _zeros(), _zeros(), 1, beta2=1.5), ValueError, "beta2"),
    ("adamw_step lr=nan", lambda: adamw.adamw_step(_param(), _param(), _zeros(), _zeros(), 1, lr=NAN), ValueError, "lr"),
    ("adamw_step lr='fast'", lambda: adamw.adamw_step(_param(), _param(), _zeros(), _zeros(), 1, lr="fast"), ValueError, "lr"),
    ("adamw_step eps=0", lambda: adamw.adamw_step(_zeros(), _zeros(), _zeros(), _zeros(), 1, eps=0.0), ValueError, "eps"),
    ("adamw_step weight_decay=-1", lambda: adamw.adamw_step(_param(), _param(), _zeros(), _zeros(), 1, weight_decay=-1.0),
     ValueError, "weight_decay"),
    ("adam_l2_step step=0", lambda: adamw.adam_l2_step(_param(), _param(), _zeros(), _zeros(), 0), ValueError, "step"),
    ("run_steps lr='fast'", lambda: adamw.run_steps(adamw.adamw_step, _param(), [_param()], lr="fast"), ValueError, "lr"),
    ("run_steps gradients=[]", lambda: adamw.run_steps(adamw.adamw_step, _param(), []), ValueError, "gradients"),
    ("run_steps step_function=None", lambda: adamw.run_steps(None, _param(), [_param()]), TypeError, "step_function"),
    ("run_torch_adamw betas=", lambda: adamw.run_torch_adamw(_param(), [_param()], betas=(0.9, 0.99)), TypeError, "betas"),
    ("run_torch_adamw beta1=1", lambda: adamw.run_torch_adamw(_param(), [_param()], beta1=1.0), ValueError, "beta1"),
    ("noisy_gradients num_steps=0", lambda: adamw.noisy_gradients(0), ValueError, "num_steps"),
    ("noisy_gradients seed=2**70", lambda: adamw.noisy_gradients(30, seed=2**70), ValueError, "seed"),
    ("noisy_gradients seed=-1", lambda: adamw.noisy_gradients(30, seed=-1), ValueError, "seed"),
    ("ema_traces []", lambda: adamw.ema_traces([]), ValueError, "gradients"),
    ("ema_traces 'abc'", lambda: adamw.ema_traces("abc"), TypeError, "gradients"),
    ("ema_traces [1, nan]", lambda: adamw.ema_traces([1.0, NAN]), ValueError, "gradients"),
    ("ema_traces beta2=1", lambda: adamw.ema_traces([1.0, 2.0], beta2=1.0), ValueError, "beta2"),
    ("optimizer_state_table max_rows=0",
     lambda: adamw.optimizer_state_table(torch.optim.SGD(_linear().parameters()), max_rows=0), ValueError, "max_rows"),
    ("optimizer_state_table optimizer=model", lambda: adamw.optimizer_state_table(_linear()), TypeError, "optimizer"),
    # quantization
    ("quantize_blockwise [inf, 1]", lambda: quantization.quantize_blockwise(torch.tensor([INF, 1.0])), ValueError, "tensor"),
    ("quantize_blockwise [nan, 1]", lambda: quantization.quantize_blockwise(torch.tensor([NAN, 1.0])), ValueError, "tensor"),
    ("quantize_blockwise list", lambda: quantization.quantize_blockwise([1.0, 2.0]), TypeError, "tensor"),
    ("quantize_blockwise int tensor", lambda: quantization.quantize_blockwise(torch.arange(4)), TypeError, "tensor"),
    ("quantize_blockwise block_size=0", lambda: quantization.quantize_blockwise(_param(), block_size=0), ValueError, "block_size"),
    ("dequantize_blockwise tensor", lambda: quantization.dequantize_blockwise(_param()), TypeError, "quantized"),
    ("eight_bit_state_bytes -1", lambda: quantization.eight_bit_state_bytes(-1), ValueError, "num_elements"),
    ("eight_bit_state_bytes block_size=0", lambda: quantization.eight_bit_state_bytes(10, block_size=0), ValueError, "block_size"),
    ("factor_second_moment nan", lambda: quantization.factor_second_moment(torch.tensor([[1.0, NAN], [1.0, 1.0]])),
     ValueError, "squared"),
    ("factor_second_moment inf", lambda: quantization.factor_second_moment(torch.tensor([[1.0, INF], [1.0, 1.0]])),
     ValueError, "squared"),
    ("factor_second_moment vector", lambda: quantization.factor_second_moment(torch.ones(3)), ValueError, "squared"),
    ("factor_second_moment negative", lambda: quantization.factor_second_moment(-torch.ones(2, 2)), ValueError, "squared"),
    ("reconstruct_second_moment negative",
     lambda: quantization.reconstruct_second_moment(torch.tensor([1.0, -1.0]), torch.ones(3)), ValueError, "row_means"),
    ("reconstruct_second_moment nan",
     lambda: quantization.reconstruct_second_moment(torch.ones(2), torch.tensor([1.0, NAN])), ValueError, "col_means"),
    ("reconstruct_second_moment shapes",
     lambda: quantization.reconstruct_second_moment(torch.ones(2, 2), torch.ones(3, 2)), ValueError, "row_means"),
    ("factored_state_elements (2.5, 3)", lambda: quantization.factored_state_elements((2.5, 3)), ValueError, "shape"),
    ("factored_state_elements 'ab'", lambda: quantization.factored_state_elements("ab"), ValueError, "shape"),
    # optimizers: make_optimizer and its options (the memory estimates read the same options)
    ("make_optimizer betas=0.9", lambda: optimizers.make_optimizer("adamw", _linear().parameters(), betas=0.9),
     ValueError, "betas"),
    ("make_optimizer betas=(0.9,)", lambda: optimizers.make_optimizer("adam", _linear().parameters(), betas=(0.9,)),
     ValueError, "betas"),
    ("make_optimizer betas=(0.9, 1.0)", lambda: optimizers.make_optimizer("adamw", _linear().parameters(), betas=(0.9, 1.0)),
     ValueError, "betas"),
    ("make_optimizer lr='fast'", lambda: optimizers.make_optimizer("adamw", _linear().parameters(), lr="fast"),
     ValueError, "lr"),
    ("make_optimizer lr=inf", lambda: optimizers.make_optimizer("sgd", _linear().parameters(), lr=INF), ValueError, "lr"),
    ("make_optimizer lr=-1", lambda: optimizers.make_optimizer("adamw", _linear().parameters(), lr=-1.0), ValueError, "lr"),
    ("make_optimizer eps='tiny'", lambda: optimizers.make_optimizer("adam", _linear().parameters(), eps="tiny"),
     ValueError, "eps"),
    ("make_optimizer weight_decay=nan", lambda: optimizers.make_optimizer("adamw", _linear().parameters(), weight_decay=NAN),
     ValueError, "weight_decay"),
    ("make_optimizer momentum=nan", lambda: optimizers.make_optimizer("sgd", _linear().parameters(), momentum=NAN),
     ValueError, "momentum"),
    ("make_optimizer foreach and fused",
     lambda: optimizers.make_optimizer("adamw", _linear().parameters(), foreach=True, fused=True), ValueError, "fused"),
    ("make_optimizer fused='yes'", lambda: optimizers.make_optimizer("adam", _linear().parameters(), fused="yes"),
     TypeError, "fused"),
    ("make_optimizer maximize='no'", lambda: optimizers.make_optimizer("adamw", _linear().parameters(), maximize="no"),
     TypeError, "maximize"),
    ("make_optimizer rmsprop lr=-1", lambda: optimizers.make_optimizer("rmsprop", _linear().parameters(), lr=-1.0),
     ValueError, "lr"),
    ("make_optimizer params=model", lambda: optimizers.make_optimizer("adamw", _linear()), TypeError, "params"),
    ("make_optimizer params=[]", lambda: optimizers.make_optimizer("adamw", []), ValueError, "param"),
    ("make_optimizer name='AdamW'", lambda: optimizers.make_optimizer("AdamW", _linear().parameters()), ValueError, "optimizer"),
    ("make_optimizer unknown option", lambda: optimizers.make_optimizer("adamw", _linear().parameters(), beta1=0.9),
     TypeError, "beta1"),
    # optimizer state, estimated and measured
    ("estimate_optimizer_state momentum=nan",
     lambda: memory.estimate_optimizer_state(_linear(), "sgd", momentum=NAN), ValueError, "momentum"),
    ("estimate_optimizer_state betas=0.9",
     lambda: memory.estimate_optimizer_state(_linear(), "adamw", betas=0.9), ValueError, "betas"),
    ("estimate_optimizer_state amsgrad='yes'",
     lambda: memory.estimate_optimizer_state(_linear(), "adamw", amsgrad="yes"), ValueError, "amsgrad"),
    ("estimate_optimizer_state model='x'", lambda: memory.estimate_optimizer_state("x", "adamw"), TypeError, "model"),
    ("measure_optimizer_state None", lambda: memory.measure_optimizer_state(None), TypeError, "optimizer"),
    ("describe_optimizer_state model", lambda: memory.describe_optimizer_state(_linear()), TypeError, "optimizer"),
    # the planner and the step it follows
    ("estimate_training_memory lr='fast'",
     lambda: memory.estimate_training_memory(_tiny_lm(), "adamw", 1, 8, lr="fast"), ValueError, "lr"),
    ("estimate_training_memory foreach and fused",
     lambda: memory.estimate_training_memory(_tiny_lm(), "adamw", 1, 8, foreach=True, fused=True), ValueError, "foreach"),
    ("estimate_training_memory batch_size=0",
     lambda: memory.estimate_training_memory(_tiny_lm(), "adamw", 0, 8), ValueError, "batch_size"),
    ("estimate_training_memory seq_len=-1",
     lambda: memory.estimate_training_memory(_tiny_lm(), "adamw", 1, -1), ValueError, "seq_len"),
    ("estimate_training_memory seq_len too long",
     lambda: memory.estimate_training_memory(_tiny_lm(), "adamw", 1, 33), ValueError, "seq_len"),
    ("estimate_training_memory fp16",
     lambda: memory.estimate_training_memory(_tiny_lm(), "adamw", 1, 8, mixed_precision="fp16"), ValueError, "fp16"),
    ("estimate_training_memory layout='cp'",
     lambda: memory.estimate_training_memory(_tiny_lm(), "adamw", 1, 8, layout="cp"), TypeError, "layout"),
    ("estimate_training_memory layout and world_size",
     lambda: memory.estimate_training_memory(_tiny_lm(), "adamw", 1, 8, world_size=2, sharding="ddp",
                                             layout=layouts.Layout("none", 2, cp=2)), ValueError, "layout replaces"),
    ("estimate_training_memory rank=2 of a cp=2 layout",
     lambda: memory.estimate_training_memory(_tiny_lm(), "adamw", 1, 8, layout=layouts.Layout("none", 2, cp=2),
                                             rank=2), ValueError, "rank"),
    ("estimate_training_memory seq_len=7 over cp=2",
     lambda: memory.estimate_training_memory(_tiny_lm(), "adamw", 1, 7, layout=layouts.Layout("none", 2, cp=2)),
     ValueError, "divisible by the layout's cp=2"),
    ("estimate_training_memory cp of a classifier",
     lambda: memory.estimate_training_memory(sharding.course_model(), "adamw", 1, 8,
                                             layout=layouts.Layout("none", 2, cp=2)),
     memory.PlannerRefused, "causal language model"),
    ("estimate_training_memory ep of a model without experts",
     lambda: memory.estimate_training_memory(_tiny_lm(), "adamw", 1, 8, layout=layouts.Layout("none", 2, cp=2, ep=2)),
     memory.PlannerRefused, "base_model_ep_plan"),
    ("estimate_training_memory cp under bf16 autocast",
     lambda: memory.estimate_training_memory(_tiny_lm(), "adamw", 1, 8, mixed_precision="bf16",
                                             layout=layouts.Layout("none", 2, cp=2)), memory.PlannerRefused, "autocast"),
    ("training_batch batch_size=0", lambda: memory.training_batch(_tiny_lm(), 0, 8), ValueError, "batch_size"),
    ("training_batch seq_len=-1", lambda: memory.training_batch(_tiny_lm(), 2, -1), ValueError, "seq_len"),
    ("training_batch seq_len='8'", lambda: memory.training_batch(_tiny_lm(), 2, "8"), ValueError, "seq_len"),
    ("training_batch model=Linear", lambda: memory.training_batch(_linear(), 2, 8), ValueError, "model"),
    ("training_batch generator=0", lambda: memory.training_batch(_tiny_lm(), 2, 8, generator=0), TypeError, "generator"),
    ("head_kind 'gpt2'", lambda: memory.head_kind("gpt2"), ValueError, "model"),
    ("measure_training_step_peak accumulation=0",
     lambda: memory.measure_training_step_peak(_linear(), torch.optim.SGD(_linear().parameters()), {}, gradient_accumulation_steps=0),
     ValueError, "gradient_accumulation_steps"),
    ("measure_training_step_peak batch=list",
     lambda: memory.measure_training_step_peak(_linear(), torch.optim.SGD(_linear().parameters()), [1]), TypeError, "batch"),
    ("measure_training_step_peak loss_fn=0",
     lambda: memory.measure_training_step_peak(_linear(), torch.optim.SGD(_linear().parameters()), {}, loss_fn=0),
     TypeError, "loss_fn"),
    ("explain_training_memory batch_size=0",
     lambda: memory.explain_training_memory(_tiny_lm(), "adamw", 0, 8), ValueError, "batch_size"),
    ("rule_of_thumb_training_memory 'x'", lambda: memory.rule_of_thumb_training_memory("x"), TypeError, "model"),
    # levers (lesson 5)
    ("plan_and_measure seed='a'", lambda: levers.plan_and_measure(_tiny_lm(), memory.TrainingSetup("adamw", 1, 8), seed="a"),
     ValueError, "seed"),
    ("plan_and_measure setup=(1, 8)", lambda: levers.plan_and_measure(_tiny_lm(), (1, 8)), TypeError, "setup"),
    ("TrainingSetup optimizer=3", lambda: memory.TrainingSetup(3, 1, 8), ValueError, "optimizer"),
    ("TrainingSetup batch_size=0", lambda: memory.TrainingSetup("adamw", 0, 8), ValueError, "batch_size"),
    ("TrainingSetup options=[1]", lambda: memory.TrainingSetup("adamw", 1, 8, options=[1]), TypeError, "options"),
    ("TrainingSetup option list", lambda: memory.TrainingSetup("sgd", 1, 8, options={"momentum": {}}), ValueError,
     "momentum"),
    ("plan setup=dict", lambda: memory.plan(_tiny_lm(), {"optimizer": "adamw"}), TypeError, "setup"),
    ("measure setup=None", lambda: memory.measure(_tiny_lm(), None), TypeError, "setup"),
    ("memory_table {}", lambda: levers.memory_table({}), ValueError, "checks"),
    ("Levers micro_batch_size=0", lambda: levers.Levers(micro_batch_size=0), ValueError, "micro_batch_size"),
    ("Levers train='everything'", lambda: levers.Levers(train="everything"), ValueError, "train"),
    ("build_with_levers model_class='gpt2'",
     lambda: levers.build_with_levers("gpt2", _tiny_config(), levers.Levers()), TypeError, "model_class"),
    ("build_with_levers config='gpt2'",
     lambda: levers.build_with_levers(_auto_lm(), "gpt2", levers.Levers()), TypeError, "config"),
    ("plan_with_levers seq_len=0",
     lambda: levers.plan_with_levers(_auto_lm(), _tiny_config(), levers.Levers(), 0), ValueError, "seq_len"),
    ("describe_fit budget=-1", lambda: levers.describe_fit(_plan(), -1), ValueError, "budget"),
    ("describe_fit budget=nan", lambda: levers.describe_fit(_plan(), NAN), ValueError, "budget"),
    ("describe_fit plan=None", lambda: levers.describe_fit(None, 10**9), TypeError, "plan"),
    # levers (lesson 5)
    ("describe_timing []", lambda: speed.describe_timing([]), ValueError, "seconds"),
    ("describe_timing [-1]", lambda: speed.describe_timing([-1.0]), ValueError, "seconds"),
    ("describe_timing [nan]", lambda: speed.describe_timing([NAN]), ValueError, "seconds"),
    ("time_optimizer_step repeats=0",
     lambda: speed.time_optimizer_step(_linear(), torch.optim.SGD(_linear().parameters()), [{}], repeats=0),
     ValueError, "repeats"),
    ("time_optimizer_step micro_batches=[]",
     lambda: speed.time_optimizer_step(_linear(), torch.optim.SGD(_linear().parameters()), []), TypeError, "micro_batches"),
    ("fresh_accelerator mixed_precision='fp17'", lambda: accelerate_state.fresh_accelerator(mixed_precision="fp17"),
     ValueError, "mixed_precision"),
    # parallel (lesson 6)
    ("batches_per_process 0", lambda: parallel.batches_per_process(0, 2), ValueError, "num_batches"),
    ("batches_per_process num_processes=0", lambda: parallel.batches_per_process(8, 0), ValueError, "num_processes"),
    ("shards_of_each_process 10**7 examples", lambda: parallel.shards_of_each_process(10**7, 8, 2), ValueError, "num_examples"),
    ("shards_of_each_process 10**6 processes", lambda: parallel.shards_of_each_process(100, 8, 10**6), ValueError,
     "num_processes"),
    ("shards_of_each_process split_batches='yes'",
     lambda: parallel.shards_of_each_process(16, 4, 2, split_batches="yes"), TypeError, "split_batches"),
    ("shards_of_each_process split, batch 3 of 2",
     lambda: parallel.shards_of_each_process(16, 3, 2, split_batches=True), ValueError, "batch_size"),
    ("report_process accelerator=None", lambda: parallel.report_process(None, _linear(), 3, 0.5), TypeError, "accelerator"),
    ("report_process last_loss='low'",
     lambda: parallel.report_process(accelerate_state.fresh_accelerator(cpu=True), _linear(), 3, "low"), ValueError, "last_loss"),
    ("report_process num_batches=0",
     lambda: parallel.report_process(accelerate_state.fresh_accelerator(cpu=True), _linear(), 0, 0.5), ValueError, "num_batches"),
    ("gather_reports accelerator=None", lambda: parallel.gather_reports(None, _report()), TypeError, "accelerator"),
    ("gather_reports report=dict", lambda: parallel.gather_reports(accelerate_state.fresh_accelerator(cpu=True), {}), TypeError,
     "report"),
    ("format_reports []", lambda: parallel.format_reports([]), TypeError, "reports"),
    ("diagnose_launch num_processes=0", lambda: parallel.diagnose_launch([_report()], 0), ValueError, "num_processes"),
    ("gradient_checksum 'x'", lambda: parallel.gradient_checksum("x"), TypeError, "model"),
    ("without_dropout None", lambda: parallel.without_dropout(None), TypeError, "model"),
    ("parameters_of None", lambda: parallel.parameters_of(None), TypeError, "model"),
    ("parameter_differences value not a tensor",
     lambda: parallel.parameter_differences({"w": _param()}, {"w": [1.0, -2.0]}), TypeError, "second"),
    ("parameter_differences names differ",
     lambda: parallel.parameter_differences({"w": _param()}, {"v": _param()}), ValueError, "first and second"),
    ("max_parameter_difference skip='bias'",
     lambda: parallel.max_parameter_difference({"w": _param()}, {"w": _param()}, skip="bias"), TypeError, "skip"),
    ("AllReduceCounter Linear", lambda: parallel.AllReduceCounter(_linear()), TypeError, "model"),
    # launcher (lesson 6)
    ("port_is_free 0", lambda: launcher.port_is_free(0), ValueError, "port"),
    ("port_is_free host=5", lambda: launcher.port_is_free(29500, host=5), TypeError, "host"),
    ("find_free_port host=5", lambda: launcher.find_free_port(host=5), TypeError, "host"),
    ("check_can_launch 0", lambda: launcher.check_can_launch(0), ValueError, "num_processes"),
    ("check_can_launch port=70000", lambda: launcher.check_can_launch(2, port=70000), ValueError, "port"),
    ("launch function='f'", lambda: launcher.launch("f"), TypeError, "function"),
    ("launch args=list", lambda: launcher.launch(print, args=[1]), TypeError, "args"),
    ("launch timeout=0", lambda: _quiet_launch(timeout=0), ValueError, "timeout"),
    ("run_command ''", lambda: command_line.run_command(""), ValueError, "command"),
    ("run_command rm", lambda: command_line.run_command("rm -rf /tmp/nothing"), ValueError, "command"),
    ("run_command timeout=-1", lambda: command_line.run_command("python -c 1", timeout=-1), ValueError, "timeout"),
    ("run_command cwd=5", lambda: command_line.run_command("python -c 1", cwd=5), TypeError, "cwd"),
    ("check_process_group None", lambda: command_line.check_process_group(None), TypeError, "accelerator"),
    # train (lesson 6)
    ("TrainConfig batch_size=0", lambda: train.TrainConfig(batch_size=0), ValueError, "batch_size"),
    ("TrainConfig lr=nan", lambda: train.TrainConfig(lr=NAN), ValueError, "lr"),
    ("TrainConfig cpu='yes'", lambda: train.TrainConfig(cpu="yes"), TypeError, "cpu"),
    ("linear_warmup_then_decay warmup=-1", lambda: schedules.linear_warmup_then_decay(-1, 10), ValueError, "num_warmup_steps"),
    ("linear_warmup_then_decay training=0", lambda: schedules.linear_warmup_then_decay(0, 0), ValueError, "num_training_steps"),
    ("linear_warmup_then_decay warmup > training", lambda: schedules.linear_warmup_then_decay(20, 10), ValueError,
     "num_warmup_steps"),
    ("linear_warmup_then_decay '5'", lambda: schedules.linear_warmup_then_decay("5", 10), ValueError, "num_warmup_steps"),
    ("train.main unknown flag", lambda: _main_exit_code(["--no-such-flag"]), ValueError, "exit code 2"),
    # loops (lesson 1): the wrappers around the loops the lesson shows
    ("linear_schedule_with_warmup steps=0",
     lambda: schedules.linear_schedule_with_warmup(torch.optim.SGD(_linear().parameters()), 0), ValueError, "num_training_steps"),
    ("linear_schedule_with_warmup fraction=nan",
     lambda: schedules.linear_schedule_with_warmup(torch.optim.SGD(_linear().parameters()), 10, NAN), ValueError,
     "warmup_fraction"),
    ("evaluate model='x'", lambda: loops.evaluate("x", None), TypeError, "model"),
    ("evaluate dataloader=list", lambda: loops.evaluate(_linear(), [1]), TypeError, "dataloader"),
    ("accuracy_and_f1 shapes", lambda: loops.accuracy_and_f1([0, 1], [0, 1, 1]), ValueError, "predictions"),
    ("accuracy_and_f1 []", lambda: loops.accuracy_and_f1([], []), ValueError, "labels"),
    ("accuracy_and_f1 'ab'", lambda: loops.accuracy_and_f1("ab", "ab"), TypeError, "predictions"),
    ("code_lines 5", lambda: loop_diff.code_lines(5), TypeError, "function"),
    ("loop_changes before=5", lambda: loop_diff.loop_changes(5), TypeError, "function"),
    ("loop_diff_html after='x'", lambda: loop_diff.loop_diff_html(after="x"), TypeError, "function"),
    # models, units, GPUs
    ("load_pretrained_classifier num_labels=0", lambda: models.load_pretrained_classifier(num_labels=0), ValueError,
     "num_labels"),
    ("load_pretrained_classifier missing folder", lambda: models.load_pretrained_classifier("/no/such/folder"),
     FileNotFoundError, "path"),
    ("distilbert_base_cased_config num_labels=0", lambda: models.distilbert_base_cased_config(0), ValueError, "num_labels"),
    ("distilbert_base_cased_config num_labels='2'", lambda: models.distilbert_base_cased_config("2"), ValueError,
     "num_labels"),
    ("build_distilbert_base_cased on_meta_device='yes'", lambda: models.build_distilbert_base_cased("yes"), TypeError,
     "on_meta_device"),
    ("count_parameters 'x'", lambda: models.count_parameters("x"), TypeError, "model"),
    ("count_parameters trainable_only=1", lambda: models.count_parameters(_linear(), 1), TypeError, "trainable_only"),
    ("fine_tuning_architectures int8", lambda: models.fine_tuning_architectures(torch.int8), ValueError, "dtype"),
    ("format_bytes -1", lambda: units.format_bytes(-1), ValueError, "num_bytes"),
    ("format_bytes nan", lambda: units.format_bytes(NAN), ValueError, "num_bytes"),
    ("format_bytes digits=-1", lambda: units.format_bytes(2048, digits=-1), ValueError, "digits"),
    ("format_bytes digits='2'", lambda: units.format_bytes(2048, digits="2"), ValueError, "digits"),
    ("gpu_memory_bytes 'H100 80GB'", lambda: gpus.gpu_memory_bytes("no such card"), ValueError, "name"),
    ("gpu_memory_bytes list", lambda: gpus.gpu_memory_bytes(["A100"]), ValueError, "name"),
    # fidelity (lesson 3)
    ("record_gradients max_batches=0", lambda: fidelity.record_gradients(_linear(), [], max_batches=0), ValueError,
     "max_batches"),
    ("record_gradients batches=[]", lambda: fidelity.record_gradients(_linear(), []), ValueError, "batches"),
    ("relative_distance []", lambda: fidelity.relative_distance([], []), ValueError, "updates"),
    ("relative_distance zeros", lambda: fidelity.relative_distance([_param()], [_zeros()]), ValueError, "reference"),
    ("relative_distance shapes", lambda: fidelity.relative_distance([_param()], [torch.ones(3)]), ValueError, "updates"),
    # data (lesson 1)
    ("load_paraphrase_dataset 5", lambda: data.load_paraphrase_dataset(5), TypeError, "data_dir"),
    ("load_paraphrase_dataset missing folder", lambda: data.load_paraphrase_dataset("/no/such/folder"), FileNotFoundError,
     "data_dir"),
    ("load_tokenizer 5", lambda: data.load_tokenizer(5), TypeError, "path"),
    ("load_tokenizer missing folder", lambda: data.load_tokenizer("./no/such/folder"), FileNotFoundError, "path"),
    ("tokenize_dataset dataset='x'", lambda: data.tokenize_dataset("x", None), TypeError, "dataset"),
    ("make_dataloader split='dev'", lambda: data.make_dataloader("dev"), ValueError, "split"),
    ("make_dataloader batch_size=0", lambda: data.make_dataloader(batch_size=0), ValueError, "batch_size"),
    ("make_dataloader shuffle='yes'", lambda: data.make_dataloader(shuffle="yes"), ValueError, "shuffle"),
    ("make_dataloader seed=-1", lambda: data.make_dataloader(seed=-1), ValueError, "seed"),
    ("make_dataloader max_length=10**6", lambda: data.make_dataloader(max_length=10**6), ValueError, "max_length"),
    ("make_dataloaders limit=0", lambda: data.make_dataloaders(limit=0), ValueError, "limit"),
    # fidelity (lesson 3), continued
    ("replay_gradients gradients=5", lambda: fidelity.replay_gradients(_linear(), 5, "adamw"), ValueError, "gradients"),
    ("replay_gradients wrong shapes",
     lambda: fidelity.replay_gradients(_linear(), [[torch.ones(3), torch.ones(2)]], "adamw"), ValueError, "gradients[0]"),
    ("replay_gradients lr='fast'",
     lambda: fidelity.replay_gradients(_linear(), [[torch.ones(2, 2), torch.ones(2)]], "adamw", lr="fast"), ValueError,
     "lr"),
    ("count_optimizer_state_elements None", lambda: memory.count_optimizer_state_elements(None), TypeError, "optimizer"),
    ("reporting_progress report=5", lambda: _enter(planner.reporting_progress(5)), TypeError, "report"),
    # plots (their arguments, checked before anything is drawn)
    ("plot_data_parallel_flow 5", lambda: parallel_plots.plot_data_parallel_flow(5), ValueError, "num_processes"),
    ("plot_shards []", lambda: parallel_plots.plot_shards([]), ValueError, "shards"),
    ("plot_wall_times [-1]", lambda: parallel_plots.plot_wall_times({"1 process": [-1.0]}), ValueError, "seconds"),
    ("plot_state_memory_vs_parameters unit='KB'",
     lambda: state_memory_plots.plot_state_memory_vs_parameters({"a": (10, 40)}, unit="KB"), ValueError, "unit"),
    ("plot_training_memory_breakdown {}", lambda: training_memory_plots.plot_training_memory_breakdown({}), ValueError,
     "setups"),
    ("read_memory negative", lambda: training_memory_plots.read_memory("a", {**vars(_plan()), "weights": -1}), ValueError,
     "weights"),
    ("plot_peak_memory_vs_parameters {}", lambda: training_memory_plots.plot_peak_memory_vs_parameters({}, {}), ValueError,
     "parameter_counts"),
    ("plot_factored_second_moment vector",
     lambda: memory_efficient_plots.plot_factored_second_moment(torch.ones(3), torch.ones(3)), ValueError, "full"),
    ("plot_optimizer_tradeoff {}", lambda: memory_efficient_plots.plot_optimizer_tradeoff({}), ValueError, "points"),
    ("plot_optimizer_memory_by_model {}", lambda: memory_efficient_plots.plot_optimizer_memory_by_model({}, {}),
     ValueError, "parameter_counts"),
    ("plot_moving_averages []", lambda: adamw_plots.plot_moving_averages([]), ValueError, "gradients"),
    ("moving_average_explorer beta1=1", lambda: adamw_plots.moving_average_explorer([1.0, 2.0], beta1=1.0), ValueError,
     "beta1"),
    ("training_memory_explorer model_names=[]",
     lambda: explorer_plots.training_memory_explorer([], print, ["adamw"], ["fp32"]), ValueError, "model_names"),
    ("training_step_parts_in 5", lambda: training_plots.training_step_parts_in(5), TypeError, "function"),
    ("plot_loss_curves {}", lambda: training_plots.plot_loss_curves({}), ValueError, "histories"),
    ("plot_loss_curves smooth=0", lambda: training_plots.plot_loss_curves({"a": [1.0]}, smooth=0), ValueError, "smooth"),
    ("moving_average window=0", lambda: training_plots.moving_average([1.0, 2.0], 0), ValueError, "window"),
    ("count_statements 5", lambda: training_plots.count_statements(5), TypeError, "function"),
    ("plot_trainer_versus_accelerator {}", lambda: training_plots.plot_trainer_versus_accelerator({}), ValueError,
     "training_functions"),
    ("plot_quantization_error block_size=0",
     lambda: memory_efficient_plots.plot_quantization_error(_param(), {"linear": _param()}, block_size=0), ValueError,
     "block_size"),
    ("short_count -5", lambda: memory_efficient_plots.short_count(-5), ValueError, "count"),
    ("short_count 'many'", lambda: memory_efficient_plots.short_count("many"), ValueError, "count"),
    ("plot_vanishing_updates shares of another length",
     lambda: lever_plots.plot_vanishing_updates([1e-3, 1e-2], {"bf16": [0.5]}), ValueError, "changed_share"),
    ("plot_vanishing_updates threshold=0",
     lambda: lever_plots.plot_vanishing_updates([1e-3], {"bf16": [0.5]}, threshold=0), ValueError, "threshold"),
    ("plot_gradient_norms []", lambda: lever_plots.plot_gradient_norms([], 1.0), ValueError, "grad_norms"),
    ("plot_gradient_norms max_grad_norm=-1", lambda: lever_plots.plot_gradient_norms([1.0], -1.0), ValueError,
     "max_grad_norm"),
    ("plot_memory_against_parameters {}", lambda: lever_plots.plot_memory_against_parameters({}), ValueError, "lines"),
    ("plot_memory_against_parameters budget=-1",
     lambda: lever_plots.plot_memory_against_parameters({"a": [(10, 100)]}, budget=-1), ValueError, "budget"),
    # exercises: the time limit a check puts on a learner's code
    ("time_limit 0", lambda: _enter(time_limit(0)), ValueError, "seconds"),
    ("time_limit nan", lambda: _enter(time_limit(NAN)), ValueError, "seconds"),
]


@functools.cache
def _auto_lm():
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM


def _enter(context_manager):
    with context_manager:
        pass


def _main_exit_code(argv):
    """Run ``train.main(argv)``; argparse answers a bad flag with SystemExit(2), which is a clear refusal."""
    import contextlib
    import io

    with contextlib.redirect_stderr(io.StringIO()):
        try:
            train.main(argv)
        except SystemExit as exit_:
            raise ValueError(f"exit code {exit_.code}") from None


# --------------------------------------------------------------------------- issue 31: a row for every public function

from course_utils import compiling, fine_tuning_variants, padding, sharding, sharding_plans, validation
from course_utils import cpu_features, layouts, loopback
from course_utils.exercises import feedback
from course_utils.exercises import lesson1 as lesson1_exercises
from course_utils.exercises import lesson4 as lesson4_exercises
from course_utils.exercises import lesson6 as lesson6_exercises
from course_utils.exercises import lesson7 as lesson7_exercises
from course_utils.plots import sharding as sharding_plots
from course_utils.plots import speed as speed_plots
from course_utils.plots import step_timeline as step_timeline_plots


def _timing(*seconds):
    return speed.Timing(tuple(seconds))


def _sequences():
    return [[5, 6, 7], [8, 9]]


def _cached_plan(**changes):
    return {"model": "m", "parameters": 10**9, "world_size": 8, "sharding": "zero3", "peak": 10**9, **changes}


ROWS += [
    # speed (lesson 8)
    ("Timing (inf,)", lambda: speed.Timing((INF,)), ValueError, "seconds"),
    ("Timing (nan,)", lambda: speed.Timing((NAN,)), ValueError, "seconds"),
    ("Timing list of str", lambda: speed.Timing(("1",)), ValueError, "seconds"),
    ("Timing.rate amount=0", lambda: _timing(0.1).rate(0), ValueError, "amount"),
    ("time_call function=5", lambda: speed.time_call(5), TypeError, "function"),
    ("time_call repeats=0", lambda: speed.time_call(lambda: None, repeats=0), ValueError, "repeats"),
    ("time_call warmup=True", lambda: speed.time_call(lambda: None, warmup=True), ValueError, "warmup"),
    ("time_interleaved {}", lambda: speed.time_interleaved({}), TypeError, "functions"),
    ("time_interleaved repeats=0", lambda: speed.time_interleaved({"a": lambda: None}, repeats=0), ValueError, "repeats"),
    ("compare timing_a=list", lambda: speed.compare("a", [0.1], "b", _timing(0.1)), TypeError, "timing_a"),
    ("compare name_b=5", lambda: speed.compare("a", _timing(0.1), 5, _timing(0.1)), TypeError, "name_b"),
    ("matmul_weights 'x'", lambda: speed.matmul_weights("x"), TypeError, "model"),
    ("matmul_weights experts='some'", lambda: speed.matmul_weights(_tiny_lm(), experts="some"), ValueError, "experts"),
    ("expert_weights 'x'", lambda: speed.expert_weights("x"), TypeError, "model"),
    ("model_shape Linear", lambda: speed.model_shape(_linear()), ValueError, "model"),
    ("model_shape tensor", lambda: speed.model_shape(_param()), TypeError, "model"),
    ("flops_per_token matmul_parameters=-1", lambda: speed.flops_per_token(-1, 2, 8, 16), ValueError, "matmul_parameters"),
    ("flops_per_token seq_len=0", lambda: speed.flops_per_token(100, 2, 0, 16), ValueError, "seq_len"),
    ("flops_per_token layers=1.5", lambda: speed.flops_per_token(100, 1.5, 8, 16), ValueError, "layers"),
    ("model_flops_per_token seq_len=0", lambda: speed.model_flops_per_token(_tiny_lm(), 0), ValueError, "seq_len"),
    ("model_flops_per_token tensor", lambda: speed.model_flops_per_token(_param(), 8), TypeError, "model"),
    ("measure_matmul_peak size=0", lambda: speed.measure_matmul_peak(0), ValueError, "size"),
    ("measure_matmul_peak repeats=0", lambda: speed.measure_matmul_peak(8, repeats=0), ValueError, "repeats"),
    ("mfu peak in TFLOP/s", lambda: speed.mfu(1000.0, 1e10, 10.0), ValueError, "peak_flops"),
    ("mfu tokens_per_second=0", lambda: speed.mfu(0.0, 1e10, 1e12), ValueError, "tokens_per_second"),
    ("mfu peak_flops=inf", lambda: speed.mfu(1000.0, 1e6, INF), ValueError, "peak_flops"),
    # padding (lesson 8)
    ("padding_stats []", lambda: padding.padding_stats([]), ValueError, "batches"),
    ("padding_stats mask values 2 and 5",
     lambda: padding.padding_stats([{"attention_mask": torch.tensor([[2, 5]])}]), ValueError, "attention_mask"),
    ("padding_stats one dict", lambda: padding.padding_stats({"attention_mask": torch.ones(1, 2)}), TypeError, "batches"),
    ("pad_to_max_length batch_size=0", lambda: padding.pad_to_max_length(_sequences(), 0, 4), ValueError, "batch_size"),
    ("pad_to_max_length max_length too short", lambda: padding.pad_to_max_length(_sequences(), 2, 2), ValueError,
     "max_length"),
    ("pad_to_max_length token 1.7", lambda: padding.pad_to_max_length([[1.7, 2]], 1, 4), ValueError, "sequences[0]"),
    ("pad_dynamically token 1.7", lambda: padding.pad_dynamically([[1.7, 2]], 1), ValueError, "sequences[0]"),
    ("pad_dynamically token -1", lambda: padding.pad_dynamically([[-1, 2]], 1), ValueError, "sequences[0]"),
    ("pad_dynamically 'hello'", lambda: padding.pad_dynamically("hello", 1), ValueError, "sequences"),
    ("pad_dynamically pad_id=-100", lambda: padding.pad_dynamically(_sequences(), 1, pad_id=-100), ValueError, "pad_id"),
    ("group_by_length batch_size=0", lambda: padding.group_by_length(_sequences(), 0), ValueError, "batch_size"),
    ("group_by_length seed=-1", lambda: padding.group_by_length(_sequences(), 1, seed=-1), ValueError, "seed"),
    ("pack max_length=0", lambda: padding.pack(_sequences(), 0), ValueError, "max_length"),
    ("pack rows_per_batch=0", lambda: padding.pack(_sequences(), 4, rows_per_batch=0), ValueError, "rows_per_batch"),
    ("pack []", lambda: padding.pack([], 4), ValueError, "sequences"),
    # compiling (lesson 8)
    ("count_compiled_graphs function=5", lambda: compiling.count_compiled_graphs(5, [(_param(),)]), TypeError, "function"),
    ("count_compiled_graphs bare tensors",
     lambda: compiling.count_compiled_graphs(torch.sin, [_param(), _param()]), TypeError, "inputs"),
    ("count_compiled_graphs inputs=[]", lambda: compiling.count_compiled_graphs(torch.sin, []), ValueError, "inputs"),
    ("count_compiled_graphs mode without a backend",
     lambda: compiling.count_compiled_graphs(torch.sin, [(_param(),)], mode="max-autotune"), ValueError, "mode"),
    ("count_compiled_graphs unknown option",
     lambda: compiling.count_compiled_graphs(torch.sin, [(_param(),)], fullgrph=True), TypeError, "fullgrph"),
    # sharding (lesson 7)
    ("agrees_with_plan plan=dict", lambda: sharding.agrees_with_plan({}, _plan()), TypeError, "plan"),
    ("agrees_with_plan slack=-1", lambda: sharding.agrees_with_plan(_plan(), _plan(), slack=-1), ValueError, "slack"),
    ("largest_unit_bytes world_size=0", lambda: sharding.largest_unit_bytes(_tiny_lm(), 0), ValueError, "world_size"),
    ("largest_unit_bytes 'x'", lambda: sharding.largest_unit_bytes("x"), TypeError, "model"),
    ("held_bytes 5", lambda: sharding.held_bytes(5), TypeError, "tensors"),
    ("held_bytes [1.0]", lambda: sharding.held_bytes([1.0]), TypeError, "tensors"),
    ("measure_planned_step outside a launch", lambda: sharding.measure_planned_step("ddp", 2, 8), RuntimeError, "launch"),
    ("measure_planned_step strategy='zero4'", lambda: sharding.measure_planned_step("zero4", 2, 8), ValueError, "strategy"),
    ("measure_planned_step batch_size=0", lambda: sharding.measure_planned_step("ddp", 0, 8), ValueError, "batch_size"),
    ("measure_laid_out_step model_class=LlamaConfig",
     lambda: sharding.measure_laid_out_step(_llama_lm().config, _llama_lm().config, layouts.Layout("none", 2, tp=2), 2,
                                            8), TypeError, "model_class"),
    ("measure_laid_out_step config={}",
     lambda: sharding.measure_laid_out_step(_auto_lm(), {}, layouts.Layout("none", 2, tp=2), 2, 8),
     TypeError, "config"),
    ("measure_laid_out_step layout='tp=2'",
     lambda: sharding.measure_laid_out_step(_auto_lm(), _llama_lm().config, "tp=2", 2, 8), TypeError,
     "layout"),
    ("measure_laid_out_step outside a launch",
     lambda: sharding.measure_laid_out_step(_auto_lm(), _llama_lm().config, layouts.Layout("none", 2, cp=2),
                                            2, 8), RuntimeError, "launch"),
    ("measure_planned_step_rise outside a launch", lambda: sharding.measure_planned_step_rise("zero3", 2, 8),
     RuntimeError, "launch"),
    ("measure_planned_step_rise seq_len=0", lambda: sharding.measure_planned_step_rise("zero3", 2, 0), ValueError,
     "seq_len"),
    ("prepare steps=0", lambda: sharding.prepare(steps=0), ValueError, "steps"),
    ("prepare batch_size='6'", lambda: sharding.prepare(batch_size="6"), ValueError, "batch_size"),
    ("course_batches steps=0", lambda: sharding.course_batches(0, 6), ValueError, "steps"),
    ("share_of_batch world_size=0", lambda: sharding.share_of_batch({}, 0, 0), ValueError, "world_size"),
    ("share_of_batch rank=2 of 2", lambda: sharding.share_of_batch({}, 2, 2), ValueError, "rank"),
    ("sharded_blocks 'x'", lambda: sharding.sharded_blocks("x"), TypeError, "model"),
    ("sharded_blocks Linear", lambda: sharding.sharded_blocks(_linear()), ValueError, "model"),
    ("train_one_process steps=0", lambda: sharding.train_one_process(steps=0), ValueError, "steps"),
    ("train_with_local_sgd 0", lambda: sharding.train_with_local_sgd(0), ValueError, "local_sgd_steps"),
    ("train_with_local_sgd batch_size=0", lambda: sharding.train_with_local_sgd(None, batch_size=0), ValueError,
     "batch_size"),
    ("train_with_strategy 'fsdp'", lambda: sharding.train_with_strategy("fsdp"), ValueError, "strategy"),
    ("train_with_strategy outside a launch", lambda: sharding.train_with_strategy("zero3"), RuntimeError, "launch"),
    # layouts (lesson 7: how processes divide a model, applied by the real runs and the planner alike)
    ("Layout strategy='zero4'", lambda: layouts.Layout("zero4", 2), ValueError, "strategy"),
    ("Layout world_size=0", lambda: layouts.Layout("ddp", 0), ValueError, "world_size"),
    ("Layout 'zero3' on one process", lambda: layouts.Layout("zero3", 1), ValueError, "world_size >= 2"),
    ("Layout 'none' on two processes", lambda: layouts.Layout("none", 2), ValueError, "strategy='none' is one process"),
    ("Layout.of sharding='zero4'", lambda: layouts.Layout.of("zero4", 2), ValueError, "sharding"),
    ("Layout.of world_size=1.5", lambda: layouts.Layout.of("zero3", 1.5), ValueError, "world_size"),
    ("apply_layout model='x'", lambda: layouts.apply_layout("x", layouts.Layout("none")), TypeError, "model"),
    ("apply_layout layout='zero3'", lambda: layouts.apply_layout(_linear(), "zero3"), TypeError, "layout"),
    ("apply_layout zero3 without blocks", lambda: layouts.apply_layout(_linear(), layouts.Layout("zero3", 2)), TypeError,
     "blocks"),
    ("apply_layout ddp with an FSDP option",
     lambda: layouts.apply_layout(_linear(), layouts.Layout("ddp", 2), reshard_after_forward=True), ValueError,
     "fsdp_options"),
    ("block_lists 'x'", lambda: layouts.block_lists("x"), TypeError, "model"),
    ("device_mesh layout='zero3'", lambda: layouts.device_mesh("zero3"), TypeError, "layout"),
    ("device_mesh outside a process group", lambda: layouts.device_mesh(layouts.Layout("zero3", 2)), RuntimeError,
     "layout"),
    ("layout_optimizer layout='zero1'", lambda: layouts.layout_optimizer("zero1", _linear().parameters(), torch.optim.SGD),
     TypeError, "layout"),
    ("layout_optimizer optimizer_class='adamw'",
     lambda: layouts.layout_optimizer(layouts.Layout("none"), _linear().parameters(), "adamw"), TypeError,
     "optimizer_class"),
    ("layout_optimizer []", lambda: layouts.layout_optimizer(layouts.Layout("none"), [], torch.optim.SGD), ValueError,
     "parameters"),
    # pipeline stages (lesson 9: Layout's pp, schedule and microbatches; a stage built the same way by runs and planner)
    ("Layout pp=0", lambda: layouts.Layout("none", 2, pp=0), ValueError, "pp"),
    ("Layout pp=3 of world_size=2", lambda: layouts.Layout("none", 2, pp=3), ValueError, "pp must divide world_size"),
    ("Layout schedule='zb'", lambda: layouts.Layout("none", 2, pp=2, schedule="zb"), ValueError, "schedule"),
    ("Layout microbatches=0", lambda: layouts.Layout("none", 2, pp=2, microbatches=0), ValueError, "microbatches"),
    ("Layout 1f1b with fewer micro-batches than stages",
     lambda: layouts.Layout("none", 4, pp=4, schedule="1f1b", microbatches=2), ValueError, "microbatches must be at least"),
    ("Layout 'zero3' on one process per stage", lambda: layouts.Layout("zero3", 2, pp=2), ValueError, "world_size // pp"),
    ("Layout 'none' on two processes per stage", lambda: layouts.Layout("none", 4, pp=2), ValueError, "data-parallel"),
    ("stage_blocks num_blocks=0", lambda: layouts.stage_blocks(0, 2), ValueError, "num_blocks"),
    ("stage_blocks pp=0", lambda: layouts.stage_blocks(4, 0), ValueError, "pp"),
    ("stage_blocks a stage without a block", lambda: layouts.stage_blocks(2, 3), ValueError, "pp"),
    ("pipeline_stage GPT-2", lambda: layouts.pipeline_stage(_tiny_lm(), layouts.Layout("none", 2, pp=2), 0), TypeError,
     "model"),
    ("pipeline_stage stage=2 of 2", lambda: layouts.pipeline_stage(_llama_lm(), layouts.Layout("none", 2, pp=2), 2),
     ValueError, "stage"),
    ("pipeline_stage layout='gpipe'", lambda: layouts.pipeline_stage(_llama_lm(), "gpipe", 0), TypeError, "layout"),
    ("pipeline_stage blocks=range(3, 9)",
     lambda: layouts.pipeline_stage(_llama_lm(), layouts.Layout("none", 2, pp=2), 0, blocks=range(3, 9)), ValueError,
     "blocks"),
    ("pipeline_stage tied embeddings",
     lambda: layouts.pipeline_stage(_llama_lm(tied=True), layouts.Layout("none", 2, pp=2), 0), ValueError, "tie"),
    ("pipeline_schedule loss_fn='mse'",
     lambda: layouts.pipeline_schedule(_linear(), layouts.Layout("none", 2, pp=2), 0, "mse", torch.zeros(1),
                                       torch.zeros(1)), TypeError, "loss_fn"),
    ("pipeline_schedule micro_batch_input=(2, 4)",
     lambda: layouts.pipeline_schedule(_linear(), layouts.Layout("none", 2, pp=2), 0, torch.nn.functional.mse_loss,
                                       (2, 4), torch.zeros(1)), TypeError, "micro_batch_input"),
    ("pipeline_schedule stage=-1",
     lambda: layouts.pipeline_schedule(_linear(), layouts.Layout("none", 2, pp=2), -1, torch.nn.functional.mse_loss,
                                       torch.zeros(1), torch.zeros(1)), ValueError, "stage"),
    ("measure_stage_memory config={}",
     lambda: pipeline.measure_stage_memory({}, layouts.Layout("none", 2, pp=2), 8, 16), TypeError, "config"),
    ("measure_stage_memory layout='1f1b'",
     lambda: pipeline.measure_stage_memory(_llama_lm().config, "1f1b", 8, 16), TypeError, "layout"),
    ("measure_stage_memory outside a launch",
     lambda: pipeline.measure_stage_memory(_llama_lm().config, layouts.Layout("none", 2, pp=2), 8, 16), RuntimeError,
     "launch"),
    ("estimate_training_memory layout='1f1b'",
     lambda: memory.estimate_training_memory(_llama_lm(), "adamw", 8, 8, layout="1f1b"), TypeError, "layout"),
    ("estimate_training_memory layout and sharding",
     lambda: memory.estimate_training_memory(_llama_lm(), "adamw", 8, 8, layout=layouts.Layout("none", 2, pp=2),
                                             sharding="zero3", world_size=2), ValueError, "layout replaces"),
    ("estimate_training_memory batch_size not divided into micro-batches",
     lambda: memory.estimate_training_memory(_llama_lm(), "adamw", 5, 8,
                                             layout=layouts.Layout("none", 2, pp=2, microbatches=2)), ValueError,
     "batch_size"),
    # layouts' tensor parallelism (lesson 9)
    ("Layout tp=3 on 4 processes", lambda: layouts.Layout("none", 4, tp=3), ValueError, "tp must divide world_size"),
    ("Layout tp=0", lambda: layouts.Layout("none", 2, tp=0), ValueError, "tp"),
    ("Layout sequence_parallel without tp", lambda: layouts.Layout("none", sequence_parallel=True), ValueError,
     "tp >= 2"),
    ("Layout sequence_parallel='yes'", lambda: layouts.Layout("none", 2, tp=2, sequence_parallel="yes"), TypeError,
     "sequence_parallel"),
    ("Layout 'ddp' with one data-parallel process", lambda: layouts.Layout("ddp", 2, tp=2), ValueError,
     "world_size // tp"),
    ("apply_layout plan without tp", lambda: layouts.apply_layout(_linear(), layouts.Layout("none"), plan={}),
     ValueError, "plan"),
    ("apply_layout 'ddp' with tp", lambda: layouts.apply_layout(_linear(), layouts.Layout("ddp", 4, tp=2)), ValueError,
     "tp=2"),
    ("tensor_parallel_plan model='x'", lambda: layouts.tensor_parallel_plan("x"), TypeError, "model"),
    ("tensor_parallel_plan sequence_parallel=1", lambda: layouts.tensor_parallel_plan(_linear(), 1), TypeError,
     "sequence_parallel"),
    ("tensor_parallel_plan Linear", lambda: layouts.tensor_parallel_plan(_linear()), ValueError, "model: Linear"),
    ("estimate_training_memory layout='tp2'",
     lambda: memory.estimate_training_memory(_tiny_lm(), "adamw", 1, 8, layout="tp2"), TypeError, "layout"),
    ("estimate_training_memory tp layout and world_size",
     lambda: memory.estimate_training_memory(_tiny_lm(), "adamw", 1, 8, world_size=2,
                                             layout=layouts.Layout("none", 2, tp=2)), ValueError, "layout"),
    ("estimate_training_memory layout rank=2",
     lambda: memory.estimate_training_memory(_tiny_lm(), "adamw", 1, 8, rank=2,
                                             layout=layouts.Layout("none", 2, tp=2)), ValueError, "rank"),
    ("tensor_parallel_probe tp=1",
     lambda: per_process.tensor_parallel_probe(_tiny_lm(), memory.TrainingSetup("adamw", 1, 8), None,
                                               layouts.Layout("none")), ValueError, "tp"),
    # context and expert parallelism in a Layout (lesson 9)
    ("Layout cp=3 on two processes", lambda: layouts.Layout("none", 2, cp=3), ValueError, "cp must divide"),
    ("Layout cp=0", lambda: layouts.Layout("none", 2, cp=0), ValueError, "cp"),
    ("Layout ep=3 on two processes", lambda: layouts.Layout("ddp", 2, ep=3), ValueError, "ep must divide"),
    ("Layout 'ddp' with cp over every process", lambda: layouts.Layout("ddp", 2, cp=2), ValueError,
     "strategy 'none' for cp=2 alone"),
    ("Layout 'none' with cp and two data-parallel processes", lambda: layouts.Layout("none", 4, cp=2), ValueError,
     "2 data-parallel copies"),
    ("apply_layout cp outside a process group", lambda: layouts.apply_layout(_tiny_lm(), layouts.Layout("none", 2, cp=2)),
     RuntimeError, "process group of 2"),
    ("apply_layout cp with data parallelism", lambda: layouts.apply_layout(_tiny_lm(), layouts.Layout("ddp", 4, cp=2)),
     NotImplementedError, "cp=2, dp=2"),
    ("apply_layout ep=2 over cp=4",
     lambda: layouts.apply_layout(_tiny_lm(), layouts.Layout("none", 4, cp=4, ep=2)), NotImplementedError, "ep == cp"),
    ("apply_layout ep=2", lambda: layouts.apply_layout(_linear(), layouts.Layout("ddp", 2, ep=2)), NotImplementedError,
     "ep=2"),
    ("context_batch batch of a classifier",
     lambda: layouts.context_batch({"input_ids": torch.ones(1, 4, dtype=torch.long), "labels": torch.ones(1)},
                                   layouts.Layout("none", 2, cp=2), 0), ValueError, "one shape (batch, seq)"),
    ("context_batch seq=5 over cp=2",
     lambda: layouts.context_batch({"input_ids": torch.ones(1, 5, dtype=torch.long), "labels": torch.ones(1, 5)},
                                   layouts.Layout("none", 2, cp=2), 0), ValueError, "divisible by cp=2"),
    ("context_batch no labels", lambda: layouts.context_batch({"input_ids": torch.ones(1, 4)},
                                                              layouts.Layout("none", 2, cp=2), 0), ValueError, "batch"),
    ("context_batch rank=2", lambda: layouts.context_batch({}, layouts.Layout("none", 2, cp=2), 2), ValueError, "rank"),
    ("context_batch layout='cp'", lambda: layouts.context_batch({}, "cp", 0), TypeError, "layout"),
    # sharding_plans (lesson 7)
    ("build_model typo", lambda: sharding_plans.build_model("Llama-2-7B"), ValueError, "name"),
    ("load_cached_plans missing file", lambda: sharding_plans.load_cached_plans("/no/such/plans.json"), FileNotFoundError,
     "path"),
    ("load_cached_plans path=5", lambda: sharding_plans.load_cached_plans(5), TypeError, "path"),
    ("replan world_size=0", lambda: sharding_plans.replan("Llama-2-7B-shaped", 0, "zero3"), ValueError, "world_size"),
    ("replan sharding='zero4'", lambda: sharding_plans.replan("Llama-2-7B-shaped", 8, "zero4"), ValueError, "sharding"),
    ("rule_describes {}", lambda: sharding_plans.rule_describes({}), ValueError, "plan"),
    ("rule_of_thumb world_size=0", lambda: sharding_plans.rule_of_thumb(10**9, 0), ValueError, "world_size"),
    ("rule_of_thumb world_size=-1", lambda: sharding_plans.rule_of_thumb(10**9, -1), ValueError, "world_size"),
    ("rule_of_thumb parameters=-5", lambda: sharding_plans.rule_of_thumb(-5, 8), ValueError, "parameters"),
    ("rule_of_thumb parameters=1.5e9", lambda: sharding_plans.rule_of_thumb(1.5e9, 8), ValueError, "parameters"),
    ("where_it_fits model typo", lambda: sharding_plans.where_it_fits([_cached_plan()], "n"), ValueError, "model"),
    ("where_it_fits plans=dict", lambda: sharding_plans.where_it_fits({"m": 1}, "m"), TypeError, "plans"),
    # plots of lessons 4, 7 and 8
    ("plot_timings {}", lambda: speed_plots.plot_timings({}, "t"), ValueError, "timings"),
    ("plot_timings scale=0", lambda: speed_plots.plot_timings({"a": _timing(0.1)}, "t", scale=0), ValueError, "scale"),
    ("timeline_spans 5", lambda: speed_plots.timeline_spans(5, ("step",)), TypeError, "profile"),
    ("plot_timeline []", lambda: speed_plots.plot_timeline([], "t"), ValueError, "spans"),
    ("plot_speed_against_memory {}", lambda: speed_plots.plot_speed_against_memory({}, "t"), ValueError, "points"),
    ("plot_speed_against_memory a float for the Timing",
     lambda: speed_plots.plot_speed_against_memory({"a": (0.1, 100.0, 10)}, "t"), ValueError, "points"),
    ("plot_held_per_process {}", lambda: sharding_plots.plot_held_per_process({}), TypeError, "runs"),
    ("plot_memory_per_gpu []", lambda: sharding_plots.plot_memory_per_gpu([], {}, bool), TypeError, "plans"),
    ("plot_memory_per_gpu a plan without peak",
     lambda: sharding_plots.plot_memory_per_gpu([{"parameters": 1, "world_size": 1, "sharding": "none"}], {}, bool),
     ValueError, "plans"),
    ("plot_step_timeline 5", lambda: step_timeline_plots.plot_step_timeline(5), TypeError, "timeline"),
    ("describe_depth 5", lambda: step_timeline_plots.describe_depth(5), TypeError, "timeline"),
    ("StepTimelineExplorer model_names=[]",
     lambda: step_timeline_plots.StepTimelineExplorer([], print, {"adamw": ()}, {"fp32": ()}), ValueError, "model_names"),
    ("step_timeline_explorer model_names=[]",
     lambda: step_timeline_plots.step_timeline_explorer([], print, {"adamw": ()}, {"fp32": ()}), ValueError, "model_names"),
    ("TrainingMemoryExplorer estimate=5",
     lambda: explorer_plots.TrainingMemoryExplorer(["gpt2"], 5, {"AdamW": ("adamw", {})}, {"fp32": ("fp32", "no")}),
     TypeError, "estimate"),
    ("MovingAverageExplorer beta2=1", lambda: adamw_plots.MovingAverageExplorer([1.0, 2.0], beta2=1.0), ValueError, "beta2"),
    ("plot_scores_over_seeds {}", lambda: lever_plots.plot_scores_over_seeds({}), ValueError, "scores"),
    ("plot_scores_over_seeds [nan]", lambda: lever_plots.plot_scores_over_seeds({"a": [NAN]}), ValueError, "scores"),
    ("plot_learning_rate_sweep {}", lambda: parallel_plots.plot_learning_rate_sweep({}), ValueError, "losses"),
    # the step timeline (lesson 4)
    ("plan_step_timeline batch_size=0",
     lambda: memory.plan_step_timeline(_tiny_lm(), "adamw", 0, 8), ValueError, "batch_size"),
    ("plan_step_timeline model='gpt2'", lambda: memory.plan_step_timeline("gpt2", "adamw", 1, 8), TypeError, "model"),
    ("plan_step_timeline whole='yes'",
     lambda: memory.plan_step_timeline(_tiny_lm(), "adamw", 1, 8, whole="yes"), TypeError, "whole"),
    ("plan_timeline setup=dict", lambda: memory.plan_timeline(_tiny_lm(), {"optimizer": "adamw"}), TypeError, "setup"),
    # memory records and instruments
    ("measure_allocator_rise model='x'",
     lambda: memory.measure_allocator_rise("x", torch.optim.SGD(_linear().parameters()), {}), TypeError, "model"),
    ("measure_allocator_rise batch=list",
     lambda: memory.measure_allocator_rise(_linear(), torch.optim.SGD(_linear().parameters()), [1]), TypeError, "batch"),
    ("qlora_model config='llama'", lambda: memory.qlora_model("llama"), TypeError, "config"),
    ("quant_state_bytes 'x'", lambda: memory.quant_state_bytes("x"), TypeError, "model"),
    ("measure_fsdp_step model='x'",
     lambda: memory.measure_fsdp_step("x", None, {}, memory.TrainingSetup("adamw", 1, 8)), TypeError, "model"),
    ("fsdp_step model='x'", lambda: memory.fsdp_step("x", None, {}, memory.TrainingSetup("adamw", 1, 8), None), TypeError,
     "model"),
    ("fsdp_tracker model='x'", lambda: memory.fsdp_tracker("x", None), TypeError, "model"),
    ("fsdp_snapshot kind='now'", lambda: memory.fsdp_snapshot(None, "now"), ValueError, "kind"),
    ("fsdp_memory []", lambda: memory.fsdp_memory([]), TypeError, "seen"),
    ("zero1_optimizer []", lambda: memory.zero1_optimizer([], "adamw"), ValueError, "parameters"),
    ("zero1_optimizer name='AdamW'", lambda: memory.zero1_optimizer(list(_linear().parameters()), "AdamW"), ValueError,
     "optimizer"),
    ("measure_zero1_step model='x'",
     lambda: memory.measure_zero1_step("x", None, {}, memory.TrainingSetup("adamw", 1, 8)), TypeError, "model"),
    ("fsdp_probe world_size=0",
     lambda: per_process.fsdp_probe(_tiny_lm(), memory.TrainingSetup("adamw", 1, 8), None, 0, "zero3"), ValueError,
     "world_size"),
    ("fsdp_probe strategy='ddp'",
     lambda: per_process.fsdp_probe(_tiny_lm(), memory.TrainingSetup("adamw", 1, 8), None, 2, "ddp"), ValueError,
     "strategy"),
    # parallel (lesson 6), continued
    ("learning_rate_sweep batch_sizes=[]", lambda: parallel.learning_rate_sweep([], [1e-3], [0]), ValueError, "batch_sizes"),
    ("learning_rate_sweep lr=-1", lambda: parallel.learning_rate_sweep([8], [-1.0], [0]), ValueError, "learning_rates"),
    ("train_small_classifier batch_size=0", lambda: parallel.train_small_classifier(0, 1e-3, 0), ValueError, "batch_size"),
    ("train_small_classifier lr=nan", lambda: parallel.train_small_classifier(8, NAN, 0), ValueError, "lr"),
    ("update_after_accumulation accumulation_steps=0",
     lambda: parallel.update_after_accumulation(torch.optim.SGD, 0.1, [], 0, True), ValueError, "accumulation_steps"),
    ("update_after_accumulation divide_loss='yes'",
     lambda: parallel.update_after_accumulation(torch.optim.SGD, 0.1, [], 2, "yes"), TypeError, "divide_loss"),
    # lessons 1, 2, 4, 5: models, loops, variants, GPUs
    ("build_for_training train='everything'",
     lambda: models.build_for_training(_auto_lm(), _tiny_config(), train="everything"), ValueError, "train"),
    ("build_for_training dtype='bf16'",
     lambda: models.build_for_training(_auto_lm(), _tiny_config(), dtype="bf16"), TypeError, "dtype"),
    ("make_variant typo", lambda: fine_tuning_variants.make_variant("lora ", _linear()), ValueError, "name"),
    ("make_variant model='x'", lambda: fine_tuning_variants.make_variant("full fine-tuning", "x"), TypeError, "model"),
    ("smallest_card_holding -1", lambda: gpus.smallest_card_holding(-1), ValueError, "num_bytes"),
    ("smallest_card_holding nan", lambda: gpus.smallest_card_holding(NAN), ValueError, "num_bytes"),
    ("smallest_card_holding card typo", lambda: gpus.smallest_card_holding(10, ("A100",)), ValueError, "cards"),
    # exercises: the helpers a lesson calls (a learner's answer is judged, never refused: tests/exercises)
    ("fresh_training_objects seed=-1", lambda: lesson1_exercises.fresh_training_objects(-1), ValueError, "seed"),
    ("q2_step batch_size=0", lambda: lesson4_exercises.q2_step(0), ValueError, "batch_size"),
    ("describe_accelerator None", lambda: lesson6_exercises.describe_accelerator(None, []), TypeError, "accelerator"),
    ("zero1_assignment 1", lambda: lesson7_exercises.zero1_assignment(1), ValueError, "num_processes"),
    ("show 5", lambda: feedback.show(5), TypeError, "feedback"),
    ("incorrect 5", lambda: feedback.incorrect(5), TypeError, "reason"),
    # validation: each check refuses its bad value by the name it is given
    ("check_positive_int 0", lambda: validation.check_positive_int(0, "batch_size"), ValueError, "batch_size"),
    ("check_non_negative_int True", lambda: validation.check_non_negative_int(True, "seed"), ValueError, "seed"),
    ("check_int_in_range 9", lambda: validation.check_int_in_range(9, "port", 1, 8), ValueError, "port"),
    ("check_bool 'yes'", lambda: validation.check_bool("yes", "shuffle"), TypeError, "shuffle"),
    ("check_positive_number inf", lambda: validation.check_positive_number(INF, "lr"), ValueError, "lr"),
    ("check_non_negative_number nan", lambda: validation.check_non_negative_number(NAN, "budget"), ValueError, "budget"),
    ("check_fraction 1", lambda: validation.check_fraction(1, "beta1"), ValueError, "beta1"),
    ("check_finite_numbers []", lambda: validation.check_finite_numbers([], "seconds"), ValueError, "seconds"),
    ("check_finite_tensor nan", lambda: validation.check_finite_tensor(torch.tensor([NAN]), "grad"), ValueError, "grad"),
    ("check_choice typo", lambda: validation.check_choice("adamw ", "optimizer", ("adamw",)), ValueError, "optimizer"),
    ("check_instance str", lambda: validation.check_instance("x", "model", torch.nn.Module, "a module"), TypeError, "model"),
    ("check_python_function print", lambda: validation.check_python_function(print, "function"), TypeError, "function"),
    ("check_accelerator None", lambda: validation.check_accelerator(None), TypeError, "accelerator"),
    ("check_existing_directory missing", lambda: validation.check_existing_directory("/no/such", "data_dir"),
     FileNotFoundError, "data_dir"),
    ("check_in_launch outside a launch", lambda: validation.check_in_launch("measure_planned_step"), RuntimeError,
     "measure_planned_step"),
    ("check_in_process_group outside a group", lambda: validation.check_in_process_group("train_steps"), RuntimeError,
     "train_steps runs in a launched process, inside sharding.gloo_group()"),
    ("check_token_ids token 1.7", lambda: validation.check_token_ids([[1.7]], "sequences"), ValueError, "sequences[0]"),
]


ROWS += [
    # lesson 9: tensor, sequence and pipeline parallelism, meshes
    ("ActivationMeter model='mlp'", lambda: saved_activations.ActivationMeter("mlp"), TypeError, "model"),
    ("tiny_block heads=3", lambda: tensor_parallel.tiny_block(dim=64, heads=3), ValueError, "heads"),
    ("tiny_block dim=0", lambda: tensor_parallel.tiny_block(dim=0), ValueError, "dim"),
    ("copy_to_tensor_parallel [1.0]", lambda: tensor_parallel.copy_to_tensor_parallel([1.0]), TypeError, "x"),
    ("reduce_from_tensor_parallel 1.0", lambda: tensor_parallel.reduce_from_tensor_parallel(1.0), TypeError, "partial"),
    ("split_columns rank=2 of 2", lambda: tensor_parallel.split_columns(torch.nn.Linear(4, 4), 2, 2), ValueError, "rank"),
    ("split_columns 5 outputs over 2", lambda: tensor_parallel.split_columns(torch.nn.Linear(4, 5), 0, 2), ValueError,
     "world_size"),
    ("split_columns linear=Conv1d", lambda: tensor_parallel.split_columns(torch.nn.Conv1d(1, 1, 1), 0, 1), TypeError,
     "linear"),
    ("split_rows world_size=0", lambda: tensor_parallel.split_rows(torch.nn.Linear(4, 4), 0, 0), ValueError, "world_size"),
    ("tensor_parallel_block block=Linear", lambda: tensor_parallel.tensor_parallel_block(_linear(), 0, 2), TypeError,
     "block"),
    ("tensor_parallel_block 4 heads over 3",
     lambda: tensor_parallel.tensor_parallel_block(tensor_parallel.tiny_block(), 0, 3), ValueError, "world_size"),
    ("block_plan sequence_parallel='yes'", lambda: tensor_parallel.block_plan("yes"), TypeError, "sequence_parallel"),
    ("distilbert_plan Linear", lambda: tensor_parallel.distilbert_plan(_linear()), ValueError, "model"),
    ("run_split runs='distilbert' (a string)", lambda: tensor_parallel.run_split("distilbert"), ValueError, "runs"),
    ("run_split runs=['tp']", lambda: tensor_parallel.run_split(["tp"]), ValueError, "runs"),
    ("run_split outside a launch", lambda: tensor_parallel.run_split(), RuntimeError, "launch"),
    ("layer_stack depth=0", lambda: pipeline.layer_stack(depth=0), ValueError, "depth"),
    ("stage_of 3 stages of 8 layers", lambda: pipeline.stage_of(pipeline.layer_stack(8, 4), 0, 3), ValueError,
     "num_stages"),
    ("stage_of stage=2 of 2", lambda: pipeline.stage_of(pipeline.layer_stack(8, 4), 2, 2), ValueError, "stage"),
    ("stage_of model=Linear", lambda: pipeline.stage_of(_linear(), 0, 1), TypeError, "model"),
    ("gpipe num_microbatches=0", lambda: pipeline.gpipe(0, 2, 0), ValueError, "num_microbatches"),
    ("one_f_one_b stage=-1", lambda: pipeline.one_f_one_b(-1, 2, 4), ValueError, "stage"),
    ("bubble_formula num_stages=0", lambda: pipeline.bubble_formula(0, 4), ValueError, "num_stages"),
    ("bubble_fraction []", lambda: pipeline.bubble_fraction([]), ValueError, "spans"),
    ("bubble_fraction end before start", lambda: pipeline.bubble_fraction([[(2.0, 1.0)]]), ValueError, "spans"),
    ("bubble_fraction spans of strings", lambda: pipeline.bubble_fraction([["ab"]]), ValueError, "spans"),
    ("replay_schedule durations of another length",
     lambda: pipeline.replay_schedule([pipeline.gpipe(0, 1, 2)], [[1.0]]), ValueError, "durations"),
    ("run_pipeline schedule 'PipeDream'", lambda: pipeline.run_pipeline([("PipeDream", 4)]), ValueError, "schedule"),
    ("run_pipeline configs=('GPipe', 4)", lambda: pipeline.run_pipeline(("GPipe", 4)), ValueError, "configs"),
    ("run_pipeline outside a launch", lambda: pipeline.run_pipeline(), RuntimeError, "launch"),
    ("run_torch_schedule 'ScheduleZB'", lambda: pipeline.run_torch_schedule(["ScheduleZB"]), ValueError, "schedules"),
    ("run_torch_schedule outside a launch", lambda: pipeline.run_torch_schedule(), RuntimeError, "launch"),
    ("run_stage module=5", lambda: pipeline.run_stage(5, 0, 2, [], [torch.zeros(1)], [], (1,)), TypeError, "module"),
    ("lay_out_on_mesh layout='3-D'", lambda: meshes.lay_out_on_mesh(torch.nn.Sequential(), None, "3-D"), ValueError, "layout"),
    ("lay_out_on_mesh model=Linear", lambda: meshes.lay_out_on_mesh(_linear(), None, "HSDP"), TypeError, "model"),
    ("plot_pipeline_timeline {}", lambda: pipeline_plots.plot_pipeline_timeline({}), TypeError, "timelines"),
    ("two_blocks seed='0'", lambda: meshes.two_blocks("0"), TypeError, "seed"),
    ("run_mesh layouts=['3-D']", lambda: meshes.run_mesh(["3-D"]), ValueError, "layouts"),
    ("run_mesh apply=5", lambda: meshes.run_mesh(apply=5), TypeError, "apply"),
    ("run_mesh outside a launch", lambda: meshes.run_mesh(), RuntimeError, "launch"),
    ("accelerate_parallelism_config tp_size=0", lambda: meshes.accelerate_parallelism_config(2, 0), ValueError,
     "tp_size"),
    ("accelerate_parallelism_config outside a launch", lambda: meshes.accelerate_parallelism_config(), RuntimeError,
     "launch"),
]


ROWS += [
    # cpu_features and loopback (issue 31: every CPU branch, launches on loopback)
    ("cpu_flags cpuinfo=5", lambda: cpu_features.cpu_flags(5), TypeError, "cpuinfo"),
    ("has_bf16_matrix_units flags=5", lambda: cpu_features.has_bf16_matrix_units(5), TypeError, "flags"),
    ("has_bf16_matrix_units flags='avx512_bf16' (a bare string)",
     lambda: cpu_features.has_bf16_matrix_units("avx512_bf16"), TypeError, "flags"),
    ("listening_socket port=-1", lambda: loopback.listening_socket(-1), ValueError, "port"),
    ("listening_socket port='x'", lambda: loopback.listening_socket("x"), ValueError, "port"),
    ("loopback_store listener=None", lambda: loopback.loopback_store(None, 2), TypeError, "listener"),
    ("LoopbackTCPStore port=-5", lambda: loopback.LoopbackTCPStore("127.0.0.1", -5, 1, True), ValueError, "port"),
    # lesson 7's wire bytes, drift, searched fewest processes, exercise 2's judge
    ("ring_wire_bytes world_size=0", lambda: sharding.ring_wire_bytes({"all_reduce": 10}, 0), ValueError, "world_size"),
    ("ring_wire_bytes counted=[1]", lambda: sharding.ring_wire_bytes([1], 2), ValueError, "counted"),
    ("sharding.drift final=5", lambda: sharding.drift(5, {"w": torch.ones(1)}, {"w": torch.zeros(1)}), TypeError, "final"),
    ("sharding.drift empty dicts", lambda: sharding.drift({}, {}, {}), ValueError, "same parameters"),
    ("sharding.drift reference == start",
     lambda: sharding.drift({"w": torch.ones(1)}, {"w": torch.zeros(1)}, {"w": torch.zeros(1)}), ValueError, "reference"),
    ("fewest_processes name typo", lambda: sharding_plans.fewest_processes("Llama-70B", 80 * 2**30), ValueError, "name"),
    ("fewest_processes card_bytes=0", lambda: sharding_plans.fewest_processes("Llama-2-7B-shaped", 0), ValueError,
     "card_bytes"),
    ("blocks_without_a_unit model=5", lambda: lesson7_exercises.blocks_without_a_unit([""], 5), TypeError, "model"),
    ("blocks_without_a_unit unit_names=5",
     lambda: lesson7_exercises.blocks_without_a_unit(5, torch.nn.Linear(1, 1)), TypeError, "unit_names"),
]


from course_utils import experts, ring_attention, saved_activations
from course_utils.plots import experts as expert_plots
from course_utils.plots import ring_attention as ring_plots

_QKV = (torch.ones(2, 8, 4), torch.ones(2, 8, 4), torch.ones(2, 8, 4))


def _causal_module():
    module = torch.nn.Linear(2, 2)
    module.is_causal = True  # as a transformers attention module says it
    return module


def _under_autocast(call):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return call()

ROWS += [
    # lesson 9's context parallelism: ring attention
    ("attention q=5", lambda: ring_attention.attention(5, *_QKV[1:]), TypeError, "q"),
    ("attention causal='yes'", lambda: ring_attention.attention(*_QKV, causal="yes"), TypeError, "causal"),
    ("attention k of another shape", lambda: ring_attention.attention(_QKV[0], torch.ones(2, 6, 4), _QKV[2]),
     ValueError, "one shape"),
    ("block_attention v=None", lambda: ring_attention.block_attention(_QKV[0], _QKV[1], None), TypeError, "v"),
    ("block_attention mask of floats", lambda: ring_attention.block_attention(*_QKV, torch.ones(8, 8)), ValueError,
     "mask"),
    ("block_attention head_dim differs", lambda: ring_attention.block_attention(torch.ones(2, 8, 3), *_QKV[1:]),
     ValueError, "(..., queries, d)"),
    ("ring_attention merge=5", lambda: ring_attention.ring_attention(*_QKV, merge=5), TypeError, "merge"),
    ("ring_attention trace=()", lambda: ring_attention.ring_attention(*_QKV, trace=()), TypeError, "trace"),
    ("ring_attention int tensors", lambda: ring_attention.ring_attention(*(t.long() for t in _QKV)), ValueError,
     "floating-point"),
    ("attention_memory function=5", lambda: ring_attention.attention_memory(5, *_QKV), TypeError, "function"),
    ("sequence_chunk world_size=3", lambda: ring_attention.sequence_chunk(_QKV[0], 0, 3), ValueError, "world_size"),
    ("sequence_chunk rank=2", lambda: ring_attention.sequence_chunk(_QKV[0], 2, 2), ValueError, "rank"),
    ("random_qkv seq_len=0", lambda: ring_attention.random_qkv(0, 0), ValueError, "seq_len"),
    ("random_qkv seed=-1", lambda: ring_attention.random_qkv(-1, 8), ValueError, "seed"),
    ("context_parallel_run outside a launch", lambda: ring_attention.context_parallel_run(), RuntimeError,
     "context_parallel_run"),
    ("use_ring_attention model=Linear", lambda: ring_attention.use_ring_attention(_linear()), TypeError, "model"),
    ("ring_attention_forward with a padding mask",
     lambda: ring_attention.ring_attention_forward(_causal_module(), _QKV[0][None], _QKV[1][None], _QKV[2][None],
                                                   torch.ones(1, 8)), ValueError, "attention_mask"),
    ("ring_attention_forward dropout=0.1",
     lambda: ring_attention.ring_attention_forward(_causal_module(), _QKV[0][None], _QKV[1][None], _QKV[2][None], None,
                                                   dropout=0.1), ValueError, "dropout"),
    ("ring_attention_forward scaling=1",
     lambda: ring_attention.ring_attention_forward(_causal_module(), _QKV[0][None], _QKV[1][None], _QKV[2][None], None,
                                                   scaling=1.0), ValueError, "scaling"),
    ("ring_attention_forward not causal",
     lambda: ring_attention.ring_attention_forward(_linear(), _QKV[0][None], _QKV[1][None], _QKV[2][None], None),
     ValueError, "causal"),
    ("ring_attention_forward under autocast", lambda: _under_autocast(
        lambda: ring_attention.ring_attention_forward(_causal_module(), _QKV[0][None], _QKV[1][None], _QKV[2][None],
                                                      None)), ValueError, "mixed_precision"),
    ("plot_attention_memory series of the wrong length",
     lambda: ring_plots.plot_attention_memory([512, 1024], {"ring": ([1], [2])}), ValueError, "series"),
    ("plot_attention_memory seq_lens=[]", lambda: ring_plots.plot_attention_memory([], {}), TypeError, "seq_lens"),
    # lesson 9's expert parallelism
    ("make_moe num_experts=0", lambda: experts.make_moe(0), ValueError, "num_experts"),
    ("make_moe skew=-1", lambda: experts.make_moe(2, skew=-1.0), ValueError, "skew"),
    ("make_moe seed=1.5", lambda: experts.make_moe(2, seed=1.5), ValueError, "seed"),
    ("token_batch num_tokens=0", lambda: experts.token_batch(0, 0), ValueError, "num_tokens"),
    ("route router=5", lambda: experts.route(torch.ones(3, experts.DIM), 5), TypeError, "router"),
    ("route x of the wrong width", lambda: experts.route(torch.ones(3, 7), experts.make_moe(2).router), ValueError,
     "x must be tokens"),
    ("moe_one_process moe=5", lambda: experts.moe_one_process(torch.ones(3, experts.DIM), 5), TypeError, "moe"),
    ("load_balancing_loss expert_ids of floats",
     lambda: experts.load_balancing_loss(torch.ones(3, 2), torch.ones(3)), ValueError, "expert_ids"),
    ("load_balancing_loss probabilities=5", lambda: experts.load_balancing_loss(5, torch.ones(3)), TypeError,
     "probabilities"),
    ("expert_parallel_run outside a launch", lambda: experts.expert_parallel_run(), RuntimeError,
     "expert_parallel_run"),
    # what autograd keeps (lesson 9; the same file as on branch lesson9)
    ("ActivationMeter model a string", lambda: saved_activations.ActivationMeter("a model"), TypeError, "model"),
    ("plot_tokens_per_expert received=[]", lambda: expert_plots.plot_tokens_per_expert([]), ValueError, "received"),
]

def _workload():
    return step_time.Workload(100, 100, 80, 0, 1, 8, 2, 3, 4, 4, 4)


def _cluster():
    device = step_time.Device("test", "fp32", 1e12, "given", 0.5, "given", 1e11, "given")
    return step_time.Cluster(device, 2, 1, step_time.Link("test", 1e9, 0.0, "given"), None, False)


ROWS += [
    # issue 35: the cards' table, the step-time model and its checks, the planner command
    ("card 'V100'", lambda: hardware.card("V100"), ValueError, "name"),
    ("peak_flops precision='int8'", lambda: hardware.peak_flops("H100 SXM", "int8"), ValueError, "precision"),
    ("peak_flops fp8 on an A100", lambda: hardware.peak_flops("A100 80GB", "fp8"), ValueError, "precision"),
    ("achievable_fraction name=5", lambda: hardware.achievable_fraction(5, "bf16"), ValueError, "name"),
    ("Link bandwidth=0", lambda: step_time.Link("x", 0, 0.0, "s"), ValueError, "bandwidth"),
    ("Link latency=-1", lambda: step_time.Link("x", 1e9, -1, "s"), ValueError, "latency"),
    ("Device fraction=1.5", lambda: step_time.Device("x", "fp32", 1e12, "s", 1.5, "s", 1e11, "s"), ValueError,
     "fraction"),
    ("Device peak=nan", lambda: step_time.Device("x", "fp32", NAN, "s", 0.5, "s", 1e11, "s"), ValueError, "peak"),
    ("Cluster nodes=2 without inter",
     lambda: step_time.Cluster(_cluster().device, 2, 2, _cluster().intra, None, True), ValueError, "inter"),
    ("gpu_device card typo", lambda: step_time.gpu_device("H100", "bf16"), ValueError, "name"),
    ("gpu_cluster cards_per_node=0", lambda: step_time.gpu_cluster("L4", 0), ValueError, "cards_per_node"),
    ("gpu_cluster network typo", lambda: step_time.gpu_cluster("L4", 2, 2, "bf16", "Ethernet"), ValueError, "network"),
    ("workload_of model=5", lambda: step_time.workload_of(5), TypeError, "model"),
    ("workload_of gather_bytes=0", lambda: step_time.workload_of(_tiny_lm(), gather_bytes=0), ValueError,
     "gather_bytes"),
    ("collectives_of layout='zero4'", lambda: step_time.collectives_of(_workload(), "zero4", 2), ValueError, "layout"),
    ("collectives_of workload=5", lambda: step_time.collectives_of(5, "ddp", 2), TypeError, "workload"),
    ("predict_step seq_len=0", lambda: step_time.predict_step(_workload(), _cluster(), "ddp", 1, 0), ValueError,
     "seq_len"),
    ("predict_step layout='none' on 2", lambda: step_time.predict_step(_workload(), _cluster(), "none", 1, 8),
     ValueError, "layout"),
    ("FrameworkCosts passes=list", lambda: step_time.FrameworkCosts([], {}, 1e9, "s"), ValueError, "passes"),
    ("FrameworkCosts update layout", lambda: step_time.FrameworkCosts({}, {"tp": 1.0}, 1e9, "s"), ValueError, "update"),
    ("FrameworkCosts copy_bandwidth=0", lambda: step_time.FrameworkCosts({}, {}, 0, "s"), ValueError, "copy_bandwidth"),
    ("copy_bytes workload=1", lambda: step_time.copy_bytes(1, "ddp", 2), TypeError, "workload"),
    ("copy_bytes layout='tp'", lambda: step_time.copy_bytes(_workload(), "tp", 2), ValueError, "layout"),
    ("framework_seconds cluster=1", lambda: step_time.framework_seconds(_workload(), 1, "ddp"), TypeError, "cluster"),
    ("model_parallel_collectives tp=0",
     lambda: step_time.model_parallel_collectives(_workload(), 0, 1, 8, 2), ValueError, "tp"),
    ("model_parallel_collectives tokens=0",
     lambda: step_time.model_parallel_collectives(_workload(), 2, 1, 0, 2), ValueError, "tokens"),
    ("Link by_collective key", lambda: step_time.Link("l", 1e9, 0.0, "s", {"send": 1e9}), ValueError, "by_collective"),
    ("Link.bandwidth_of 'x'", lambda: step_time.Link("l", 1e9, 0.0, "s").bandwidth_of("x"), ValueError, "collective"),
    ("toy_workload world_size=0", lambda: step_time_checks.toy_workload(0), ValueError, "world_size"),
    ("framework_costs measured={}", lambda: step_time_checks.framework_costs({}, None), ValueError, "measured"),
    ("predict_step tp=0", lambda: step_time.predict_step(_workload(), _cluster(), "ddp", 1, 8, tp=0), ValueError, "tp"),
    ("predict_step tp=3 on 2", lambda: step_time.predict_step(_workload(), _cluster(), "none", 1, 8, tp=3), ValueError,
     "tp x pp"),
    ("layout_fields 5", lambda: plan.layout_fields(5), TypeError, "layout"),
    ("layout_fields 'zero1+tp'", lambda: plan.layout_fields("zero1+tp"), ValueError, "layout"),
    ("layout_fields 'zero1+tp0'", lambda: plan.layout_fields("zero1+tp0"), ValueError, "layout"),
    ("parse_layout 5", lambda: plan.parse_layout(5, 8), TypeError, "layout"),
    ("parse_layout 'zero1+tp'", lambda: plan.parse_layout("zero1+tp", 8), ValueError, "layout"),
    ("parse_layout world_size=0", lambda: plan.parse_layout("zero3", 0), ValueError, "world_size"),
    ("parse_layout 'zero3+tp3' on 8", lambda: plan.parse_layout("zero3+tp3", 8), ValueError, "layout"),
    ("searched_layouts world_size=0", lambda: plan.searched_layouts(0, 8), ValueError, "world_size"),
    ("searched_layouts cards_per_node='8'", lambda: plan.searched_layouts(8, "8"), ValueError, "cards_per_node"),
    ("searched_layouts batch_size=0", lambda: plan.searched_layouts(8, 8, 0), ValueError, "batch_size"),
    ("predict_step cluster=5", lambda: step_time.predict_step(_workload(), 5, "ddp", 1, 8), TypeError, "cluster"),
    ("measure_cpu_steps outside a launch", lambda: step_time_checks.measure_cpu_steps(), RuntimeError,
     "measure_cpu_steps"),
    ("slowest_process measured=[]", lambda: step_time_checks.slowest_process([]), ValueError, "measured"),
    ("cpu_cluster measured={}", lambda: step_time_checks.cpu_cluster({}), ValueError, "measured"),
    ("compare_with_cpu_steps measured=5", lambda: step_time_checks.compare_with_cpu_steps(5), ValueError, "measured"),
    ("compare_with_published runs=[5]", lambda: step_time_checks.compare_with_published([5]), TypeError, "runs"),
    ("describe_published rows=5", lambda: step_time_checks.describe_published(5), TypeError, "rows"),
    ("load_model model='no-such-model'", lambda: plan.load_model("no-such-model"), ValueError, "model"),
    ("load_model precision='fp16'", lambda: plan.load_model("course DistilBERT", "fp16"), ValueError, "precision"),
    ("load_model lora_rank=0", lambda: plan.load_model("course DistilBERT", lora_rank=0), ValueError, "lora_rank"),
    ("plan_layouts card='V100'", lambda: plan.plan_layouts("course DistilBERT", card="V100"), ValueError, "card"),
    ("plan_layouts layout='zero3' on one card",
     lambda: plan.plan_layouts("course DistilBERT", card="L4", layout="zero3", seq_len=16), ValueError, "layout"),
    ("plan_layouts batch_size=0", lambda: plan.plan_layouts("course DistilBERT", card="L4", batch_size=0), ValueError,
     "batch_size"),
    ("format_table rows=5", lambda: plan.format_table(5), TypeError, "rows"),
    ("format_table tokens=-1", lambda: plan.format_table([], -1), ValueError, "tokens"),
    ("days_for tokens=0", lambda: plan.days_for(0, {}), ValueError, "tokens"),
    ("days_for row={}", lambda: plan.days_for(1e9, {}), TypeError, "row"),
    # Lesson 10: the choice, the files a learner launches, the script.
    ("recommend rows=[]", lambda: layout_choice.recommend([], 10**9), TypeError, "rows"),
    ("recommend capacity=0", lambda: layout_choice.recommend([{"time": None}], 0), ValueError, "capacity"),
    ("what_would_change rows=5", lambda: layout_choice.what_would_change(5, 10**9), TypeError, "rows"),
    ("accelerate_config layout='tp'", lambda: launch_files.accelerate_config("tp", 8, block_class="LlamaDecoderLayer"),
     ValueError, "layout"),
    ("accelerate_config block_class=''", lambda: launch_files.accelerate_config("zero3", 8, block_class=""), ValueError,
     "block_class"),
    ("accelerate_config nodes=0", lambda: launch_files.accelerate_config("ddp", 8, 0, block_class="X"), ValueError,
     "nodes"),
    ("write_yaml config=5", lambda: launch_files.write_yaml(5, "x.yaml"), TypeError, "config"),
    ("launch_commands config={}", lambda: launch_files.launch_commands({}, "x.yaml", []), TypeError, "config"),
    ("launch_commands script_arguments='--cpu'",
     lambda: launch_files.launch_commands(launch_files.accelerate_config("ddp", 2, block_class="X"), "x.yaml", "--cpu"),
     TypeError, "script_arguments"),
    ("block_class_of model='no-such-model'", lambda: launch_files.block_class_of("no-such-model"), ValueError, "model"),
    ("scaled_down_config model='no-such-model'", lambda: launch_files.scaled_down_config("no-such-model", "/tmp"),
     ValueError, "model"),
    ("scaled_down_config width=30", lambda: launch_files.scaled_down_config("Llama 3.1 8B", "/tmp", width=30),
     ValueError, "width"),
    ("RunConfig layout='zero1'", lambda: your_run.RunConfig("Llama 3.1 8B", "zero1"), ValueError, "layout"),
    ("RunConfig steps=0", lambda: your_run.RunConfig("Llama 3.1 8B", steps=0), ValueError, "steps"),
    ("your_run.main --layout tp", lambda: your_run.main(["--model", "x", "--layout", "tp"]), SystemExit, "2"),
    ("diagnose_layout row=5", lambda: lesson10_exercises.diagnose_layout(5, 10**9), TypeError, "row"),
]


@pytest.mark.parametrize(("label", "call", "error", "fragment"), ROWS, ids=[row[0] for row in ROWS])
def test_bad_input_is_refused_naming_the_argument(label, call, error, fragment):
    import matplotlib.pyplot as plt

    try:
        with time_limit(HANG_SECONDS), pytest.raises(error) as raised:
            call()
    finally:
        plt.close("all")
    assert fragment in str(raised.value), f"{label}: {type(raised.value).__name__}: {raised.value}"


def test_the_table_names_each_call_once():
    labels = [row[0] for row in ROWS]
    assert len(labels) == len(set(labels)) and len(labels) >= 150


# --------------------------------------------------------------------------- every public function has a row

# Names a caller cannot pass a bad value to, or that judge any value by design, each with the reason.
# (A callable with no parameter a caller sets, an exception class and an Enum need no entry: see _needs_a_row.)
EXEMPT = {
    "course_utils.exercises.lesson10.diagnose_tensor_parallel": "reads a learner's answer of any type and returns None "
                                                                "for what is no tensor-parallel layout (tests/exercises)",
    "course_utils.validation.is_integer": "answers True or False for any object: no value is bad",
    "course_utils.validation.is_real_number": "answers True or False for any object: no value is bad",
    "course_utils.exercises.values.*": "reads a learner's answer of any type and never raises on it (tests/exercises)",
    "course_utils.exercises.placeholder.*": "____ takes anything by design; contains_placeholder looks into any value",
    # The loops a lesson shows as teaching code: no checks inside them (STYLE.md); their callers pass course objects.
    "course_utils.feature_loops.*": "the loops lesson 5 shows as teaching code; validation stays out of them (STYLE.md)",
    "course_utils.loops.train_plain": "the loop lesson 1 shows as teaching code; validation stays out of it (STYLE.md)",
    "course_utils.loops.train_accelerate": "the loop lesson 1 shows as teaching code; validation stays out of it",
    "course_utils.loops.train_with_trainer": "the Trainer run lesson 1 shows as teaching code; validation stays out of it",
    "course_utils.loops.trainer_metrics": "lesson 2 prints its source (inspect.getsource): validation stays out of it",
    "course_utils.train.training_function": "lesson 6 prints its source and counts its lines: validation stays out of it",
    "course_utils.your_run.training_function": "lesson 10 prints its source; RunConfig checks every value it reads",
    # Records the course's own functions fill in and return: a learner reads them, never builds one.
    "course_utils.speed.Comparison": "a record compare() returns",
    "course_utils.padding.PaddingStats": "a record padding_stats() returns",
    "course_utils.chunked_loss.ChunkedLossOutput": "a record ChunkedLossLM's forward returns",
    "course_utils.compiling.CompileCall": "a record time_compiling_call() returns",
    "course_utils.input_pipeline.EpochTimes": "a record time_epochs() returns",
    "course_utils.profiling.ScheduledProfile": "a record profile_on_schedule() returns",
    "course_utils.speed.Verdict": "a record verdict() returns",
    "course_utils.speed.CpuPeak": "a record cpu_peak() returns",
    "course_utils.utilisation.PublishedRun": "a row of the module's table of published runs, each with its source",
    "course_utils.utilisation.DataSheetPeak": "a row of the module's table of data-sheet peaks, each with its source",
    "course_utils.parallel.ProcessReport": "a record report_process() returns",
    "course_utils.memory.training_memory.TrainingMemory": "a record the planner and measure() return",
    "course_utils.quantization.BlockwiseQuantized": "a record quantize_blockwise() returns",
    "course_utils.sharding.ProcessMemory": "a record train_with_strategy() returns",
    "course_utils.collectives.Collective": "a record CollectiveLog fills in",
    "course_utils.tensor_parallel.SplitRun": "a record run_split() returns",
    "course_utils.pipeline.PipelineRun": "a record run_pipeline() returns",
    "course_utils.meshes.MeshRun": "a record run_mesh() returns",
    # The modules lesson 9 shows as teaching code (tiny_block and tensor_parallel_block check what reaches them).
    "course_utils.tensor_parallel.MLP": "the block lesson 9 shows as teaching code; tiny_block checks its sizes",
    "course_utils.tensor_parallel.Attention": "the block lesson 9 shows as teaching code; tiny_block checks its sizes",
    "course_utils.tensor_parallel.Block": "the block lesson 9 shows as teaching code; tiny_block checks its sizes",
    "course_utils.tensor_parallel.TensorParallel": "built by tensor_parallel_block from a checked block",
    "course_utils.tensor_parallel.CopyToTensorParallel": "an autograd Function, applied by copy_to_tensor_parallel (checked)",
    "course_utils.tensor_parallel.ReduceFromTensorParallel": "an autograd Function, applied by reduce_from_tensor_parallel",
    "course_utils.levers.MemoryCheck": "a record plan_and_measure() returns",
    "course_utils.hardware.Figure": "a record of the cards' table (a value and its source)",
    "course_utils.hardware.Card": "a record of the cards' table",
    "course_utils.step_time.Workload": "a record workload_of() returns",
    "course_utils.step_time.Collective": "a record collectives_of() returns",
    "course_utils.step_time.StepTime": "a record predict_step() returns",
    "course_utils.step_time_checks.PublishedThroughput": "a record of the published runs' table",
    "course_utils.plan.main": "the command's bad arguments are tested one by one (tests/plan/test_plan_command.py: "
                              "one line on stderr naming the argument, exit status 2)",
    "course_utils.train.TrainingResult": "a record main() returns",
    "course_utils.memory.training_memory.StepBreakdown": "a record explain_training_memory() returns",
    "course_utils.memory.step_timeline.StepTimeline": "a record plan_timeline() returns",
    "course_utils.memory.allocator_record.AllocatorRecord": "a record recording_allocator() fills in",
    "course_utils.exercises.feedback.Note": "a record the exercise classes build for show()",
    "course_utils.exercises.feedback.Result": "a record Exercise.evaluate() returns",
    # Parts of a check, called by the check (and its tests) on values the check builds.
    "course_utils.exercises.lesson2.step_problem": "builds exercise 1's problems by their fixed names",
    "course_utils.exercises.lesson2.first_difference": "compares two histories the check made",
    "course_utils.exercises.lesson2.stepped_optimizer": "runs the check's own optimizers on its own model",
    "course_utils.exercises.lesson2.small_mlp": "the check's model",
    "course_utils.exercises.lesson2.SharedTableSGD": "an optimizer the check builds over its own model",
    "course_utils.exercises.lesson2.FlatBufferMomentum": "an optimizer the check builds over its own model",
    "course_utils.exercises.lesson8.fastest_that_fits_reference": "the reference answer, run by the check on set-ups it builds",
    # Lesson 9's context and expert parallelism: the pieces it prints as teaching code, and its records.
    "course_utils.ring_attention.merge_partial": "lesson 9 prints its source (inspect.getsource): no checks inside it",
    "course_utils.ring_attention.causal_mask": "lesson 9 prints its source (inspect.getsource): no checks inside it",
    "course_utils.ring_attention.RingAttention": "an autograd Function lesson 9 prints; ring_attention checks its input",
    "course_utils.ring_attention.ContextParallelRun": "a record context_parallel_run() returns",
    "course_utils.experts.dispatch": "lesson 9 prints its source (inspect.getsource): no checks inside it",
    "course_utils.experts.expert_parallel_moe": "lesson 9 prints its source; expert_parallel_run calls it on its own tokens",
    "course_utils.experts.MoE": "a record make_moe() returns",
    "course_utils.experts.ExpertParallelRun": "a record expert_parallel_run() returns",
}


def _public_modules() -> list[str]:
    """Every module of course_utils whose dotted name has no part starting with ``_``."""
    import pkgutil

    import course_utils

    names = ["course_utils"] + [info.name for info in pkgutil.walk_packages(course_utils.__path__, "course_utils.")]
    return sorted(name for name in names if not any(part.startswith("_") for part in name.split(".")[1:]))


def public_callables() -> dict[str, object]:
    """Return ``"module.name" -> object`` for every public function and class of course_utils, each object once.

    A module's public names are its ``__all__``, or else the names not starting with ``_`` defined in it.
    ``course_utils.memory`` is one face (its docstring): its public names are what it exports, wherever
    they are defined (``fsdp_step`` is ``per_process.fsdp_step``); the names its rooms list in their own
    ``__all__`` for each other are the package's internals. A re-export counts where it is defined.
    """
    import importlib

    face = importlib.import_module("course_utils.memory")
    faced = {id(getattr(face, name)) for name in face.__all__}
    found: dict[str, object] = {}
    seen: set[int] = set()
    # The face last, so that what it re-exports from a public room counts under the room's name.
    for module_name in sorted(_public_modules(), key=lambda name: name == "course_utils.memory"):
        module = importlib.import_module(module_name)
        names = getattr(module, "__all__", None)
        if names is None:
            names = [name for name, value in vars(module).items()
                     if not name.startswith("_") and getattr(value, "__module__", None) == module_name]
        for name in names:
            value = getattr(module, name)
            if not callable(value) or id(value) in seen:
                continue
            defined_in = getattr(value, "__module__", "")
            if module_name != "course_utils.memory" and defined_in != module_name:
                continue  # a re-export (or an import such as torch.device): counted where it is defined
            if module_name.startswith("course_utils.memory.") and id(value) not in faced:
                continue  # a room's internal, used by the package's other rooms only
            seen.add(id(value))
            found[f"{module_name}.{name}"] = value
    return found


def _needs_a_row(value) -> bool:
    """False for what no bad argument can reach: no parameter a caller sets, an exception, an Enum."""
    import enum
    import inspect

    if inspect.isclass(value) and issubclass(value, (BaseException, enum.Enum)):
        return False
    try:
        parameters = inspect.signature(value).parameters
    except (TypeError, ValueError):
        return True
    return any(not name.startswith("_") for name in parameters)


def _exempt(qualified: str) -> bool:
    module = qualified.rsplit(".", 1)[0]
    return qualified in EXEMPT or f"{module}.*" in EXEMPT


def _covered(qualified: str, labels: list[str], ambiguous: set[str]) -> bool:
    """A row covers ``package.module.name`` when its label starts with ``name`` (or ``module.name``, which an
    ambiguous name, public in two modules, must use)."""
    module, name = qualified.rsplit(".", 2)[-2:]
    firsts = {label.split()[0] for label in labels}
    return f"{module}.{name}" in firsts or (name not in ambiguous and name in firsts)


def test_every_public_function_has_a_bad_input_row():
    from collections import Counter

    # Lessons 7 and 8's newer modules keep their rows in files of their own, each run by the same rule.
    import test_bad_input_lesson7
    import test_bad_input_lesson8

    labels = [row[0] for row in ROWS + test_bad_input_lesson7.ROWS + test_bad_input_lesson8.ROWS]
    callables = public_callables()
    counts = Counter(qualified.rsplit(".", 1)[1] for qualified in callables)
    ambiguous = {name for name, count in counts.items() if count > 1}
    missing = [qualified for qualified, value in callables.items()
               if _needs_a_row(value) and not _exempt(qualified) and not _covered(qualified, labels, ambiguous)]
    assert not missing, (
        f"{len(missing)} public function(s) of course_utils have no bad-input row: "
        + ", ".join(missing)
        + ". Add a row to ROWS in tests/validation/test_bad_input.py for each: (label starting with the"
          " function's name, or module.name where the name is public in two modules; the bad call; the exception;"
          " a fragment of its message naming the argument). A function no bad value can reach goes in EXEMPT,"
          " with the reason."
    )


def test_the_exemptions_name_public_functions():
    callables = public_callables()
    modules = {qualified.rsplit(".", 1)[0] for qualified in callables}
    stale = [key for key in EXEMPT if key not in callables and key.removesuffix(".*") not in modules]
    assert not stale, f"EXEMPT names what course_utils no longer has public: {stale}"


def classify(call, error, fragment) -> tuple[str, str]:
    """Return ``(verdict, what happened)``: verdict is "clear", "obscure", "silent" or "hang"."""
    import matplotlib.pyplot as plt

    import time

    start = time.perf_counter()
    try:
        with time_limit(HANG_SECONDS):
            result = call()
    except error as raised:
        verdict = "clear" if fragment in str(raised) else "obscure"
        return verdict, f"{type(raised).__name__}: {raised}"
    except Exception as raised:  # noqa: BLE001 - the tally reports any other exception as obscure
        return "obscure", f"{type(raised).__name__}: {raised}"
    except BaseException as raised:
        if isinstance(raised, KeyboardInterrupt):
            raise
        if time.perf_counter() - start >= HANG_SECONDS:
            return "hang", f"still running after {HANG_SECONDS} s"
        return "obscure", f"{type(raised).__name__} (a BaseException) after {time.perf_counter() - start:.1f} s"
    finally:
        plt.close("all")
    return "silent", f"returned {str(result)[:80]!r}"


if __name__ == "__main__":
    tally: dict[str, int] = {}
    for label, call, error, fragment in ROWS:
        verdict, what = classify(call, error, fragment)
        tally[verdict] = tally.get(verdict, 0) + 1
        if verdict != "clear":
            print(f"{verdict:8} {label}: {what}"[:300])
    functions = len({label.split()[0] for label, *_ in ROWS})
    print(f"{len(ROWS)} calls to {functions} public functions: "
          + ", ".join(f"{tally.get(v, 0)} {v}" for v in ("clear", "obscure", "silent", "hang")))
    sys.exit(0 if tally.get("clear", 0) == len(ROWS) else 1)
