"""Figures drawn by the lessons, one module per idea. Every figure has a title, labelled axes and units.

- ``training``: loss curves, Trainer versus Accelerator (lesson 1)
- ``optimizers``: moving averages and AdamW step sizes (lesson 2)
- ``memory``: optimizer and training memory against parameter count (lessons 2 and 3)
- ``parallel``: data-parallel training (lesson 4)

Each function returns the matplotlib ``Figure`` it drew, so a notebook shows it
and a test can inspect it.
"""

from course_utils.plots.memory import *  # noqa: F401,F403
from course_utils.plots.optimizers import *  # noqa: F401,F403
from course_utils.plots.parallel import *  # noqa: F401,F403
from course_utils.plots.training import *  # noqa: F401,F403
