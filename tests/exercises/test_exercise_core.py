"""The exercise machinery: placeholder, the three outcomes, hints, solutions, notebook binding, display."""

import copy
import pickle

import pytest
import torch
from exercise_helpers import (
    assert_correct,
    assert_handles_bad_answers,
    assert_incorrect,
    assert_message_hides,
    assert_not_attempted,
)

from course_utils.exercises import (
    ____,
    CodeExercise,
    Exercise,
    Incorrect,
    NotAttempted,
    Outcome,
    Result,
    ValueExercise,
    contains_placeholder,
    incorrect,
)

# ----------------------------------------------------------------------------- demo exercises


class CountParameters(ValueExercise):
    variables = ["num_params"]
    expected = 65_783_042
    hints = ["Every parameter is a tensor.", "`p.numel()` counts a tensor's elements.", "Sum them."]
    solution_code = """
        num_params = sum(p.numel() for p in model.parameters())
    """

    def diagnose(self, name, value, expected):
        if value == expected - 1_538:
            return "You left out the classifier head."
        return None


class AdamWMemory(ValueExercise):
    variables = ["state_mib", "model"]
    rel_tol = 1e-3
    hints = ["Two fp32 moments per parameter."]
    solution_code = "state_mib = 2 * 4 * count(model) / 2**20"

    def expected_values(self, model, **answers):
        return {"state_mib": 2 * 4 * sum(p.numel() for p in model.parameters()) / 2**20}


class ShapeAndDtype(ValueExercise):
    variables = ["rows", "dtype_name"]
    expected = {"rows": 128, "dtype_name": "bfloat16"}
    hints = ["Look at `batch.shape`."]
    solution_code = "rows, dtype_name = 128, 'bfloat16'"


def count_trainable_reference(model):
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def tiny_model(frozen_first_layer):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    model[0].requires_grad_(not frozen_first_layer)
    return model


class CountTrainable(CodeExercise):
    variables = ["count_trainable"]
    hints = ["`p.requires_grad` is False for frozen parameters."]
    solution_code = """
        def count_trainable(model):
            return sum(p.numel() for p in model.parameters() if p.requires_grad)
    """

    def reference(self, model):
        return count_trainable_reference(model)

    def cases(self):
        return [(tiny_model(frozen_first_layer=False),), (tiny_model(frozen_first_layer=True),)]

    def describe_case(self, args):
        frozen = not args[0][0].weight.requires_grad
        return "For a model whose first layer is " + ("frozen" if frozen else "trainable")

    def diagnose(self, got, expected, args):
        if got == sum(p.numel() for p in args[0].parameters()):
            return "Your count includes frozen parameters (requires_grad=False)."
        return None


class ScaleTensor(CodeExercise):
    variables = ["scale"]
    reference = staticmethod(lambda t: t * 2)  # a plain function stored on the class: staticmethod, as Python wants
    hints = ["Multiply."]
    solution_code = "def scale(t):\n    return t * 2"

    def cases(self):
        return [(torch.arange(6.0).reshape(2, 3),)]


class BrokenCheck(Exercise):
    variables = ["answer"]
    solution_code = "answer = 1"

    def check_answer(self, answer):
        return {}["missing key"]  # a bug in the exercise, not in the learner's answer


class ReturnsIncorrect(Exercise):
    variables = ["answer"]
    solution_code = "answer = 'yes'"

    def check_answer(self, answer):
        if answer == "not yet":
            raise NotAttempted("You have not run the training cell yet.")
        if answer != "yes":
            return incorrect("The answer is a word of three letters.")
        return None


def right_count(model):
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def counts_everything(model):
    return sum(p.numel() for p in model.parameters())


# ----------------------------------------------------------------------------- placeholder


def test_the_placeholder_is_one_object_even_after_copy_and_pickle():
    assert copy.copy(____) is ____
    assert copy.deepcopy([____])[0] is ____
    assert pickle.loads(pickle.dumps(____)) is ____
    assert repr(____) == "____" and f"{____:.2f}" == "____"


@pytest.mark.parametrize(
    "expression",
    [
        lambda: ____ * 8,
        lambda: 8 * ____,
        lambda: ____ / 2**20 + 1,
        lambda: -____,
        lambda: ____ ** 2,
        lambda: round(____, 2),
        lambda: ____.numel(),
        lambda: ____.shape[0],
        lambda: ____(3, lr=0.1),
        lambda: ____ > 3,
        lambda: sum(____),
    ],
)
def test_work_done_on_the_placeholder_runs_and_gives_the_placeholder(expression):
    assert expression() is ____


def test_a_loop_over_the_placeholder_runs_once_and_stays_not_attempted():
    items = [p.numel() for p in ____]
    assert items == [____] and contains_placeholder(items)


def test_setting_attributes_on_the_placeholder_leaves_it_unchanged():
    ____.lr = 0.1
    ____["key"] = 1
    assert ____.__dict__ == {}


def test_contains_placeholder_finds_it_in_functions_methods_and_containers():
    def unfinished(model):
        return sum(____ for p in model.parameters())

    class UnfinishedOptimizer:
        def step(self):
            return ____

    assert contains_placeholder(____)
    assert contains_placeholder(unfinished)
    assert contains_placeholder(lambda: ____)
    assert contains_placeholder(UnfinishedOptimizer)
    assert contains_placeholder({"lr": ____})
    assert contains_placeholder((1, [2, {____}]))


def test_contains_placeholder_is_false_for_finished_answers():
    cyclic = []
    cyclic.append(cyclic)
    for value in (0, None, "____", right_count, [1, 2], {"a": 1}, torch.zeros(2), cyclic):
        assert not contains_placeholder(value)


# ----------------------------------------------------------------------------- value exercises


def test_a_placeholder_answer_is_not_attempted_with_a_nudge_to_replace_it():
    result = assert_not_attempted(CountParameters(), num_params=____)
    assert "`____`" in result.message and "num_params" in result.message


def test_arithmetic_on_the_placeholder_is_still_not_attempted():
    assert_not_attempted(CountParameters(), num_params=____ * 4 / 2**20)


def test_a_variable_not_defined_yet_is_not_attempted():
    result = assert_not_attempted(CountParameters())
    assert "not defined yet" in result.message


def test_the_right_value_is_correct_whatever_its_numeric_type():
    for value in (65_783_042, 65_783_042.0, torch.tensor(65_783_042)):
        assert_correct(CountParameters(), num_params=value)


def test_a_wrong_value_is_incorrect_with_a_direction_and_without_the_expected_value():
    assert_incorrect(CountParameters(), reason_contains="too high", hides=65_783_042, num_params=65_783_043)
    assert_incorrect(CountParameters(), reason_contains="too low", hides=65_783_042, num_params=1_000)


def test_a_lesson_authors_diagnosis_replaces_the_generic_reason():
    assert_incorrect(CountParameters(), reason_contains="classifier head", num_params=65_783_042 - 1_538)


def test_a_unit_slip_is_named_without_giving_the_value():
    bytes_instead_of_mib = 65_783_042 * 2**20
    assert_incorrect(CountParameters(), reason_contains="check the unit", hides=65_783_042, num_params=bytes_instead_of_mib)


@pytest.mark.parametrize(
    ("answer", "reason"),
    [(None, "is None"), ("65783042", "should be one number"), (True, "should be one number"), ([1], "should be one number")],
)
def test_none_and_wrong_types_are_incorrect_not_a_crash(answer, reason):
    assert_incorrect(CountParameters(), reason_contains=reason, num_params=answer)


def test_tolerance_and_expected_values_computed_from_the_notebooks_other_variables():
    model = tiny_model(frozen_first_layer=False)  # 26 parameters: 2 * 4 * 26 bytes
    exact_mib = 2 * 4 * 26 / 2**20
    assert_correct(AdamWMemory(), state_mib=exact_mib * 1.0005, model=model)
    assert_incorrect(AdamWMemory(), reason_contains="too high", hides=exact_mib, state_mib=exact_mib * 1.01, model=model)


def test_several_variables_are_each_checked_against_their_expected_value():
    assert_correct(ShapeAndDtype(), rows=128, dtype_name="bfloat16")
    result = assert_incorrect(ShapeAndDtype(), reason_contains="dtype_name", rows=128, dtype_name="float16")
    assert "bfloat16" not in result.message
    assert_incorrect(ShapeAndDtype(), reason_contains="should be a str", rows=128, dtype_name=torch.bfloat16)


def test_bad_answers_to_every_demo_exercise_are_incorrect_never_a_crash():
    assert_handles_bad_answers(CountParameters(), num_params=65_783_042)
    assert_handles_bad_answers(ShapeAndDtype(), rows=128, dtype_name="bfloat16")
    assert_handles_bad_answers(CountTrainable(), count_trainable=right_count)


# ----------------------------------------------------------------------------- code exercises


def test_the_reference_function_passes_and_a_typical_mistake_is_diagnosed():
    assert_correct(CountTrainable(), count_trainable=right_count)
    assert_correct(CountTrainable(), count_trainable=count_trainable_reference)
    assert_incorrect(CountTrainable(), reason_contains="includes frozen", count_trainable=counts_everything)


def test_a_wrong_function_without_diagnosis_names_the_input_it_failed_on():
    def off_by_one(model):
        return right_count(model) + 1

    result = assert_incorrect(CountTrainable(), reason_contains="first layer is trainable", count_trainable=off_by_one)
    assert "returned 27" in result.message


def test_a_function_that_raises_is_incorrect_with_the_error_and_its_line():
    def crashes(model):
        total = 0
        return total / 0

    result = assert_incorrect(CountTrainable(), reason_contains=["ZeroDivisionError", "division by zero", "total / 0"], count_trainable=crashes)
    assert isinstance(result.exception, ZeroDivisionError)


def test_a_function_that_forgets_return_is_told_so():
    def no_return(model):
        sum(p.numel() for p in model.parameters())

    assert_incorrect(CountTrainable(), reason_contains="forget `return`", count_trainable=no_return)


def test_a_function_still_using_the_placeholder_is_not_attempted():
    def count_trainable(model):
        return sum(____ for p in model.parameters())

    assert_not_attempted(CountTrainable(), count_trainable=count_trainable)


def test_a_value_that_is_not_a_function_is_incorrect():
    assert_incorrect(CountTrainable(), reason_contains="should be a function", count_trainable=26)


def test_a_function_that_changes_its_input_cannot_spoil_the_reference():
    def freezes_then_counts(model):
        total = right_count(model)
        model.requires_grad_(False)  # spoils the model, not the reference's copy of it
        return total

    assert_correct(CountTrainable(), count_trainable=freezes_then_counts)


def test_tensor_results_are_compared_elementwise_and_a_wrong_shape_is_named():
    assert_correct(ScaleTensor(), scale=lambda t: t + t)
    assert_incorrect(ScaleTensor(), reason_contains="shape is wrong", scale=lambda t: (t * 2).flatten())
    assert_incorrect(ScaleTensor(), reason_contains="not right", scale=lambda t: t * 3)


# ----------------------------------------------------------------------------- signals and broken checks


def test_check_logic_can_return_incorrect_or_raise_not_attempted():
    assert_correct(ReturnsIncorrect(), answer="yes")
    assert_incorrect(ReturnsIncorrect(), reason_contains="three letters", answer="no")
    assert_not_attempted(ReturnsIncorrect(), answer="not yet")


def test_a_bug_in_the_check_gives_a_polite_check_error_with_the_exception():
    result = BrokenCheck().evaluate(answer=1)
    assert result.outcome is Outcome.CHECK_ERROR
    assert "KeyError" in result.message and "please report" in result.message
    assert isinstance(result.exception, KeyError)


def test_check_prints_the_traceback_of_a_broken_check_to_stderr(capsys):
    exec("answer = 1\nquestion.check()", {"question": BrokenCheck()})
    captured = capsys.readouterr()
    assert "The check itself failed" in captured.out
    assert "Traceback" in captured.err and "KeyError" in captured.err


def test_check_answer_returning_something_else_than_none_or_incorrect_is_a_check_error():
    class ReturnsAString(Exercise):
        variables = ["answer"]
        solution_code = "answer = 1"

        def check_answer(self, answer):
            return "wrong"

    assert ReturnsAString().evaluate(answer=1).outcome is Outcome.CHECK_ERROR


def test_assert_correct_fails_with_the_learners_message():
    with pytest.raises(AssertionError, match="too high"):
        assert_correct(CountParameters(), num_params=70_000_000)


def test_assert_message_hides_catches_a_message_that_reveals_the_value():
    leaky = Result(Outcome.INCORRECT, "num_params should be 65,783,042.")
    with pytest.raises(AssertionError, match="reveals"):
        assert_message_hides(leaky, 65_783_042)
    assert_message_hides(Result(Outcome.INCORRECT, "num_params is 165,783,042."), 65_783_042)


# ----------------------------------------------------------------------------- declaring exercises


@pytest.mark.parametrize(
    ("attributes", "error"),
    [
        ({"variables": "num_params"}, "variables must be a non-empty list"),
        ({"variables": []}, "variables must be a non-empty list"),
        ({"hints": "one hint"}, "hints must be a list"),
        ({"solution_code": ""}, "solution_code must be a non-empty string"),
        ({"expected": None}, "must set `expected`"),
    ],
)
def test_a_badly_declared_exercise_fails_when_created_naming_the_attribute(attributes, error):
    declared = {"variables": ["x"], "hints": ["h"], "solution_code": "x = 1", "expected": 1, **attributes}
    exercise_class = type("Bad", (ValueExercise,), declared)
    with pytest.raises(TypeError, match=error):
        exercise_class()


def test_a_code_exercise_needs_one_function_a_reference_and_cases():
    with pytest.raises(TypeError, match="cases"):
        type("NoCases", (CodeExercise,), {"variables": ["f"], "reference": staticmethod(abs), "solution_code": "f = abs"})()
    with pytest.raises(TypeError, match="reference"):
        type("NoReference", (CodeExercise,), {"variables": ["f"], "cases": lambda self: [(1,)], "solution_code": "f = abs"})()
    with pytest.raises(TypeError, match="exactly one function"):
        type("TwoFunctions", (CountTrainable,), {"variables": ["f", "g"]})()


def test_incorrect_needs_a_reason():
    with pytest.raises(TypeError, match="reason"):
        Incorrect("")


# ----------------------------------------------------------------------------- hints and solution


def test_hints_go_one_level_further_each_call_then_keep_showing_the_last(capsys):
    question = CountParameters()
    for _ in range(4):
        question.hint()
    shown = capsys.readouterr().out.splitlines()
    assert shown == [
        "Hint 1 of 3: Every parameter is a tensor.",
        "Hint 2 of 3: `p.numel()` counts a tensor's elements.",
        "Hint 3 of 3: Sum them.",
        "Hint 3 of 3: Sum them.",
    ]
    assert question.hints_shown == 3


def test_a_hint_level_can_be_asked_for_and_a_bad_level_is_a_clear_error(capsys):
    question = CountParameters()
    question.hint(2)
    assert capsys.readouterr().out.startswith("Hint 2 of 3:")
    for bad in (0, 4, "1", True):
        with pytest.raises(ValueError, match="level must be an int from 1 to 3"):
            question.hint(bad)


def test_an_exercise_without_hints_says_so(capsys):
    ReturnsIncorrect().hint()
    assert "no hints" in capsys.readouterr().out


def test_solution_shows_the_reference_code_dedented(capsys):
    question = CountParameters()
    question.solution()
    assert capsys.readouterr().out == "Solution:\n    num_params = sum(p.numel() for p in model.parameters())\n"
    assert question.solution_shown


# ----------------------------------------------------------------------------- notebook binding and display


def test_check_reads_the_callers_globals_and_prints_plain_text_outside_ipython(capsys):
    question = CountParameters()
    namespace = {"question": question, "____": ____}
    exec("num_params = ____\nquestion.check()", namespace)
    exec("num_params = 65_783_042\nquestion.check()", namespace)
    assert capsys.readouterr().out.splitlines() == [
        "Not attempted yet: `num_params` still holds the placeholder `____`. "
        "Replace `____` with your answer, run the cell, then check again.",
        "Correct: Well done.",
    ]
    assert question.attempts == 2


def test_check_called_inside_a_function_sees_its_local_variables(capsys):
    def cell():
        num_params = 65_783_042  # noqa: F841 (read by check() from this frame)
        CountParameters().check()

    cell()
    assert capsys.readouterr().out.startswith("Correct")


def test_check_returns_none_so_jupyter_does_not_show_the_feedback_twice(capsys):
    assert ReturnsIncorrect().check() is None


def test_the_feedback_is_markdown_with_a_coloured_label_and_plain_text_beside_it():
    result = Result(Outcome.INCORRECT, "`x` is *not* 3", title="Exercise 1")
    markdown = result._repr_markdown_()
    assert markdown == '<span style="color:#c62828">**Exercise 1: Incorrect:**</span> `x` is *not* 3'
    assert str(result) == "[Exercise 1] Incorrect: `x` is *not* 3"


def test_check_never_raises_even_when_reading_the_answer_fails(capsys):
    class Unreadable(dict):
        def items(self):
            raise RuntimeError("cannot list items")

    exec("answer = Unreadable()\nquestion.check()", {"question": ReturnsIncorrect(), "Unreadable": Unreadable})
    assert capsys.readouterr().out.startswith("Incorrect: The answer is a word of three letters.")


@pytest.fixture
def ipython_shell():
    """A real (terminal-less) IPython shell, removed afterwards so other tests see plain Python."""
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    yield shell
    InteractiveShell.clear_instance()


def test_in_ipython_check_reads_user_ns_and_displays_markdown(ipython_shell):
    from IPython.utils.capture import capture_output

    ipython_shell.user_ns["question"] = CountParameters()
    with capture_output() as captured:
        ipython_shell.run_cell("from course_utils.exercises import ____\nnum_params = ____ * 4")
        ipython_shell.run_cell("question.check()")
        ipython_shell.run_cell("num_params = 65_783_042\nquestion.check()\nquestion.solution()")
    feedback, correct, solution = (output.data for output in captured.outputs)
    assert "Not attempted yet" in feedback["text/markdown"] and "#b35c00" in feedback["text/markdown"]
    assert correct["text/plain"] == "Correct: Well done."
    assert "#2e7d32" in correct["text/markdown"]
    assert "```python\nnum_params = sum(p.numel()" in solution["text/markdown"]


# ----------------------------------------------------------------------------- decisions on the blank, odd values, time limits


@pytest.mark.parametrize("use", [bool, int, float, lambda blank: range(blank), lambda blank: 1 if blank > 0 else 2])
def test_a_decision_on_the_placeholder_says_replace_it_first(use):
    from course_utils.exercises import PlaceholderError

    with pytest.raises(PlaceholderError, match="Replace `____` with your answer first"):
        use(____)


def test_a_function_that_decides_on_the_placeholder_at_run_time_is_not_attempted():
    blank = ____  # the function reads a global that is the placeholder, not the name `____`

    def count_trainable(model):
        return 1 if blank else 0

    result = assert_not_attempted(CountTrainable(), count_trainable=count_trainable)
    assert "Replace `____`" in result.message


class Raising:
    """A learner's object whose every conversion and comparison raises."""

    def __eq__(self, other):
        raise RuntimeError("no eq")

    __bool__ = __float__ = __int__ = __index__ = __eq__
    __hash__ = object.__hash__


@pytest.mark.parametrize(
    "value",
    [10**400, -(10**400), float("inf"), float("nan"), torch.zeros(0), torch.ones(3), torch.ones(2, 2), Raising(),
     torch.empty(1, device="meta"), "65783042", b"1", 1j, [65_783_042], {65_783_042}],
    ids=lambda value: type(value).__name__,
)
def test_odd_values_are_incorrect_with_a_reason_never_a_check_failure(value):
    numpy = pytest.importorskip("numpy")
    assert_incorrect(CountParameters(), num_params=value)
    for array in (numpy.zeros(0), numpy.ones(3), numpy.array([[1.0, 2.0]])):
        assert_incorrect(CountParameters(), num_params=array)


def test_any_numeric_type_a_learner_produces_matches_within_its_own_precision():
    numpy = pytest.importorskip("numpy")
    for value in (numpy.int64(65_783_042), numpy.float64(65_783_042), numpy.array(65_783_042), numpy.array([65_783_042]),
                  torch.tensor([65_783_042]), torch.tensor([[65_783_042.0]], dtype=torch.float64),
                  torch.tensor(65_783_042.0), numpy.float32(65_783_042)):  # float32 rounds it to 65,783,040
        assert_correct(CountParameters(), num_params=value)
    assert_incorrect(CountParameters(), reason_contains="too high", num_params=numpy.float32(65_783_042 * 1.0001))


def test_a_wrong_value_in_a_one_by_one_array_is_incorrect_with_the_number():
    numpy = pytest.importorskip("numpy")
    assert_incorrect(CountParameters(), reason_contains="1,000", num_params=numpy.array([[1000]]))


def test_huge_integers_are_described_by_their_size():
    result = assert_incorrect(CountParameters(), reason_contains="about 401 digits", num_params=10**400)
    assert len(result.message) < 200


def test_articles_in_messages_are_grammatical():
    from course_utils.exercises import a_or_an, type_names

    assert [a_or_an(word) for word in ("int", "int64", "float", "uint8", "ndarray", "list")] == [
        "an int", "an int64", "a float", "a uint8", "an ndarray", "a list",
    ]
    assert type_names((int, float)) == "an int or a float"


class SizeInMiB(ValueExercise):
    variables = ["size_mib"]
    expected = 250.94
    rel_tol = 1e-3
    unit = "MiB"
    solution_code = "size_mib = n * 4 / 1024**2"


@pytest.mark.parametrize(("factor", "unit"), [(1 / 1024, "GiB"), (1024, "KiB"), (2**20, "bytes"), (2**20 / 10**6, "MB")])
def test_a_unit_slip_names_the_unit_the_value_is_in(factor, unit):
    assert_incorrect(SizeInMiB(), reason_contains=f"amount in {unit}, but MiB were asked", size_mib=250.94 * factor)


def test_an_endless_function_is_stopped_and_told_so_and_the_next_check_runs_normally():
    import time

    class Quick(CountTrainable):
        time_limit_s = 0.5
        time_limit_cause = "Does your loop ever end?"

    def endless(model):
        while True:
            pass

    def sleeps(model):
        time.sleep(30)

    def swallows_once(model):
        try:
            time.sleep(30)
        except:  # noqa: E722 (a learner's bare except swallows the first alarm; the next one stops it)
            pass
        while True:
            pass

    for function in (endless, sleeps, swallows_once):
        started = time.monotonic()
        assert_incorrect(Quick(), reason_contains=["still running after 0.5 s", "Does your loop ever end?"],
                         count_trainable=function)
        assert time.monotonic() - started < 10
    assert_correct(Quick(), count_trainable=right_count)
    time.sleep(1.2)  # no alarm left armed: nothing fires after the checks


def test_the_time_limit_also_works_outside_the_main_thread():
    import threading

    outcome = []

    def endless(model):
        while True:
            pass

    class Quick(CountTrainable):
        time_limit_s = 0.5

    thread = threading.Thread(target=lambda: outcome.append(Quick().evaluate(count_trainable=endless)))
    thread.start()
    thread.join(20)
    assert not thread.is_alive() and outcome[0].outcome is Outcome.INCORRECT
    assert "still running" in outcome[0].message


def test_a_diagnosis_that_fails_on_an_odd_value_falls_back_to_the_generic_reason():
    assert_incorrect(CountTrainable(), reason_contains="not right", count_trainable=lambda model: torch.ones(3))


def test_the_time_limit_leaves_an_alarm_someone_else_set_alone():
    import signal
    import time

    fired = []
    previous = signal.signal(signal.SIGALRM, lambda signum, frame: fired.append(signum))
    signal.setitimer(signal.ITIMER_REAL, 2.0)
    try:
        class Quick(CountTrainable):
            time_limit_s = 0.5

        def endless(model):
            while True:
                pass

        assert_incorrect(Quick(), reason_contains="still running", count_trainable=endless)
        assert signal.getitimer(signal.ITIMER_REAL)[0] > 0  # the other alarm is still armed
        time.sleep(2.0)
        assert fired == [signal.SIGALRM]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
