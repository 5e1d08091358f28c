"""Helpers shared by the notebooks of the course on efficient PyTorch training.

One module per idea a learner meets (the README's layout says the same):

- ``data``: the offline paraphrase dataset, its tokenizer and DataLoaders (lesson 1)
- ``models``: the tiny pre-trained checkpoint and full-size architectures, built without downloads (lessons 1-5)
- ``threads``: one torch thread per kernel (every lesson); ``units``: bytes, MiB, GiB (every lesson)
- ``validation``: checks of the values a learner or user passes in
- ``loops``: the plain PyTorch loop, the same loop with Accelerate, and the Trainer (lesson 1)
- ``adamw``: one AdamW step written plainly (lesson 2)
- ``optimizers``: one builder for every optimizer the course uses (lessons 2-5)
- ``optimizer_state``: what an optimizer keeps between steps, estimated and measured (lessons 2-3)
- ``quantization``: block-wise 8-bit codes and factored second moments from scratch (lesson 3)
- ``fidelity``: how far a memory-efficient optimizer's updates land from AdamW's (lesson 3)
- ``training_memory``: the four parts and three moments of a training step's memory (lesson 4)
- ``planner``: the peak of one training step of any model, followed on fake tensors, per process under sharding (lessons 4-5, 7)
- ``step_timeline``: the planner's step operation by operation: the memory of each part over time (lesson 4)
- ``allocator_record``: the CPU allocator's own record of a step, from torch's profiler (lessons 4, 7)
- ``memory``: one import for every estimate and measurement of memory (lessons 2-5)
- ``levers``: the Accelerate loops that make a training fit (lesson 5)
- ``fitting``: planned beside measured memory, and levers combined (lesson 5)
- ``parallel``: data parallelism: sharding, reports, equivalence (lesson 6)
- ``train``: one Accelerate-shaped training function, for notebooks and the command line (lesson 6)
- ``launcher``: starting processes from a notebook and bringing their results back (lesson 6)
- ``sharding``: ZeRO-1/2/3 and FSDP2 run in launched CPU processes, what each holds and sends (lesson 7)
- ``speed``: timings with their spread, FLOPs per token, the matmul peak and MFU (lesson 8)
- ``padding``: four ways to batch sequences of different lengths, packing included (lesson 8)
- ``compiling``: whether torch.compile can run here, and how many graphs it compiled (lesson 8)
- ``plots``: the figures the lessons draw, one module per lesson topic
- ``exercises``: the check / hint / solution machinery, and one module of exercises per lesson

Private: ``_activation_model`` (what autograd keeps, block by block), ``_step_tracker``
(the MemTracker the measurements use) and ``_fake_step`` (the planner's machinery: fake copies,
probes, the passes and the optimizer step followed apart and cached), ``_sharded_step``
(one process's step under FSDP2, followed on a fake process group).
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
