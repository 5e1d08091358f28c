"""Figures drawn by the lessons, one module per idea. Every figure has a title, labelled axes and units.

- ``training``: loss curves, Trainer versus Accelerator (lesson 1)
- ``adamw``: moving averages and AdamW step sizes (lesson 2)
- ``state_memory``: one optimizer's state against parameter count (lesson 2)
- ``memory_efficient``: 8-bit codes, Adafactor's factored moment, the optimizers' trade-off (lesson 3)
- ``training_memory``: the peak of a training step, and against model size (lesson 4)
- ``memory_explorer``: the widgets that explore a training step's peak (lesson 4)
- ``step_timeline``: one training step's memory operation by operation, and its explorer (lesson 4)
- ``levers``: vanishing bf16 updates, gradient norms, memory against model size, scores over seeds (lesson 5; import it as a module)
- ``parallel``: data-parallel training (lesson 6)
- ``sharding``: what each process holds under DDP, ZeRO and FSDP (lesson 7)
- ``speed``: timings with their spread, a profiled step's timeline, tokens/s against memory (lesson 8; import it as a module)
- ``ring_attention``: attention's memory per process against sequence length (lesson 9; import it as a module)
- ``experts``: the tokens each expert computed, by the process holding it (lesson 9; import it as a module)

Each function returns the matplotlib ``Figure`` it drew, so a notebook shows it
and a test can inspect it.
"""

from course_utils.plots.memory_efficient import *  # noqa: F401,F403
from course_utils.plots.memory_explorer import *  # noqa: F401,F403
from course_utils.plots.adamw import *  # noqa: F401,F403
from course_utils.plots.parallel import *  # noqa: F401,F403
from course_utils.plots.sharding import *  # noqa: F401,F403
from course_utils.plots.state_memory import *  # noqa: F401,F403
from course_utils.plots.step_timeline import *  # noqa: F401,F403
from course_utils.plots.training import *  # noqa: F401,F403
from course_utils.plots.training_memory import *  # noqa: F401,F403
