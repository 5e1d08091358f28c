"""Helpers shared by the notebooks of the course on efficient PyTorch training.

One module per idea a learner meets (the README's layout says the same):

- ``data``: the offline paraphrase dataset, its tokenizer and DataLoaders (lesson 1)
- ``models``: the tiny pre-trained checkpoint and full-size architectures, built without downloads, and the one
  builder of a model set up for training (dtype, checkpointing, which parameters train: ``build_for_training``) (lessons 1-5)
- ``threads``: one torch thread per kernel (every lesson); ``units``: bytes, MiB, GiB (every lesson)
- ``validation``: checks of the values a learner or user passes in
- ``loops``: the plain PyTorch loop, the same loop with Accelerate, the Trainer, and the evaluation loop (lesson 1)
- ``loop_diff``: two loops compared line by line, and a side-by-side table (lessons 1 and 5)
- ``schedules``: the warm-up then linear decay schedule, written once (lessons 2, 5, 6)
- ``accelerate_state``: forgetting Accelerate's process-wide state, so another ``Accelerator`` can start (lessons 5-6)
- ``adamw``: one AdamW step written plainly (lesson 2)
- ``optimizers``: one builder for every optimizer the course uses, and the options each accepts (lessons 1-5)
- ``quantization``: block-wise 8-bit codes and factored second moments from scratch (lesson 3)
- ``fidelity``: how far a memory-efficient optimizer's updates land from AdamW's (lesson 3)
- ``memory``: the memory wing, one package with one face (``from course_utils import memory``): a training
  set-up (``TrainingSetup``), the training step written once, measured for real (``training_memory``) and
  followed on fake tensors by the planner (``planner``, ``fake_step``, ``fake_tensors``, ``plan_cache``, ``probes``,
  ``per_process``; for every
  family of model, ``model_families``, ``qlora``, ``fake_kernels``), what an optimizer keeps (``optimizer_state``),
  the allocator's own record of a step (``allocator_record``) and the step's memory over time (``step_timeline``);
  its docstring maps its rooms and which imports which (lessons 2-5, 7)
- ``feature_loops``: lesson 1's Accelerate loop plus one feature each: accumulation, clipping, checkpoints (lesson 5)
- ``levers``: lesson 5's levers combined (``Levers``), planned and planned beside measured
- ``parallel``: data parallelism: sharding, reports, equivalence (lesson 6)
- ``train``: one Accelerate-shaped training function, for notebooks and the command line (lesson 6)
- ``launcher``: starting processes from a notebook and bringing their results back (lesson 6)
- ``cpu_features``: what this CPU offers the course's branches: bf16 matrix units, read from its flags (lessons 5, 8)
- ``loopback``: every launch listens on loopback only: its rendezvous store and gloo's sockets (lessons 6-7)
- ``command_line``: a command line run from a notebook, and a command-line run that finds itself alone (lessons 6-7)
- ``layouts``: how processes divide a model (``Layout``: ddp, zero1, zero2, zero3), and that division applied to a
  model and its optimizer, one function for the launched runs and the planner alike (lesson 7)
- ``sharding``: ZeRO-1/2/3 and FSDP2 run in launched CPU processes, what each holds and sends (lesson 7)
- ``tensor_parallel``: a block's MLP and attention split over processes, the all-reduce made visible, and DTensor's
  plans for the same split (sequence parallelism too), run and checked against one process (lesson 9)
- ``pipeline``: a model cut into stages, GPipe and 1F1B over send/recv, the bubble measured; torch's schedules (lesson 9)
- ``meshes``: FSDP x TP and HSDP on a 2 x 2 device mesh, traffic per dimension; Accelerate's ``ParallelismConfig`` (lesson 9)
- ``collectives``: every collective a process runs, by kind, bytes and process group, seen in torch's dispatcher (lesson 9)
- ``speed``: timings with their spread, one optimizer step timed (lesson 5), FLOPs per token, the matmul peak and MFU (lesson 8)
- ``padding``: four ways to batch sequences of different lengths, packing included (lesson 8)
- ``compiling``: whether torch.compile can run here, and how many graphs it compiled (lesson 8)
- ``utilisation``: published MFU and HFU figures with their sources, data-sheet peaks, FLOPs counted as they run (lesson 8)
- ``shapes``: matrix products timed by shape, arithmetic intensity, a vocabulary padded to a multiple (lesson 8)
- ``profiling``: operator calls counted by the profiler, and a profiler schedule as a training script runs it (lesson 8)
- ``input_pipeline``: a dataset with a read latency, epochs timed with their waits (lesson 8)
- ``chunked_loss``: a causal LM's cross-entropy computed in chunks, its logits never whole (lesson 8)
- ``ring_attention``: context parallelism: attention over a sequence split across processes, by a ring of sends and
  receives, forward and backward (lesson 9)
- ``experts``: expert parallelism: a mixture-of-experts layer whose experts live on different processes, two all-to-alls (lesson 9)
- ``saved_activations``: what autograd keeps for the backward pass, counted while it is alive (lesson 9)
- ``hardware``: the cards' peaks per precision, memory, memory bandwidth and links, each figure beside its source (issue 35)
- ``step_time``: one training step's time by part (compute, recomputation, each collective, overlap, optimizer step),
  tokens/s, MFU and HFU; ``step_time_checks``: the model against real CPU steps and published runs (issue 35)
- ``plan``: ``python -m course_utils.plan``, memory per process and predicted time of each layout (issue 35)
- ``layout_choice``: the layout to launch and why, what would change it; ``launch_files``: the Accelerate config
  file, the launch commands and a scaled-down config; ``your_run``: the training script they launch (lesson 10)
- ``plots``: the figures the lessons draw, one module per lesson topic
- ``exercises``: the check / hint / solution machinery, and one module of exercises per lesson

Nothing outside ``memory`` imports its private modules (``_activation_model``, ``_step_tracker``)
or any underscore name from it; ``memory`` imports nothing from the loops, plots,
exercises or lesson helpers (``levers`` and ``plots`` import it).
"""

import gc
from pathlib import Path

# A lesson imports torch and transformers before this package: the objects they
# create while loading (about half a million in a kernel) live as long as it does,
# and every full garbage collection would walk them all again (up to a second each
# in lesson 1's kernel). Frozen, the collector leaves them out; it still collects
# everything made from here on. The planner's gc.unfreeze() after a step thaws them, harmlessly.
gc.freeze()

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_DIR = PACKAGE_DIR.parent
DATA_DIR = REPO_DIR / "data"
