"""Specification of course_utils.quantization: block-wise 8-bit codes and Adafactor's factored second moment."""

import math
import subprocess
import sys

import pytest
import torch

from course_utils import memory
from course_utils.quantization import (
    BITSANDBYTES_BLOCK_SIZE,
    BITSANDBYTES_MIN_8BIT_SIZE,
    BlockwiseQuantized,
    dequantize_blockwise,
    eight_bit_state_bytes,
    factor_second_moment,
    factored_state_elements,
    quantize_blockwise,
    reconstruct_second_moment,
)


# --------------------------------------------------------------------------- block-wise quantisation


def test_quantized_tensor_holds_one_int8_code_per_element_and_one_fp32_scale_per_block():
    tensor = torch.randn(1000)
    quantized = quantize_blockwise(tensor, block_size=256)
    assert quantized.codes.dtype == torch.int8 and quantized.codes.numel() == 1000
    assert quantized.absmax.dtype == torch.float32 and quantized.absmax.numel() == math.ceil(1000 / 256)
    assert quantized.nbytes == 1000 * 1 + 4 * 4


def test_block_scale_is_the_largest_magnitude_of_its_block():
    tensor = torch.tensor([1.0, -3.0, 2.0, 0.5, 0.25, -0.125])
    quantized = quantize_blockwise(tensor, block_size=4)
    assert quantized.absmax.tolist() == [3.0, 0.25]


def test_largest_element_of_each_block_survives_exactly():
    torch.manual_seed(0)
    tensor = torch.randn(3, 700)
    restored = dequantize_blockwise(quantize_blockwise(tensor))
    blocks = tensor.flatten()[:512].view(2, 256)
    positions = blocks.abs().argmax(dim=1) + torch.tensor([0, 256])
    assert torch.equal(restored.flatten()[positions], tensor.flatten()[positions])


def test_dequantized_tensor_has_the_original_shape_and_error_at_most_half_a_level():
    torch.manual_seed(0)
    tensor = torch.randn(5, 300) * 10
    quantized = quantize_blockwise(tensor)
    restored = dequantize_blockwise(quantized)
    assert restored.shape == tensor.shape and restored.dtype == torch.float32
    # Each block has 127 levels each side of 0: rounding moves a value by at most half a level.
    half_level = (quantized.absmax / 127 / 2).repeat_interleave(256)[: tensor.numel()].view_as(tensor)
    assert bool(((restored - tensor).abs() <= half_level * (1 + 1e-5)).all())


def test_block_of_zeros_quantizes_to_zeros_without_dividing_by_zero():
    tensor = torch.cat([torch.zeros(256), torch.ones(10)])
    restored = dequantize_blockwise(quantize_blockwise(tensor))
    assert torch.equal(restored, tensor)


def test_linear_code_rounds_small_values_of_a_block_to_zero():
    # One large value in a block crushes the small ones: the reason bitsandbytes uses a non-linear code.
    tensor = torch.tensor([1000.0] + [1.0] * 255)
    restored = dequantize_blockwise(quantize_blockwise(tensor))
    assert restored[0] == 1000.0 and bool((restored[1:] == 0).all())


def test_quantize_rejects_bad_input_with_a_clear_message():
    with pytest.raises(TypeError, match="tensor must be a torch.Tensor"):
        quantize_blockwise([1.0, 2.0])
    with pytest.raises(TypeError, match="floating-point"):
        quantize_blockwise(torch.arange(10))
    with pytest.raises(ValueError, match="block_size must be a positive int, got 0"):
        quantize_blockwise(torch.randn(10), block_size=0)
    with pytest.raises(TypeError, match="quantized must be a BlockwiseQuantized"):
        dequantize_blockwise(torch.randn(10))


def test_eight_bit_state_is_one_byte_per_element_plus_four_bytes_per_block():
    assert eight_bit_state_bytes(768 * 768) == 768 * 768 + 4 * (768 * 768 // 256)
    # A partial last block still needs its own scale.
    assert eight_bit_state_bytes(4097) == 4097 + 4 * 17


def test_eight_bit_state_of_a_small_tensor_stays_fp32():
    assert eight_bit_state_bytes(768) == 4 * 768
    assert eight_bit_state_bytes(BITSANDBYTES_MIN_8BIT_SIZE - 1) == 4 * (BITSANDBYTES_MIN_8BIT_SIZE - 1)
    assert eight_bit_state_bytes(BITSANDBYTES_MIN_8BIT_SIZE) == 4096 + 4 * 16


def test_eight_bit_state_bytes_matches_what_quantize_blockwise_holds():
    tensor = torch.randn(10_000)
    assert eight_bit_state_bytes(tensor.numel()) == quantize_blockwise(tensor).nbytes


def test_eight_bit_state_bytes_matches_bitsandbytes_for_one_state():
    # bitsandbytes keeps state1 (uint8, one per element) and absmax1 (fp32, one per block of 256).
    assert BITSANDBYTES_BLOCK_SIZE == 256
    parameter = torch.nn.Parameter(torch.randn(200, 300))
    optimizer = memory.make_optimizer("adamw8bit", [parameter], lr=1e-3)
    parameter.grad = torch.randn_like(parameter)
    optimizer.step()
    state = optimizer.state[parameter]
    held = state["state1"].untyped_storage().nbytes() + state["absmax1"].untyped_storage().nbytes()
    assert held == eight_bit_state_bytes(parameter.numel())


def test_eight_bit_state_bytes_rejects_bad_input():
    with pytest.raises(ValueError, match="num_elements must be a non-negative int, got -1"):
        eight_bit_state_bytes(-1)
    with pytest.raises(ValueError, match="num_elements must be a non-negative int"):
        eight_bit_state_bytes(3.5)


# --------------------------------------------------------------------------- Adafactor's factored second moment


def test_factored_second_moment_keeps_n_plus_m_numbers_for_an_n_by_m_matrix():
    row_means, col_means = factor_second_moment(torch.rand(30, 70))
    assert row_means.shape == (30,) and col_means.shape == (70,)
    assert factored_state_elements((30, 70)) == 100


def test_rank_one_matrix_is_rebuilt_exactly_from_its_row_and_column_means():
    torch.manual_seed(0)
    matrix = (torch.rand(40, 1) + 0.1) * (torch.rand(1, 60) + 0.1)
    rebuilt = reconstruct_second_moment(*factor_second_moment(matrix))
    torch.testing.assert_close(rebuilt, matrix)


def test_reconstruction_keeps_the_row_and_column_means_of_any_matrix():
    torch.manual_seed(0)
    matrix = torch.rand(20, 30) ** 4
    row_means, col_means = factor_second_moment(matrix)
    rebuilt = reconstruct_second_moment(row_means, col_means)
    torch.testing.assert_close(rebuilt.mean(dim=1), row_means)
    torch.testing.assert_close(rebuilt.mean(dim=0), col_means)


def test_moving_average_of_means_equals_means_of_the_moving_average():
    # Why Adafactor never needs the full matrix: averaging is linear.
    torch.manual_seed(0)
    beta2 = 0.9
    full = torch.zeros(8, 12)
    rows, cols = torch.zeros(8), torch.zeros(12)
    for _ in range(5):
        squared = torch.randn(8, 12) ** 2
        full = beta2 * full + (1 - beta2) * squared
        row_means, col_means = factor_second_moment(squared)
        rows = beta2 * rows + (1 - beta2) * row_means
        cols = beta2 * cols + (1 - beta2) * col_means
    full_rows, full_cols = factor_second_moment(full)
    torch.testing.assert_close(rows, full_rows)
    torch.testing.assert_close(cols, full_cols)


def test_reconstruction_matches_transformers_adafactor_factors():
    # transformers' Adafactor scales rows by mean(rows) then multiplies by columns, under rsqrt.
    from transformers.optimization import Adafactor

    torch.manual_seed(0)
    rows, cols = torch.rand(6) + 0.1, torch.rand(9) + 0.1
    inverse_root = Adafactor._approx_sq_grad(rows, cols)
    torch.testing.assert_close(inverse_root, reconstruct_second_moment(rows, cols).rsqrt())


def test_factored_state_elements_of_vectors_and_stacks():
    assert factored_state_elements((768,)) == 768
    assert factored_state_elements(()) == 1
    assert factored_state_elements(torch.Size([4, 30, 70])) == 4 * 100


def test_factoring_rejects_bad_input():
    with pytest.raises(ValueError, match="at least 2 dimensions"):
        factor_second_moment(torch.rand(5))
    with pytest.raises(ValueError, match="non-negative"):
        factor_second_moment(-torch.rand(3, 3))
    with pytest.raises(ValueError, match="same leading dimensions"):
        reconstruct_second_moment(torch.rand(2, 3), torch.rand(4))
    with pytest.raises(ValueError, match="shape must be a tuple of non-negative ints"):
        factored_state_elements((3, -1))


def test_importing_the_lesson_3_helpers_does_not_import_bitsandbytes():
    # accelerate's notebook_launcher refuses to start once bitsandbytes is imported.
    code = (
        "import sys; import course_utils.quantization, course_utils.fidelity, course_utils.plots, course_utils.exercises.lesson3; "
        "print('bitsandbytes' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"
