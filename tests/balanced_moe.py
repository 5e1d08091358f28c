"""A tiny Qwen3-MoE whose router routes in a stated, balanced way: what the expert-parallel plan assumes, forced in a real run."""

import torch


class BalancedRouter(torch.nn.Module):
    """Qwen3-MoE's router with its choices forced: token t's j-th choice is expert (t * top_k + j) % experts.

    Its gates are still the router's own probabilities of those experts (so the
    router trains). Over the tokens of a process each expert gets the same
    number of (token, expert) pairs, so every process sends as many to each
    process: the routing ``memory.context_parallel.BalancedRouting`` states.
    """

    def __init__(self, router: torch.nn.Module) -> None:
        super().__init__()
        self.top_k, self.num_experts, self.hidden_dim = router.top_k, router.num_experts, router.hidden_dim
        self.norm_topk_prob = router.norm_topk_prob
        self.weight = router.weight

    def forward(self, hidden_states):
        hidden_states = hidden_states.reshape(-1, self.hidden_dim)
        logits = torch.nn.functional.linear(hidden_states, self.weight)
        probabilities = torch.softmax(logits, dtype=torch.float, dim=-1)
        tokens = hidden_states.shape[0]
        chosen = (torch.arange(tokens * self.top_k) % self.num_experts).view(tokens, self.top_k)
        gates = probabilities.gather(1, chosen)
        if self.norm_topk_prob:
            gates = gates / gates.sum(-1, keepdim=True)
        return logits, gates.to(logits.dtype), chosen


def balanced_moe(layers: int = 2) -> torch.nn.Module:
    """A Qwen3-MoE causal LM (4 experts, 2 per token, every block sparse) with :class:`BalancedRouter`s, drawn from seed 0."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(0)
    config = Qwen3MoeConfig(vocab_size=96, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
                            num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                            num_experts=4, num_experts_per_tok=2, decoder_sparse_step=1, max_position_embeddings=64)
    model = Qwen3MoeForCausalLM(config)
    for layer in model.model.layers:
        layer.mlp.gate = BalancedRouter(layer.mlp.gate)
    return model
