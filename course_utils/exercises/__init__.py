"""Exercises: check your answer, ask for a hint, see the solution (every lesson).

In a notebook::

    from course_utils.exercises import ____
    from course_utils.exercises import lesson1 as ex

    num_params = ____      # replace ____ with your answer
    ex.q1.check()          # not attempted yet / incorrect, with the reason / correct
    ex.q1.hint()           # the next hint each call; ex.q1.hint(2) shows hint 2
    ex.q1.solution()       # the reference code

Each lesson's exercises live in ``lessonN.py`` next to this file. The machinery
they share is cut in four: ``placeholder`` (``____``), ``feedback`` (outcomes,
shown as Markdown), ``values`` (reading and matching a learner's numbers) and
``exercise`` (the classes); ``core`` gathers them and documents how to write an exercise.
"""

# The public names are those of `core`: one list, kept there.
from course_utils.exercises.core import *  # noqa: F401,F403
from course_utils.exercises.core import __all__  # noqa: F401
