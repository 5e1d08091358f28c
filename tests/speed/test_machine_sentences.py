"""Every sentence lessons 5 and 8 print about this machine's speed is built from the run's numbers and the CPU's
reported features: each wording is forced here with numbers of every kind, so none depends on the CPU the tests run on."""

import pytest

from course_utils import cpu_features, speed

FAST = speed.Timing((0.010, 0.011, 0.010, 0.012, 0.011))
SLOW = speed.Timing((0.020, 0.021, 0.022, 0.020, 0.021))
OVERLAPPING = speed.Timing((0.009, 0.013, 0.011, 0.015, 0.010))

ZEN4 = """vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 17
cpu MHz\t\t: 2596.146
flags\t\t: fpu sse2 fma avx2 avx512f avx512_bf16 avx512_vnni
"""
SAPPHIRE_RAPIDS = """vendor_id\t: GenuineIntel
cpu family\t: 6
cpu MHz\t\t: 2000.000
flags\t\t: fpu fma avx2 avx512f avx512_bf16 avx512_fp16 amx_bf16 amx_tile
"""
SKYLAKE_SP = """vendor_id\t: GenuineIntel
cpu family\t: 6
cpu MHz\t\t: 2500.000
flags\t\t: fpu fma avx2 avx512f avx512dq
"""
AVX2_ONLY = """vendor_id\t: AuthenticAMD
cpu family\t: 23
cpu MHz\t\t: 3000.000
flags\t\t: fpu fma avx2
"""


# ---------------------------------------------------------------- comparing two timings


def test_a_verdict_is_faster_or_slower_only_when_the_middle_halves_do_not_overlap():
    assert speed.verdict("a", FAST, "b", SLOW).outcome == "faster"
    assert speed.verdict("b", SLOW, "a", FAST).outcome == "slower"
    assert "1.91x faster" in speed.verdict("a", FAST, "b", SLOW).sentence()
    assert "1.91x slower" in speed.verdict("b", SLOW, "a", FAST).sentence()


def test_overlapping_runs_are_too_noisy_to_tell_whatever_the_medians_say():
    result = speed.verdict("a", OVERLAPPING, "b", FAST)
    assert result.outcome == "noisy"
    assert "too noisy to tell" in result.sentence() and "faster" not in result.sentence()


def test_fewer_runs_than_needed_are_too_few_to_tell():
    result = speed.verdict("a", speed.Timing((0.001, 0.001)), "b", SLOW)
    assert result.outcome == "too few runs" and "too few runs to tell" in result.sentence()


# ---------------------------------------------------------------- the first call


@pytest.mark.parametrize("first, says, never", [
    (0.030, "longer than every timed run", "too noisy"),
    (0.005, "too noisy to show a first-call cost", "longer than"),
    (0.011, "within the range of the timed runs", "longer than"),
])
def test_the_first_call_sentence_follows_where_the_first_call_falls(first, says, never):
    sentence = speed.first_call_sentence(first, FAST)
    assert says in sentence and never not in sentence


# ---------------------------------------------------------------- what the CPU reports


def test_matrix_units_are_read_from_the_flags_and_can_be_forced():
    assert cpu_features.cpu_matrix_units(cpu_features.cpu_flags(SAPPHIRE_RAPIDS)) == ("AMX-BF16", "AVX512-BF16")
    assert cpu_features.cpu_matrix_units(cpu_features.cpu_flags(ZEN4)) == ("AVX512-BF16",)
    assert cpu_features.cpu_matrix_units(cpu_features.cpu_flags(SKYLAKE_SP)) == ()
    assert cpu_features.cpu_flags("no flags line here") == frozenset() and cpu_features.cpu_matrix_units(frozenset()) == ()


@pytest.mark.parametrize("cpuinfo, fp32_per_cycle, bf16_per_cycle, clock_mhz", [
    (ZEN4, 32, 64, 2596.146),
    (SAPPHIRE_RAPIDS, 64, 1024, 2000.0),
    (SKYLAKE_SP, 64, None, 2500.0),
    (AVX2_ONLY, 32, None, 3000.0),
])
def test_the_theoretical_peak_is_cores_times_clock_times_flops_per_cycle(cpuinfo, fp32_per_cycle, bf16_per_cycle, clock_mhz):
    peak = speed.cpu_peak(cores=2, cpuinfo=cpuinfo)
    assert peak.flops["fp32"] == pytest.approx(2 * clock_mhz * 1e6 * fp32_per_cycle)
    assert peak.flops.get("bf16") == (None if bf16_per_cycle is None else pytest.approx(2 * clock_mhz * 1e6 * bf16_per_cycle))
    assert any("MHz" in figure for figure in peak.read) and all("(" in source for source in peak.assumed)


def test_a_cpu_the_table_does_not_know_has_no_theoretical_peak():
    assert speed.cpu_peak(cpuinfo="vendor_id\t: ARM\ncpu MHz\t: 1000\nflags\t: neon\n") is None
    with pytest.raises(ValueError, match="cores"):
        speed.cpu_peak(cores=0, cpuinfo=ZEN4)


# ---------------------------------------------------------------- bf16 against fp32


MIDDLE = speed.Timing((0.015, 0.016, 0.015, 0.017, 0.016))


@pytest.mark.parametrize("fp32, bf16, units, says, never", [
    (MIDDLE, FAST, ("AVX512-BF16",), "faster than fp32", "converting to fp32"),
    (MIDDLE, SLOW, ("AVX512-BF16",), "slower than fp32", "converting to fp32"),
    (MIDDLE, SLOW, (), "reports no bf16 matrix units", "are native"),
    (FAST, OVERLAPPING, ("AMX-BF16",), "too noisy to tell", "faster than"),
    (MIDDLE, FAST, None, "unknown", "native"),
])
def test_the_bf16_sentence_follows_the_timings_and_the_reported_units(fp32, bf16, units, says, never):
    sentence = speed.bf16_sentence("fp32", fp32, "bf16", bf16, units)
    assert says in sentence and never not in sentence and "emulated" not in sentence


# ---------------------------------------------------------------- compile payback


def test_a_measurable_gain_gives_a_payback_per_shape():
    one = speed.compile_payback_sentence(10.0, SLOW, FAST)
    three = speed.compile_payback_sentence(10.0, SLOW, FAST, shapes=3)
    assert "paid back after 1,000 steps" in one and "paid back after 3,000 steps" in three
    assert "recompilation" in one and "pays again" in one


@pytest.mark.parametrize("compiled, says", [(OVERLAPPING, "too noisy to tell"), (SLOW, "slower than eager")])
def test_no_gain_the_spread_shows_means_no_payback_claimed(compiled, says):
    sentence = speed.compile_payback_sentence(10.0, FAST, compiled)
    assert says in sentence and "paid back after" not in sentence and "not won back" in sentence


def test_the_payback_sentence_names_its_bad_arguments():
    with pytest.raises(ValueError, match="compile_seconds"):
        speed.compile_payback_sentence(float("nan"), SLOW, FAST)
    with pytest.raises(ValueError, match="shapes"):
        speed.compile_payback_sentence(1.0, SLOW, FAST, shapes=0)


# ---------------------------------------------------------------- which SDPA kernel ran


@pytest.mark.parametrize("names, says", [
    (["aten::scaled_dot_product_attention", "aten::_scaled_dot_product_flash_attention_for_cpu"], "flash-attention-style"),
    (["aten::_scaled_dot_product_efficient_attention"], "memory-efficient"),
    (["aten::scaled_dot_product_attention", "aten::_scaled_dot_product_attention_math"], "math fallback"),
    ([], "no SDPA operator"),
])
def test_the_sdpa_sentence_names_the_kernel_the_profiler_saw(names, says):
    assert says in speed.sdpa_kernel_sentence(names)


# ---------------------------------------------------------------- why a bf16 step gains less than its matrix products


def test_time_by_kind_splits_a_profile_into_matrix_products_casts_and_the_rest():
    import torch

    weight, x = torch.randn(32, 32), torch.randn(8, 32)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            torch.nn.functional.linear(x, weight).relu()
    kinds = speed.time_by_kind(profile)
    assert set(kinds) == {"matrix products", "casts", "other"}
    assert kinds["matrix products"] > 0 and kinds["casts"] > 0 and kinds["other"] > 0


STEP_FASTER = speed.verdict("bf16", FAST, "fp32", SLOW)
STEP_SLOWER = speed.verdict("bf16", SLOW, "fp32", FAST)


def kinds(matrix_products, casts, other=SLOW):
    return {"matrix products": matrix_products, "casts": casts, "other": other}


def ms(*values):
    return speed.Timing(tuple(v / 1e3 for v in values))


FP32_KINDS = kinds(ms(10, 10.5, 11), ms(1, 1, 1))


@pytest.mark.parametrize("step, bf16_kinds, says", [
    (STEP_FASTER, kinds(ms(4, 4.5, 5), ms(2, 2, 2)), "the gain is in the matrix products"),
    (STEP_FASTER, kinds(ms(8, 11, 12), ms(2, 2, 2)), "do not show measurably where the gain came from"),
    (STEP_SLOWER, kinds(ms(20, 21, 22), ms(5, 5, 5)), "themselves are slower in bf16"),
    (STEP_SLOWER, kinds(ms(9, 10.6, 12), ms(5, 5, 5)), "no measurable gain inside the step"),
    (STEP_SLOWER, kinds(ms(8, 8.2, 8.4), ms(5, 5, 5)), "the casts autocast adds cost as much"),
    (STEP_SLOWER, kinds(ms(2, 2.1, 2.2), ms(2, 2, 2)), "or the spread, decides here"),
])
def test_the_bf16_cause_follows_the_profiled_times_and_their_spread(step, bf16_kinds, says):
    sentence = speed.bf16_cause_sentence(step, FP32_KINDS, bf16_kinds)
    assert says in sentence and "emulat" not in sentence and "over 3 profiled steps" in sentence


def test_the_bf16_cause_refuses_what_is_not_timings_by_kind():
    with pytest.raises(ValueError, match="bf16_kinds"):
        speed.bf16_cause_sentence(STEP_SLOWER, FP32_KINDS, {"matrix products": 1.0, "casts": 1.0, "other": 1.0})


# ---------------------------------------------------------------- what memory spent on a larger batch buys


@pytest.mark.parametrize("larger, says, never", [
    (FAST, "bought speed here", "no speed"),
    (SLOW, "bought no speed", "bought speed here"),
    (OVERLAPPING, "too noisy to tell", "bought speed here"),
])
def test_the_larger_batch_sentence_follows_the_per_token_verdict(larger, says, never):
    sentence = speed.larger_batch_sentence(speed.verdict("batch 32", larger, "batch 8", MIDDLE if larger is not OVERLAPPING else FAST), 3 * 2**20)
    assert says in sentence and never not in sentence and "3.0 MiB more" in sentence


@pytest.mark.parametrize("call, argument", [
    (lambda: cpu_features.cpu_flags(cpuinfo=b"flags: fma"), "cpuinfo"),
    (lambda: cpu_features.cpu_matrix_units("avx512_bf16"), "flags"),
    (lambda: speed.cpu_peak(cpuinfo=3), "cpuinfo"),
    (lambda: speed.bf16_sentence("fp32", FAST, "bf16", SLOW, "AMX"), "matrix_units"),
    (lambda: speed.sdpa_kernel_sentence("aten::mm"), "kernel_names"),
    (lambda: speed.time_by_kind([]), "profile"),
    (lambda: speed.verdict("a", (0.1, 0.2), "b", FAST), "timing_a"),
    (lambda: speed.first_call_sentence(-1.0, FAST), "first_seconds"),
    (lambda: speed.larger_batch_sentence("faster", 1.0), "per_token"),
])
def test_each_sentence_function_names_its_bad_argument(call, argument):
    with pytest.raises((TypeError, ValueError), match=argument):
        call()


@pytest.mark.parametrize("measured, says", [(48e9, "reached 50%"), (200e9, "above it"), (1e9, "reached 1%")])
def test_the_peak_sentence_sets_the_measured_matmul_beside_the_theoretical_peak(measured, says):
    assert says in speed.peak_sentence(speed.cpu_peak(cpuinfo=AVX2_ONLY), measured)


def test_without_a_theoretical_peak_the_sentence_says_so():
    assert "No theoretical bf16 peak" in speed.peak_sentence(speed.cpu_peak(cpuinfo=SKYLAKE_SP), 1e9, "bf16")
    assert "No theoretical fp32 peak" in speed.peak_sentence(None, 1e9)
