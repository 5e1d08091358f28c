"""A chunked cross-entropy: the language-model loss without the whole logits tensor in memory (lesson 8).

A causal language model's last layer multiplies every position's hidden
state by the vocabulary matrix: the logits are positions x vocabulary
numbers, and with a large vocabulary (Llama 3's 128,256 tokens) they are the
largest activation of the step, kept for the backward pass together with the
softmax's gradient. The chunked loss computes the logits of a few positions
at a time, takes their cross-entropy, and lets them go; each chunk runs under
``torch.utils.checkpoint``, so the backward pass computes that chunk's logits
again instead of keeping them. The loss and the gradients are those of the
plain loss (the same sums, in another order); the price is one more
matrix product with the vocabulary per chunk. Liger Kernel's fused linear
cross-entropy (https://github.com/linkedin/Liger-Kernel) and Apple's Cut
Cross-Entropy (https://arxiv.org/abs/2411.09009) do the same inside one GPU kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from course_utils.validation import check_instance, check_positive_int

__all__ = ["IGNORE_INDEX", "chunked_cross_entropy", "ChunkedLossOutput", "ChunkedLossLM"]

IGNORE_INDEX = -100  # the label transformers and F.cross_entropy skip (padding, a prompt)


def _chunk_loss_sum(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    # One chunk's logits live only inside this function; the checkpoint recomputes them for the backward.
    return F.cross_entropy(hidden @ weight.T, labels, ignore_index=IGNORE_INDEX, reduction="sum")


def chunked_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                          chunk_size: int = 1024) -> torch.Tensor:
    """Return the mean cross-entropy of ``hidden @ weight.T`` against ``labels``, ``chunk_size`` positions at a time.

    ``hidden``: (positions, width); ``weight``: the output layer's (vocabulary,
    width) matrix; ``labels``: (positions,) token ids, ``IGNORE_INDEX`` where
    no loss is taken. Equal to ``F.cross_entropy(hidden @ weight.T, labels)``,
    values and gradients, without its (positions, vocabulary) logits in memory at once.
    """
    check_instance(hidden, "hidden", torch.Tensor, "a torch.Tensor")
    check_instance(weight, "weight", torch.Tensor, "a torch.Tensor")
    check_instance(labels, "labels", torch.Tensor, "a torch.Tensor")
    check_positive_int(chunk_size, "chunk_size")
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(f"hidden must be (positions, width) and weight (vocabulary, width) with the same width; "
                         f"got hidden {tuple(hidden.shape)}, weight {tuple(weight.shape)}")
    if labels.shape != hidden.shape[:1] or labels.dtype != torch.long:
        raise ValueError(f"labels must be a long tensor of shape ({hidden.shape[0]},), one per position; "
                         f"got {labels.dtype} {tuple(labels.shape)}")
    counted = int((labels != IGNORE_INDEX).sum())
    if counted == 0:
        raise ValueError("labels: every label is IGNORE_INDEX, so there is no loss to take")
    total = hidden.new_zeros(())
    for start in range(0, hidden.shape[0], chunk_size):
        end = start + chunk_size
        total = total + checkpoint(_chunk_loss_sum, hidden[start:end], weight, labels[start:end], use_reentrant=False)
    return total / counted


@dataclass
class ChunkedLossOutput:
    """What :class:`ChunkedLossLM` returns: the loss, as a transformers model's output holds it."""

    loss: torch.Tensor


class ChunkedLossLM(torch.nn.Module):
    """A transformers causal LM whose loss is :func:`chunked_cross_entropy`: its full logits are never made.

    ``model(input_ids=..., attention_mask=..., labels=...)`` returns a
    :class:`ChunkedLossOutput`; the loss shifts the labels by one position, as
    the model's own ``ForCausalLM`` loss does. The wrapped model's base
    (``model.model``) and output layer (``model.lm_head``) are used as they are.
    """

    def __init__(self, model: torch.nn.Module, chunk_size: int = 1024):
        super().__init__()
        check_instance(model, "model", torch.nn.Module, "a torch.nn.Module")
        head = getattr(model, "lm_head", None)
        if not isinstance(head, torch.nn.Linear) or head.bias is not None or not hasattr(model, "model"):
            raise TypeError(f"model must be a transformers causal LM with .model and an lm_head Linear without bias "
                            f"(LlamaForCausalLM, for one), got {type(model).__name__}")
        check_positive_int(chunk_size, "chunk_size")
        self.causal_lm = model
        self.chunk_size = chunk_size

    def forward(self, input_ids, labels, attention_mask=None):
        hidden = self.causal_lm.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        # Position t predicts token t + 1: drop the last position's hidden state and the first label.
        hidden = hidden[:, :-1].reshape(-1, hidden.shape[-1])
        targets = labels[:, 1:].reshape(-1)
        return ChunkedLossOutput(chunked_cross_entropy(hidden, self.causal_lm.lm_head.weight, targets, self.chunk_size))
