"""How many CPU threads torch uses in the course's kernels (set up at the top of every lesson).

torch starts one thread per core and splits every large operation between them;
each operation then waits for its slowest thread. On a 2-core laptop where the
other core is busy (another kernel, a browser, the test suite), that wait
dominates: eight training steps of the course model were measured at 9.6-11.4 s
on 2 threads and 0.7-1.2 s on 1 with the second core loaded. On a quiet machine
two threads win little at the course's sizes. So each lesson's kernel computes
on one thread: a little slower at best, never ten times slower.

Set ``COURSE_NUM_THREADS`` in the environment to choose another number (for
example on a quiet many-core machine).
"""

from __future__ import annotations

import os

import torch

DEFAULT_NUM_THREADS = 1
ENVIRONMENT_VARIABLE = "COURSE_NUM_THREADS"


def use_course_threads() -> int:
    """Give torch the course's number of threads (1, or ``$COURSE_NUM_THREADS``); return it."""
    requested = os.environ.get(ENVIRONMENT_VARIABLE, "").strip()
    if requested:
        if not requested.isdigit() or int(requested) < 1:
            raise ValueError(f"{ENVIRONMENT_VARIABLE} must be a positive whole number, got {requested!r}")
        num_threads = int(requested)
    else:
        num_threads = DEFAULT_NUM_THREADS
    torch.set_num_threads(num_threads)
    return num_threads
