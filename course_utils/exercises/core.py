"""How to write an exercise: the authoring API, in one place.

The machinery lives in four modules: ``placeholder`` (the blank ``____``),
``feedback`` (the outcomes and how the notebook shows them, as Markdown),
``values`` (reading and matching a learner's numbers) and ``exercise`` (the
classes below), with ``limits`` (the time limit on a learner's code) beside
them. This module gathers what an author needs.

A learner calls three methods::

    ex.q1.check()      # Not attempted yet / Incorrect (with the reason) / Correct
    ex.q1.hint()       # the next hint; ex.q1.hint(2) shows hint 2
    ex.q1.solution()   # the reference code

An author writes a class per exercise and one instance of it; the class
attributes are exactly what the machinery reads (no renaming behind the scenes)::

    class CountParameters(ValueExercise):          # the answer is a value
        title = "Exercise 1"                       # shown before the feedback
        variables = ["num_params"]                 # notebook variables the check reads
        expected = 65_783_042                      # or {variable: value}, or def expected_values(self, **values)
        rel_tol = 1e-9                             # numbers match within rel_tol / abs_tol (float32 rounding is added)
        unit = None                                # "MiB": a unit slip is named ("that is the amount in GiB")
        hints = ["Every parameter is a tensor.", "`p.numel()` counts its elements."]   # Markdown
        solution_code = "num_params = sum(p.numel() for p in model.parameters())"
        correct_message = "That is 66 M numbers to train."   # optional, after "Correct: Well done."

        def diagnose(self, name, value, expected):  # optional: name a typical mistake
            if value == expected - 1_538:
                return "You left out the classifier head."

    class CountTrainable(CodeExercise):            # the answer is a function
        variables = ["count_trainable"]
        hints = [...]
        solution_code = '''
            def count_trainable(model):
                return sum(p.numel() for p in model.parameters() if p.requires_grad)
        '''

        def reference(self, model):                # the right result for one case
            return sum(p.numel() for p in model.parameters() if p.requires_grad)

        def cases(self):                           # tuples of positional arguments
            return [(tiny_model(),), (tiny_model(frozen=True),)]

        def diagnose(self, got, expected, args):   # optional
            ...

    class AnythingElse(Exercise):                  # write the whole check
        variables = ["train_loop"]
        hints = [...]
        solution_code = "..."
        time_limit_s = 60                          # per call of the learner's code (default 20)
        time_limit_cause = "Does the loop stop after num_epochs?"

        def check_answer(self, train_loop):        # one keyword per variable, never ``____``
            losses = self.call_learner(train_loop, ...)   # errors, ____ and endless loops become feedback
            if not losses:
                raise Incorrect("`train_loop` returned no losses.")   # Markdown; never reveal the answer
            # return None: correct

    q1 = CountParameters()

Rules the machinery keeps: a check never raises on a learner's answer (any
exception inside ``check_answer`` other than ``Incorrect``/``NotAttempted`` is
"the check itself failed", a bug in the exercise); a learner's function runs
only through ``call_learner``, under a time limit; ``bool(____)`` raises
"replace ``____`` first". Tests use ``exercise.evaluate(**values)``, which
returns the :class:`Result` without showing it (``tests/exercise_helpers.py``).
"""

from course_utils.exercises.exercise import CodeExercise, Exercise, ValueExercise
from course_utils.exercises.feedback import Incorrect, Note, NotAttempted, Outcome, Result, incorrect
from course_utils.exercises.limits import time_limit
from course_utils.exercises.placeholder import ____, PlaceholderError, contains_placeholder
from course_utils.exercises.values import a_or_an, as_number, describe_value, type_names, unit_slip, values_match

__all__ = [
    "____",
    "CodeExercise",
    "Exercise",
    "Incorrect",
    "Note",
    "NotAttempted",
    "Outcome",
    "PlaceholderError",
    "Result",
    "ValueExercise",
    "a_or_an",
    "as_number",
    "contains_placeholder",
    "describe_value",
    "incorrect",
    "time_limit",
    "type_names",
    "unit_slip",
    "values_match",
]
