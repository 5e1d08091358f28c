"""Padding is wasted work: four ways to batch sequences of different lengths, and what each computes for nothing (lesson 8).

Every function takes tokenised sequences (lists of token ids) and returns
batches for a causal language model: dicts of ``input_ids``, ``attention_mask``
and ``labels`` (``-100`` where no loss is taken), plus ``position_ids`` when
sequences are packed.

- :func:`pad_to_max_length`: every batch as long as the longest sequence allowed.
- :func:`pad_dynamically`: each batch as long as its own longest sequence.
- :func:`group_by_length`: sequences of similar length batched together, then padded dynamically.
- :func:`pack`: sequences laid end to end in rows; position ids restart at 0
  for each sequence, and transformers' masks read them to keep the sequences
  apart (each token attends only to earlier tokens of its own sequence).

:func:`padding_stats` counts the tokens that do work against the tokens processed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from course_utils.validation import check_non_negative_int, check_positive_int, check_token_ids

__all__ = ["PaddingStats", "padding_stats", "pad_to_max_length", "pad_dynamically", "group_by_length", "pack"]

IGNORE_INDEX = -100  # what transformers' cross-entropy skips


@dataclass(frozen=True)
class PaddingStats:
    """Tokens of a set of batches: ``real`` (attention mask 1) and ``processed`` (every position computed)."""

    real: int
    processed: int

    @property
    def waste(self) -> float:
        """The share of processed tokens that are padding (0 = none, a fraction)."""
        return 1 - self.real / self.processed if self.processed else 0.0


def padding_stats(batches) -> PaddingStats:
    """Return the :class:`PaddingStats` of ``batches`` (an iterable of dicts with ``attention_mask``).

    A real token is one the attention mask marks 1, whatever its id (a pad id
    may also be a real token's id); every position of ``attention_mask`` is processed.
    """
    if isinstance(batches, dict):
        raise TypeError("batches must be a list of batches (dicts with an 'attention_mask'), got one dict: put it in a list")
    real = processed = 0
    for index, batch in enumerate(batches):
        if not isinstance(batch, dict) or "attention_mask" not in batch:
            raise ValueError(f"batches: item {index} should be a dict with an 'attention_mask', got {type(batch).__name__}")
        mask = torch.as_tensor(batch["attention_mask"])
        if not bool(((mask == 0) | (mask == 1)).all()):
            raise ValueError(f"batches: item {index}'s attention_mask must hold only 0 (padding) and 1 (a real token)")
        real += int(mask.sum())
        processed += mask.numel()
    if processed == 0:
        raise ValueError("batches must hold at least one token: it is empty (or its masks are)")
    return PaddingStats(real, processed)


def _check_sequences(sequences) -> list[list[int]]:
    check_token_ids(sequences, "sequences")
    return [list(sequence) for sequence in sequences]


def _padded_batch(sequences: list[list[int]], length: int, pad_id: int) -> dict[str, torch.Tensor]:
    """Return one batch of ``sequences`` right-padded to ``length`` tokens."""
    input_ids = torch.full((len(sequences), length), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(sequences), length), dtype=torch.long)
    for row, sequence in enumerate(sequences):
        input_ids[row, : len(sequence)] = torch.tensor(sequence)
        attention_mask[row, : len(sequence)] = 1
    labels = input_ids.masked_fill(attention_mask == 0, IGNORE_INDEX)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def _check_longest_fits(sequences, max_length: int) -> None:
    longest = max(map(len, sequences))
    if longest > max_length:
        raise ValueError(f"max_length must be at least the longest sequence ({longest} tokens), got {max_length}")


def pad_to_max_length(sequences, batch_size: int, max_length: int, pad_id: int = 0) -> list[dict[str, torch.Tensor]]:
    """Return batches of ``batch_size`` sequences, in order, each padded to ``max_length`` tokens."""
    sequences = _check_sequences(sequences)
    check_positive_int(batch_size, "batch_size")
    check_positive_int(max_length, "max_length")
    check_non_negative_int(pad_id, "pad_id")
    _check_longest_fits(sequences, max_length)
    return [_padded_batch(sequences[i:i + batch_size], max_length, pad_id) for i in range(0, len(sequences), batch_size)]


def pad_dynamically(sequences, batch_size: int, pad_id: int = 0) -> list[dict[str, torch.Tensor]]:
    """Return batches of ``batch_size`` sequences, in order, each padded to its own longest sequence."""
    sequences = _check_sequences(sequences)
    check_positive_int(batch_size, "batch_size")
    check_non_negative_int(pad_id, "pad_id")
    chunks = [sequences[i:i + batch_size] for i in range(0, len(sequences), batch_size)]
    return [_padded_batch(chunk, max(map(len, chunk)), pad_id) for chunk in chunks]


def group_by_length(sequences, batch_size: int, pad_id: int = 0, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """Return batches of sequences of similar length (sorted by length), in shuffled batch order, padded dynamically.

    The batches are shuffled (with ``seed``) so that training does not see
    short sequences first and long ones last; within a batch the lengths are close.
    """
    sequences = _check_sequences(sequences)
    check_non_negative_int(seed, "seed")
    batches = pad_dynamically(sorted(sequences, key=len), batch_size, pad_id)
    random.Random(seed).shuffle(batches)
    return batches


def pack(sequences, max_length: int, rows_per_batch: int = 1, pad_id: int = 0) -> list[dict[str, torch.Tensor]]:
    """Return batches of rows of ``max_length`` tokens, each row holding whole sequences end to end.

    Sequences are placed in order, a new row starting when the next one does
    not fit. ``position_ids`` restart at 0 with each sequence, and the label of
    each sequence's first token is ``-100``: no token is predicted from the
    sequence before it. The rest of a row is padding (mask 0, label -100, its
    own run of positions). With ``position_ids`` and no attention mask,
    transformers builds a causal mask that keeps each sequence to itself.
    """
    sequences = _check_sequences(sequences)
    check_positive_int(max_length, "max_length")
    check_positive_int(rows_per_batch, "rows_per_batch")
    check_non_negative_int(pad_id, "pad_id")
    _check_longest_fits(sequences, max_length)
    rows, current = [], []
    for sequence in sequences:
        if sum(map(len, current)) + len(sequence) > max_length:
            rows.append(current)
            current = []
        current.append(sequence)
    rows.append(current)
    packed_rows = [_packed_row(row, max_length, pad_id) for row in rows]
    return [
        {key: torch.stack([row[key] for row in packed_rows[i:i + rows_per_batch]]) for key in packed_rows[0]}
        for i in range(0, len(packed_rows), rows_per_batch)
    ]


def _packed_row(sequences: list[list[int]], length: int, pad_id: int) -> dict[str, torch.Tensor]:
    """Return one packed row: the sequences end to end, then padding, with positions restarting per sequence."""
    input_ids, position_ids, labels = [], [], []
    for sequence in sequences:
        input_ids += sequence
        position_ids += range(len(sequence))
        labels += [IGNORE_INDEX] + sequence[1:]
    used = len(input_ids)
    input_ids += [pad_id] * (length - used)
    position_ids += range(length - used)
    labels += [IGNORE_INDEX] * (length - used)
    attention_mask = [1] * used + [0] * (length - used)
    return {
        "input_ids": torch.tensor(input_ids),
        "attention_mask": torch.tensor(attention_mask),
        "labels": torch.tensor(labels),
        "position_ids": torch.tensor(position_ids),
    }
