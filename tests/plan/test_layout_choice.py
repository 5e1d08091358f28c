"""The recommendation is the fitting layout of the most predicted tokens/s; what would change it is computed from the rows."""

from course_utils import layout_choice, step_time

GIB = 1024**3


def row(layout, peak_gib, tokens_per_second, exposed=0.0):
    seconds = 4096 / tokens_per_second
    time = step_time.StepTime(compute=seconds - exposed, recompute=0.0, communication=(), exposed=exposed,
                              optimizer=0.0, step=seconds, tokens_per_second=tokens_per_second, mfu=0.5, hfu=0.5,
                              model_flops=1.0, hardware_flops=1.0)
    return {"layout": layout, "world_size": 8, "peak": peak_gib * GIB, "time": time}


ROWS = [row("zero2", 100, 9_000), row("zero3", 40, 8_000, exposed=0.1), row("ddp", 60, 7_000)]


def test_the_fastest_layout_that_fits_is_recommended_not_the_fastest():
    choice = layout_choice.recommend(ROWS, 80 * GIB)
    assert choice["row"]["layout"] == "zero3"
    assert any("ddp" in reason and "7,000" in reason for reason in choice["reasons"])
    assert any("zero2 (100.0 GiB)" in reason for reason in choice["reasons"])


def test_nothing_is_recommended_when_nothing_fits():
    assert layout_choice.recommend(ROWS, 10 * GIB) is None


def test_a_faster_layout_that_does_not_fit_is_told_the_memory_it_lacks_and_that_it_would_win():
    sentences = layout_choice.what_would_change(ROWS, 80 * GIB)
    zero2 = next(s for s in sentences if s.startswith("zero2"))
    assert "20.0 GiB more per card" in zero2 and "would be chosen" in zero2
    ddp = next(s for s in sentences if s.startswith("ddp"))
    assert "fits, but its compute" in ddp
    assert not any(s.startswith("zero3") for s in sentences)


def test_a_layout_whose_memory_is_not_planned_is_never_recommended_and_says_why():
    unplanned = {**row("none+pp8x1", 1, 20_000), "peak": None, "fits": None,
                 "not_planned": "the pipeline planner follows fp32 steps"}
    choice = layout_choice.recommend([*ROWS, unplanned], 80 * GIB)
    assert choice["row"]["layout"] == "zero3"  # faster, but its memory is unknown
    sentence = next(s for s in layout_choice.what_would_change([*ROWS, unplanned], 80 * GIB)
                    if s.startswith("none+pp8x1"))
    assert "not planned" in sentence and "the pipeline planner follows fp32 steps" in sentence


def test_layouts_whose_steps_hold_different_tokens_are_compared_over_the_same_tokens():
    def timed(layout, tokens, compute, exposed):
        time = step_time.StepTime(compute=compute, recompute=0.0, communication=(), exposed=exposed, optimizer=0.0,
                                  step=compute + exposed, tokens_per_second=tokens / (compute + exposed), mfu=0.5,
                                  hfu=0.5, model_flops=1.0, hardware_flops=1.0)
        return {"layout": layout, "world_size": 8, "peak": 30 * GIB, "time": time}

    # a tensor-parallel row trains 4096 tokens a step, the chosen one 8192: over 8192 tokens its compute is
    # 2 x 0.4 s, the chosen's 0.8 s; its exposed communication 2 x 0.1 s, the chosen's none
    half, chosen = timed("zero3+tp2", 4096, 0.4, 0.1), timed("zero3", 8192, 0.8, 0.0)
    (sentence,) = layout_choice.what_would_change([chosen, half], 80 * GIB)
    assert sentence.startswith("zero3+tp2: fits, but its exposed communication takes 0.2 s longer over the tokens of "
                               "one zero3 step"), sentence
