"""Accelerate's process-wide state: forgetting it, so that a notebook or a test can build another ``Accelerator``.

Accelerate keeps one state per process in class-level singletons
(``PartialState``, ``AcceleratorState``, ``GradientState``). A script builds one
``Accelerator`` and never meets them; a notebook that compares settings side by
side (lesson 5), a forked worker that must not inherit the notebook's
``Accelerator`` (lesson 6's launcher) and a test suite do. :func:`reset_accelerate_state`
is the one recipe for all of them, the one Accelerate's own tests use between cases.
"""

from __future__ import annotations


def reset_accelerate_state() -> None:
    """Forget every ``Accelerator`` of this process: empty Accelerate's shared state (class-level singletons).

    Each worker of :func:`course_utils.launcher.launch` calls it first, so that
    an ``Accelerator`` the notebook created before the fork does not reach the
    workers. In a notebook it undoes an ``Accelerator`` created there, so that
    ``accelerate.notebook_launcher`` starts again.
    """
    # Imported here: the launcher's workers call this before anything else imports accelerate.
    from accelerate.state import AcceleratorState, GradientState, PartialState

    AcceleratorState._reset_state(reset_partial_state=True)
    PartialState._reset_state()
    GradientState._reset_state()


def fresh_accelerator(**options):
    """Return ``Accelerator(**options)``, after forgetting the settings of any earlier Accelerator in this process.

    A second ``Accelerator`` with another ``mixed_precision`` raises
    ("AcceleratorState has already been initialized"); a notebook that compares
    settings side by side clears that state first with :func:`reset_accelerate_state`.
    """
    from accelerate import Accelerator

    reset_accelerate_state()
    return Accelerator(**options)
