"""Bad input to lesson 8's new public functions is refused at once, naming the argument (as test_bad_input.py does).

One row per bad call: the wrong type, 0, a negative number, a shape that does
not fit, an empty list. Each row names the exception and a fragment of its
message that names the argument.
"""

from __future__ import annotations

import pytest
import torch

from course_utils import chunked_loss, compiling, cpu_features, input_pipeline, profiling, shapes, speed, utilisation
from course_utils.exercises import lesson8 as lesson8_exercises
from course_utils.exercises.limits import time_limit

HANG_SECONDS = 30
NAN = float("nan")


def _hidden():
    return torch.randn(4, 3)


def _weight():
    return torch.randn(5, 3)


def _labels():
    return torch.tensor([0, 1, 2, 3])


def _tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=20, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=16))


def _timing():
    return speed.Timing((0.010, 0.011, 0.012))


def _loader():
    return torch.utils.data.DataLoader(list(range(4)), batch_size=2)


ROWS = [
    # utilisation
    ("count_flops not callable", lambda: utilisation.count_flops(3), TypeError, "function"),
    ("describe_recomputation flops_plain=0", lambda: utilisation.describe_recomputation(0, 8.0), ValueError, "flops_plain"),
    ("describe_recomputation flops_checkpointed=nan", lambda: utilisation.describe_recomputation(6.0, NAN),
     ValueError, "flops_checkpointed"),
    ("describe_recomputation flops_plain='6'", lambda: utilisation.describe_recomputation("6", 8.0), ValueError,
     "flops_plain"),
    # shapes
    ("padded_to_multiple size=0", lambda: shapes.padded_to_multiple(0, 64), ValueError, "size"),
    ("padded_to_multiple multiple=-8", lambda: shapes.padded_to_multiple(50_257, -8), ValueError, "multiple"),
    ("padded_to_multiple multiple=8.0", lambda: shapes.padded_to_multiple(50_257, 8.0), ValueError, "multiple"),
    ("arithmetic_intensity two dims", lambda: shapes.arithmetic_intensity((2, 3)), ValueError, "shape"),
    ("arithmetic_intensity bytes=0", lambda: shapes.arithmetic_intensity((2, 3, 4), 0), ValueError,
     "bytes_per_element"),
    ("matmul_flops negative dim", lambda: shapes.matmul_flops((2, -3, 4)), ValueError, "shape"),
    ("time_matmuls empty", lambda: shapes.time_matmuls([]), ValueError, "shapes"),
    ("time_matmuls bad shape", lambda: shapes.time_matmuls([(2, 3)]), ValueError, "shapes"),
    ("time_matmuls repeats=0", lambda: shapes.time_matmuls([(2, 3, 4)], repeats=0), ValueError, "repeats"),
    ("time_matmuls flops_per_call=0", lambda: shapes.time_matmuls([(2, 3, 4)], flops_per_call=0), ValueError,
     "flops_per_call"),
    ("time_matmuls dtype='float32'", lambda: shapes.time_matmuls([(2, 3, 4)], dtype="float32"), TypeError, "dtype"),
    ("gflops timing=0.1", lambda: shapes.gflops((2, 3, 4), 0.1), TypeError, "timing"),
    ("describe_shape_pair timing_a list", lambda: shapes.describe_shape_pair(
        "a", (1, 1, 1), [1.0], "b", (1, 1, 1), speed.Timing((1.0,))), TypeError, "timing_a"),
    ("describe_shape_pair shape_b bad", lambda: shapes.describe_shape_pair(
        "a", (1, 1, 1), speed.Timing((1.0,)), "b", (1, 0, 1), speed.Timing((1.0,))), ValueError, "shape"),
    # profiling
    ("operator_calls not callable", lambda: profiling.operator_calls(None), TypeError, "function"),
    ("profile_on_schedule step not callable", lambda: profiling.profile_on_schedule(1), TypeError, "step"),
    ("profile_on_schedule active=0", lambda: profiling.profile_on_schedule(lambda: None, active=0), ValueError, "active"),
    ("profile_on_schedule wait=-1", lambda: profiling.profile_on_schedule(lambda: None, wait=-1), ValueError, "wait"),
    ("profile_on_schedule warmup=1.5", lambda: profiling.profile_on_schedule(lambda: None, warmup=1.5), ValueError,
     "warmup"),
    ("profile_on_schedule repeat=0", lambda: profiling.profile_on_schedule(lambda: None, repeat=0), ValueError, "repeat"),
    ("describe_foreach_calls loop_calls list", lambda: profiling.describe_foreach_calls(
        [], {}, "aten::mul_", "aten::_foreach_mul_"), TypeError, "loop_calls"),
    ("describe_foreach_calls foreach_calls None", lambda: profiling.describe_foreach_calls(
        {}, None, "aten::mul_", "aten::_foreach_mul_"), TypeError, "foreach_calls"),
    # input pipeline
    ("WithReadLatency dataset=3", lambda: input_pipeline.WithReadLatency(3, 0.001), TypeError, "dataset"),
    ("WithReadLatency seconds=-1", lambda: input_pipeline.WithReadLatency([1], -1), ValueError, "seconds"),
    ("WithReadLatency seconds=5", lambda: input_pipeline.WithReadLatency([1], 5), ValueError, "seconds"),
    ("time_epochs loader list", lambda: input_pipeline.time_epochs([1, 2], print), TypeError, "loader"),
    ("time_epochs step not callable", lambda: input_pipeline.time_epochs(_loader(), 3), TypeError, "step"),
    ("time_epochs epochs=0", lambda: input_pipeline.time_epochs(_loader(), print, epochs=0), ValueError, "epochs"),
    ("describe_extra_wait empty", lambda: input_pipeline.describe_extra_wait([], [0.1], False), ValueError,
     "extra_wait"),
    ("describe_extra_wait nan", lambda: input_pipeline.describe_extra_wait([0.1], [NAN], False), ValueError,
     "step_difference"),
    ("describe_extra_wait rounds differ", lambda: input_pipeline.describe_extra_wait([0.1, 0.2], [0.1], False),
     ValueError, "step_difference"),
    ("describe_extra_wait epochs_differ=1", lambda: input_pipeline.describe_extra_wait([0.1], [0.1], 1), TypeError,
     "epochs_differ"),
    ("describe_first_batch_waits missing name", lambda: input_pipeline.describe_first_batch_waits(
        {"a": [0.1]}, "a", "b"), ValueError, "first_batch_waits"),
    ("describe_first_batch_waits negative", lambda: input_pipeline.describe_first_batch_waits(
        {"a": [0.1], "b": [-0.1]}, "a", "b"), ValueError, "first_batch_waits"),
    # chunked loss
    ("chunked_cross_entropy hidden list", lambda: chunked_loss.chunked_cross_entropy([[1.0]], _weight(), _labels()),
     TypeError, "hidden"),
    ("chunked_cross_entropy widths differ", lambda: chunked_loss.chunked_cross_entropy(
        _hidden(), torch.randn(5, 4), _labels()), ValueError, "weight"),
    ("chunked_cross_entropy labels float", lambda: chunked_loss.chunked_cross_entropy(
        _hidden(), _weight(), _labels().float()), ValueError, "labels"),
    ("chunked_cross_entropy labels short", lambda: chunked_loss.chunked_cross_entropy(
        _hidden(), _weight(), _labels()[:2]), ValueError, "labels"),
    ("chunked_cross_entropy all ignored", lambda: chunked_loss.chunked_cross_entropy(
        _hidden(), _weight(), torch.full((4,), chunked_loss.IGNORE_INDEX)), ValueError, "labels"),
    ("chunked_cross_entropy chunk_size=0", lambda: chunked_loss.chunked_cross_entropy(
        _hidden(), _weight(), _labels(), chunk_size=0), ValueError, "chunk_size"),
    ("ChunkedLossLM model=Linear", lambda: chunked_loss.ChunkedLossLM(torch.nn.Linear(2, 2)), TypeError, "model"),
    ("ChunkedLossLM model='llama'", lambda: chunked_loss.ChunkedLossLM("llama"), TypeError, "model"),
    ("ChunkedLossLM chunk_size=-1", lambda: chunked_loss.ChunkedLossLM(_tiny_llama(), chunk_size=-1), ValueError,
     "chunk_size"),
    # the sentences lessons 5 and 8 build from the learner's own run (issue 31), and what feeds them
    ("cpu_matrix_units flags='avx512_bf16' (a bare string)", lambda: cpu_features.cpu_matrix_units("avx512_bf16"),
     TypeError, "flags"),
    ("cpu_peak cores=0", lambda: speed.cpu_peak(0), ValueError, "cores"),
    ("cpu_peak cpuinfo=3", lambda: speed.cpu_peak(cpuinfo=3), TypeError, "cpuinfo"),
    ("verdict timing_a=(0.1, 0.2)", lambda: speed.verdict("a", (0.1, 0.2), "b", _timing()), TypeError, "timing_a"),
    ("first_call_sentence first_seconds=-1", lambda: speed.first_call_sentence(-1.0, _timing()), ValueError,
     "first_seconds"),
    ("bf16_sentence matrix_units='AMX'", lambda: speed.bf16_sentence("fp32", _timing(), "bf16", _timing(), "AMX"),
     TypeError, "matrix_units"),
    ("peak_sentence measured_flops=nan", lambda: speed.peak_sentence(None, NAN), ValueError, "measured_flops"),
    ("larger_batch_sentence per_token='faster'", lambda: speed.larger_batch_sentence("faster", 1.0), TypeError,
     "per_token"),
    ("time_by_kind profile=[]", lambda: speed.time_by_kind([]), TypeError, "profile"),
    ("bf16_cause_sentence step=None", lambda: speed.bf16_cause_sentence(None, {}, {}), TypeError, "step"),
    ("compile_payback_sentence compile_seconds=-1",
     lambda: speed.compile_payback_sentence(-1.0, _timing(), _timing()), ValueError, "compile_seconds"),
    ("compile_payback_sentence shapes=0", lambda: speed.compile_payback_sentence(1.0, _timing(), _timing(), 0),
     ValueError, "shapes"),
    ("sdpa_kernel_sentence kernel_names='aten::mm'", lambda: speed.sdpa_kernel_sentence("aten::mm"), TypeError,
     "kernel_names"),
    ("time_compiling_call call=5", lambda: compiling.time_compiling_call(5), TypeError, "call"),
    ("time_compiling_call use_caches='yes'", lambda: compiling.time_compiling_call(lambda: None, "yes"), TypeError,
     "use_caches"),
    ("draw_cases seed=-1", lambda: lesson8_exercises.draw_cases(-1), ValueError, "seed"),
]


@pytest.mark.parametrize(("label", "call", "error", "fragment"), ROWS, ids=[row[0] for row in ROWS])
def test_bad_input_is_refused_naming_the_argument(label, call, error, fragment):
    with time_limit(HANG_SECONDS), pytest.raises(error) as raised:
        call()
    assert fragment in str(raised.value), f"{label}: {type(raised.value).__name__}: {raised.value}"
