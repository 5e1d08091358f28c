"""Lesson 10's exercises: the fastest layout that fits is judged with the planner and the time model, any layout as
fast accepted; each classic mistake in a memory estimate is named; the days of a budget are judged on built rows."""

import pytest
from exercise_helpers import (
    assert_correct,
    assert_handles_bad_answers,
    assert_incorrect,
    assert_lesson_shows_the_solution,
    assert_not_attempted,
    assert_odd_answers_are_judged,
    learner_function,
    lesson_path,
)

from course_utils import hardware, memory, plan
from course_utils.exercises import ____, lesson10
from course_utils.layouts import Layout

LESSON = lesson_path("10")
CAPACITY = hardware.card(lesson10.CLUSTER["card"]).memory.value
GIB = 1024**3


@pytest.mark.parametrize("number", [1, 2])
def test_the_lesson_shows_each_reference_solution(number):
    assert_lesson_shows_the_solution(getattr(lesson10, f"q{number}"), LESSON, f"ex.q{number}.check()")


# ---------------------------------------------------------------- q1: the fastest layout that fits


def fastest_fitting_layout():
    rows = [row for row in lesson10.planned_rows() if row["fits"]]
    return max(rows, key=lambda row: row["time"].tokens_per_second)["layout"]


def test_q1_the_starter_is_not_attempted():
    assert_not_attempted(lesson10.q1, my_layout=____)


def test_q1_the_fastest_fitting_layout_passes_and_fsdp_is_zero3_by_another_name():
    best = fastest_fitting_layout()
    assert_correct(lesson10.q1, my_layout=best)
    if best == "zero3":
        assert_correct(lesson10.q1, my_layout="fsdp")


def test_q1_every_layout_that_does_not_fit_is_refused_with_its_memory():
    for row in lesson10.planned_rows():
        if row["fits"] is False:
            assert_incorrect(lesson10.q1, ["needs", "the card has"], my_layout=row["layout"])


def test_q1_a_name_that_is_no_layout_is_told_the_layouts():
    assert_incorrect(lesson10.q1, "not one of the layouts", my_layout="tensor parallel")


@pytest.mark.parametrize("layout", ["zero1+tp16", "ddp+tp32", "zero3+tp16+pp2x1"])
def test_q1_tensor_parallelism_across_nodes_is_told_what_its_all_reduces_cost_on_the_network(layout):
    assert_incorrect(lesson10.q1, ["across", "nodes", "InfiniBand", "nvlink", "Keep tp at most 8"], my_layout=layout)


def test_the_tp_across_nodes_diagnosis_gives_the_time_models_numbers():
    from course_utils import plan, step_time

    text = lesson10.diagnose_tensor_parallel("zero1+tp16")
    workload = step_time.workload_of(plan.load_model("Llama 3.1 70B", "bf16", True))
    cluster = step_time.gpu_cluster("H100 SXM", 8, 4, "bf16", lesson10.CLUSTER["network"])
    predicted = step_time.predict_step(workload, cluster, "zero1", 1, 4096, checkpointing=True, tp=16)
    tp = [(w, sec) for name, w, sec in predicted.communication if name.startswith("tp ")]
    assert f"{sum(sec for _, sec in tp):.3g} s exposed" in text
    assert f"{sum(w for w, _ in tp) / cluster.intra.bandwidth:.3g} s for the same bytes" in text
    assert sum(sec for _, sec in tp) > predicted.compute  # across nodes the all-reduces outweigh the arithmetic


def test_q1_tensor_parallel_layouts_inside_a_node_are_judged_by_planned_memory_and_predicted_time():
    rows = lesson10.planned_rows()
    best = max(row["time"].tokens_per_second for row in rows if row["fits"])
    inside = [row for row in rows if plan.parse_layout(row["layout"], 32).tp > 1]
    assert inside and all(row["peak"] is not None for row in inside)  # planned, not left out
    for row in inside:
        if row["fits"] and row["time"].tokens_per_second >= (1 - lesson10.TOLERANCE) * best:
            assert_correct(lesson10.q1, my_layout=row["layout"])
        elif row["fits"]:
            assert_incorrect(lesson10.q1, "another layout that fits is predicted faster", my_layout=row["layout"])
        else:
            assert_incorrect(lesson10.q1, ["needs", "the card has"], my_layout=row["layout"])


def test_q1_a_layout_the_search_did_not_plan_is_planned_and_judged_like_the_others():
    # sequence parallelism is not in the search: the check plans it, and judges it by that plan
    (row,) = plan.plan_layouts(lesson10.RUN["model"], **lesson10.CLUSTER, seq_len=4096, batch_size=1,
                               checkpointing=True, precision="bf16", layout="zero3+tp8sp")
    best = max(r["time"].tokens_per_second for r in (*lesson10.planned_rows(), row) if r["fits"])
    if row["peak"] is None:
        assert_incorrect(lesson10.q1, ["does not plan the memory", row["not_planned"][:40]], my_layout="zero3+tp8sp")
    elif row["fits"] and row["time"].tokens_per_second >= (1 - lesson10.TOLERANCE) * best:
        assert_correct(lesson10.q1, my_layout="zero3+tp8sp")
    else:
        assert_incorrect(lesson10.q1, ["zero3+tp8sp"], my_layout="zero3+tp8sp")


def test_q1_a_layout_the_planner_refuses_is_told_the_planners_reason():
    # DDP over split layers: the planner refuses it (tensor_parallel_step), and the check says so in its words
    model = plan.load_model(lesson10.RUN["model"], "bf16", True)
    with pytest.raises(memory.PlannerRefused) as refusal:
        memory.estimate_training_memory(model, "adamw", 1, 4096, layout=Layout("zero1", 32, tp=8), rank=0)
    assert_incorrect(lesson10.q1, ["does not plan the memory", " ".join(str(refusal.value).split())[:60]],
                     my_layout="zero1+tp8")


def test_q1_a_layout_that_does_not_divide_the_cluster_is_told_so():
    assert_incorrect(lesson10.q1, "does not divide", my_layout="zero1+tp3")
    assert_incorrect(lesson10.q1, "cannot run on this cluster", my_layout="none+tp4")
    assert_incorrect(lesson10.q1, "cannot run on this cluster", my_layout="zero3+pp3")


def test_q1_odd_answers_are_judged():
    assert_handles_bad_answers(lesson10.q1, my_layout=fastest_fitting_layout())
    assert_odd_answers_are_judged(lesson10.q1, my_layout=fastest_fitting_layout())


def planned_row(layout, weights, gradients, optimizer_state, activations, world_size=32):
    """A row as plan_layouts gives it, its peak the sum of its parts (GiB)."""
    parts = [weights, gradients, optimizer_state, activations]
    return {"layout": layout, "world_size": world_size, "weights": weights * GIB, "gradients": gradients * GIB,
            "optimizer_state": optimizer_state * GIB, "activations": activations * GIB, "peak": sum(parts) * GIB}


def test_a_layout_that_fits_only_without_its_optimizer_state_is_told_so():
    row = planned_row("zero1", 30, 30, 40, 10)
    assert "optimizer state" in lesson10.diagnose_layout(row, 80 * GIB)


def test_a_zero_layout_that_fits_only_if_activations_divided_is_told_that_they_do_not():
    row = planned_row("zero3", 4, 4, 2, 75)
    assert "never activations" in lesson10.diagnose_layout(row, 80 * GIB)


def test_zero2_too_large_is_told_that_it_keeps_the_gathered_weights():
    row = planned_row("zero2", 131, 4, 8, 7)
    assert "gathered weights" in lesson10.diagnose_layout(row, 80 * GIB)


# ---------------------------------------------------------------- q2: days for a token budget


def test_q2_the_starter_is_not_attempted():
    assert_not_attempted(lesson10.q2, days_for_budget=lambda tokens, row: ____)


def test_q2_the_reference_and_another_correct_form_pass():
    assert_correct(lesson10.q2, days_for_budget=learner_function(lesson10.q2.solution_code, "days_for_budget"))
    through_the_step = """
    def days_for_budget(tokens, row):
        tokens_per_step = row["time"].tokens_per_second * row["time"].step
        return tokens / tokens_per_step * row["time"].step / (24 * 3600)
    """
    assert_correct(lesson10.q2, days_for_budget=learner_function(through_the_step, "days_for_budget"))


@pytest.mark.parametrize("mistake, reason", [
    ("tokens / row['time'].tokens_per_second / 3600", "hours"),
    ("tokens / row['time'].tokens_per_second", "seconds"),
    ("tokens / (row['time'].tokens_per_second / row['world_size']) / 86400", "one process's rate"),
    ("tokens / (row['time'].tokens_per_second * row['world_size']) / 86400", "do not multiply"),
    ("float('nan')", "NaN"),
])
def test_q2_each_classic_mistake_is_named(mistake, reason):
    assert_incorrect(lesson10.q2, reason, days_for_budget=eval(f"lambda tokens, row: {mistake}"))  # noqa: S307


def test_q2_odd_answers_are_judged():
    assert_odd_answers_are_judged(lesson10.q2,
                                  days_for_budget=learner_function(lesson10.q2.solution_code, "days_for_budget"))
