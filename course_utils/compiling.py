"""``torch.compile`` in a lesson: can this machine compile, and how many graphs did it compile (lesson 8).

On a CPU, torch.compile's default backend (Inductor) writes C++ and builds it
with the machine's C++ compiler; without one it fails at the first call.
TorchDynamo, the part that captures graphs from Python, needs no compiler:
its ``backend="eager"`` runs the captured graphs as they are, which is enough
to count graphs, recompilations and graph breaks.
"""

from __future__ import annotations

import shutil
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

__all__ = ["cpp_compiler", "count_compiled_graphs", "CompileCall", "time_compiling_call"]


def cpp_compiler() -> str | None:
    """Return the path of the C++ compiler Inductor would call on this machine, or None if there is none.

    Looked for: ``$CXX``, Inductor's ``cpp.cxx`` setting, ``g++`` and ``clang++``
    (and MSVC's ``cl`` on Windows).
    """
    import os
    import sys

    from torch._inductor import config

    candidates = [os.environ.get("CXX")] + [name for name in config.cpp.cxx if name] + ["g++", "clang++"]
    if sys.platform == "win32":
        candidates.append("cl")
    for candidate in candidates:
        path = shutil.which(candidate) if candidate else None
        if path:
            return path
    return None


def count_compiled_graphs(function: Callable, inputs: Iterable[tuple], **compile_options: object) -> int:
    """Return how many graphs TorchDynamo compiled while calling ``torch.compile(function)`` on each argument tuple.

    One graph per distinct specialisation: the first call compiles, a call
    whose shapes break a guard compiles again (a recompilation). Runs with
    ``backend="eager"`` (no C++ compiler needed: the count is Dynamo's, the
    backend only decides how each graph runs) unless ``compile_options`` says
    otherwise; Dynamo's caches are reset before and after.
    """
    if not callable(function):
        raise TypeError(f"function must be callable, got {type(function).__name__}")
    inputs = list(inputs)
    if not inputs:
        raise ValueError("inputs must hold at least one tuple of arguments (one call each)")
    if not all(isinstance(arguments, tuple) for arguments in inputs):
        raise TypeError("inputs must be tuples of arguments, one per call ((x,) for a call with one argument), "
                        f"got {type(next(a for a in inputs if not isinstance(a, tuple))).__name__}")
    if "mode" in compile_options and "backend" not in compile_options:
        raise ValueError("mode chooses among Inductor's settings: pass backend=\"inductor\" with it (the default here, "
                         "\"eager\", ignores mode)")
    from torch._dynamo.utils import counters

    compile_options.setdefault("backend", "eager")
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(function, **compile_options)
    try:
        for arguments in inputs:
            compiled(*arguments)
        return int(counters["stats"]["unique_graphs"])
    finally:
        torch._dynamo.reset()


@dataclass(frozen=True)
class CompileCall:
    """One call that compiled: its ``seconds``, and Inductor's cache ``hits`` and ``misses`` of compiled graphs during it.

    ``hits`` and ``misses`` are None when the caches were off (nothing looked up: everything compiled).
    """

    seconds: float
    hits: int | None
    misses: int | None

    def describe(self) -> str:
        """Return "12.3 s (Inductor's cache: 0 hits, 2 misses)", or "... (Inductor's caches off: all compiled now)"."""
        if self.hits is None:
            return f"{self.seconds:.1f} s (Inductor's caches off: every graph compiled now, as on a first run)"
        return (f"{self.seconds:.1f} s (Inductor's cache: {self.hits} hit{'s' if self.hits != 1 else ''}, "
                f"{self.misses} miss{'es' if self.misses != 1 else ''})")


def time_compiling_call(call: Callable[[], object], use_caches: bool = True) -> CompileCall:
    """Call ``call()`` once (a call of a compiled function that compiles); return its :class:`CompileCall`.

    A cache hit reuses code an earlier run on this machine compiled, and
    costs a fraction of a miss: a learner's first run misses. With
    ``use_caches=False`` Inductor's caches are off for the call
    (``torch.compiler.config.force_disable_caches``), so it always pays a miss.
    """
    if not callable(call):
        raise TypeError(f"call must be callable, got {type(call).__name__}")
    if not isinstance(use_caches, bool):
        raise TypeError(f"use_caches must be True or False, got {use_caches!r}")
    from torch._dynamo.utils import counters

    before = counters["inductor"]["fxgraph_cache_hit"], counters["inductor"]["fxgraph_cache_miss"]
    with warnings.catch_warnings(), torch.compiler.config.patch(force_disable_caches=not use_caches):
        # With the caches off, Dynamo's profile-guided cache warns that it is off too: that is the point here.
        warnings.filterwarnings("ignore", message="dynamo_pgo force disabled")
        start = time.perf_counter()
        call()
        seconds = time.perf_counter() - start
    if not use_caches:
        return CompileCall(seconds, None, None)
    hits = counters["inductor"]["fxgraph_cache_hit"] - before[0]
    misses = counters["inductor"]["fxgraph_cache_miss"] - before[1]
    return CompileCall(seconds, hits, misses)
