# %% [markdown]
# # Lesson 8 — Speed: where a training step's time goes, and the levers that make it faster
#
# Lessons 4 and 5 taught the memory of a training step to the byte. This one is
# about its time: how many tokens per second a step does, how far that is from
# what the hardware could do, where the time goes, and which switches make it
# faster. Everything is measured here, on this CPU, with one torch thread (the
# course's setting); a last section says what changes on a GPU, with sources
# you can check, never as measured here.
#
# | section | the question |
# | --- | --- |
# | 1. measure a step | tokens/s with warm-up excluded and the spread shown; FLOPs per token; MFU against the theoretical peak and utilisation of a measured one; bf16 against fp32, and why |
# | 2. padding | how much of the work is padding, and what dynamic padding, grouping and packing save |
# | 3. attention kernels | eager attention against PyTorch's fused `scaled_dot_product_attention`; which kernel runs, and how to ask for one |
# | 4. `torch.compile` | its speed-up, its compile time on a cache miss and the payback per shape, recompilations, a graph break |
# | 5. the optimizer step | for-loop, `foreach` and `fused` AdamW |
# | 6. the input pipeline | tokenising on the fly, `num_workers`, and the profiler showing the waits |
# | 7. the profiler | the top operators of one step, and its timeline |
# | 8. time against memory | checkpointing, accumulation, smaller batches on one chart |
# | 9. on a GPU | tensor cores, flash attention, fused kernels, CUDA graphs, overlap |
#
# **Timing rules.** A first call pays one-off costs (memory the allocator grows,
# lazy initialisation, compilation), so the first call (or more) runs untimed (the
# *warm-up*). Then the same call is timed several times, and every figure gives
# the median with the fastest and slowest run. Set-ups that are compared are
# timed in turns (`speed.time_interleaved`: one call of each per round), so a
# change in the machine's load falls on all of them alike. Two set-ups differ
# *measurably* only when the middle halves of their runs (first to third
# quartile) do not overlap; otherwise the lesson says "no measurable
# difference", whatever the medians say. On a busy machine the spread is wide:
# that is information, not a nuisance.
#
# The model and the data are the course's offline stand-ins (lesson 1 introduces
# them): a small pre-trained DistilBERT from `data/tiny-distilbert/` for the
# `distilbert-base-cased` checkpoint, and the paraphrase pairs of `data/paraphrase/`
# for the GLUE MRPC dataset. With internet, the model line becomes
# `models.load_pretrained_classifier("distilbert-base-cased")` and the data line
# `load_dataset("glue", "mrpc")`. The language models of sections 1-5 are built
# from configs with random weights: speed does not depend on what the weights learned.

# %%
import logging
import math
import os
import time
import warnings

# The tokenizer is used before the input pipeline's worker processes start. When
# the Rust tokenizers library has run threads of its own, it prints a warning at
# the fork that it disables them; with this set it uses none from the start.
os.environ["TOKENIZERS_PARALLELISM"] = "false"
# torch.profiler's library (Kineto) prints a "profiler_start" and a "profiler_stop" line on stderr around
# every trace it records; level 6 is above the levels it logs them at, so those lines stay out of the lesson.
os.environ["KINETO_LOG_LEVEL"] = "6"

import torch
import transformers
from IPython.display import Markdown, display
from tqdm.auto import tqdm
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from course_utils import compiling, cpu_features, data, memory, models, padding, speed
from course_utils.exercises import ____
from course_utils.exercises import lesson8 as ex
from course_utils.plots import speed as speed_plots
from course_utils.threads import use_course_threads
from course_utils.units import MIB

num_threads = use_course_threads()
transformers.utils.logging.disable_progress_bar()  # the "Loading weights" bar of every from_pretrained: noise here

dataset = data.load_paraphrase_dataset()
tokenizer = data.load_tokenizer()
print(f"torch {torch.__version__}, {num_threads} torch thread{'s' if num_threads > 1 else ''}; "
      f"{len(dataset['train']):,} training pairs, a vocabulary of {len(tokenizer):,} tokens")

# %% [markdown]
# ## 1. Measure a step properly
#
# **The course model.** One training step of lesson 1's classifier (the tiny
# DistilBERT) on a batch of 32 pairs: forward, backward, AdamW step. The
# function `speed.time_call` runs it once untimed, then times it 7 times.

# %%
def training_step(model, optimizer, batch):
    loss = model(**batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()


torch.manual_seed(0)
# from_pretrained returns the model in eval mode; a training step runs in train mode (dropout on).
classifier = models.load_pretrained_classifier().train()
classifier_optimizer = torch.optim.AdamW(classifier.parameters(), lr=1e-4)
classifier_batch = next(iter(data.make_dataloader("train", batch_size=32, seed=0)))
first_step = speed.time_call(lambda: training_step(classifier, classifier_optimizer, classifier_batch), repeats=1, warmup=0)
classifier_timing = speed.time_call(lambda: training_step(classifier, classifier_optimizer, classifier_batch), repeats=7)

real_tokens = int(classifier_batch["attention_mask"].sum())
processed_tokens = classifier_batch["input_ids"].numel()
median, slowest, fastest = classifier_timing.rate(real_tokens)
print(f"step: {classifier_timing.describe()}; the first, untimed in the median: {first_step.median * 1e3:.1f} ms "
      f"({first_step.median / classifier_timing.median:.1f}x the median)")
print(f"{real_tokens:,} real tokens in {processed_tokens:,} positions (batch {tuple(classifier_batch['input_ids'].shape)}): "
      f"{median:,.0f} real tokens/s (slowest run {slowest:,.0f}, fastest {fastest:,.0f})")
display(Markdown(speed.first_call_sentence(first_step.median, classifier_timing)))

# %% [markdown]
# **A larger model, built from a config.** A GPT-2-shaped language model with
# 4 layers of width 256 on the course's vocabulary: a few million parameters,
# random weights (speed does not depend on what the weights learned). Its
# batch: 8 tokenised pairs of the course data, each padded to 64 tokens.

# %%
pairs = dataset["train"].select(range(128))
sequences = [tokenizer(first, second)["input_ids"] for first, second in zip(pairs["sentence1"], pairs["sentence2"])]
LM_SEQ_LEN = 64

torch.manual_seed(0)
# GPT2Config's defaults name GPT-2's own bos/eos tokens (50256), outside this vocabulary: none here.
gpt = GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), n_positions=128, n_embd=256, n_layer=4, n_head=4,
                                 bos_token_id=None, eos_token_id=None))
# transformers 5 picks the loss from the class name, and GPT2LMHeadModel's does not say "ForCausalLM": it warns,
# then uses the causal-LM loss anyway. Named here, the same loss without the warning.
gpt.loss_type = "ForCausalLM"
gpt_optimizer = torch.optim.AdamW(gpt.parameters(), lr=1e-4)
gpt_batch = padding.pad_to_max_length(sequences[:8], batch_size=8, max_length=LM_SEQ_LEN)[0]
gpt_timing = speed.time_call(lambda: training_step(gpt, gpt_optimizer, gpt_batch), repeats=5)
gpt_tokens = gpt_batch["input_ids"].numel()
gpt_rate = gpt_timing.rate(gpt_tokens)
print(f"{sum(p.numel() for p in gpt.parameters()):,} parameters; step on {tuple(gpt_batch['input_ids'].shape)}: "
      f"{gpt_timing.describe()}, {gpt_rate[0]:,.0f} tokens/s processed")

# %% [markdown]
# **FLOPs per token.** A matrix product of a token's activations with a weight
# matrix costs one multiply and one add per weight: 2 FLOPs per weight
# forward, and twice that backward (the gradient of the input and of the
# weight). So a training step costs about **6 FLOPs per weight per token**.
# Attention adds its scores and weighted sums, which grow with the sequence:
# 12 x layers x sequence length x width per token (nanoGPT's
# [`estimate_mfu`](https://github.com/karpathy/nanoGPT/blob/master/model.py),
# from the [PaLM paper](https://arxiv.org/abs/2204.02311), appendix B). The
# weights that count are those of the matrix products (embedding lookups do
# no arithmetic; GPT-2's output layer shares the embedding matrix and does).
#
# A check: torch's `FlopCounterMode` counts the FLOPs of every matrix product
# the step actually runs.

# %% tags=["nbval-check-output"]
from torch.utils.flop_counter import FlopCounterMode

gpt_flops_per_token = speed.model_flops_per_token(gpt, LM_SEQ_LEN)
with FlopCounterMode(display=False) as flop_counter:
    gpt(**gpt_batch).loss.backward()
gpt.zero_grad()
counted_per_token = flop_counter.get_total_flops() / gpt_tokens
layers, width = speed.model_shape(gpt)
print(f"matmul weights: {speed.matmul_weights(gpt):,}; 6 x weights = {6 * speed.matmul_weights(gpt):,} FLOPs/token, "
      f"attention 12 x {layers} x {LM_SEQ_LEN} x {width} = {12 * layers * LM_SEQ_LEN * width:,}")
print(f"formula: {gpt_flops_per_token:,} FLOPs/token; counted by FlopCounterMode: {counted_per_token:,.0f} "
      f"(formula / counted = {gpt_flops_per_token / counted_per_token:.3f})")

# %% [markdown]
# **Two peaks, two utilisations.** Model FLOPs utilisation (MFU) as the PaLM
# paper defines it divides the FLOPs the model's arithmetic needs per second,
# at the measured tokens/s, by the hardware's *theoretical* peak in the
# precision it trains in (fp32 here). For a CPU core that peak is clock x FMA
# units x lanes per unit x 2 (a multiply and an add): the clock and the vector
# flags are read from the CPU (`/proc/cpuinfo`), the FMA units per core are
# the vendor's figure for its microarchitecture (assumed, with the source
# printed). Dividing instead by a matrix product measured here (1024 x 1024)
# gives the utilisation of an *achievable* peak: it moves with the machine's
# load, and it is only the fastest work the CPU does if no other precision
# runs faster, which the cell measures too (bf16).

# %%
theoretical = speed.cpu_peak(cores=num_threads)
if theoretical is None:
    print("This CPU is not one whose FMA units the course knows (or /proc/cpuinfo is unreadable): no theoretical peak.")
else:
    print(f"theoretical peak on {num_threads} core{'s' if num_threads > 1 else ''}: "
          + ", ".join(f"{precision} {flops / 1e9:,.0f} GFLOP/s" for precision, flops in theoretical.flops.items()))
    print("  read from the CPU: " + "; ".join(theoretical.read))
    print("  assumed: " + "; ".join(theoretical.assumed))
peak_flops, matmul_timing = speed.measure_matmul_peak(size=1024, repeats=5)
bf16_peak_flops, bf16_matmul_timing = speed.measure_matmul_peak(size=1024, repeats=5, dtype=torch.bfloat16)
print(f"1024 x 1024 fp32 matmul: {matmul_timing.describe()}; fastest run {peak_flops / 1e9:,.1f} GFLOP/s")
print(f"1024 x 1024 bf16 matmul: {bf16_matmul_timing.describe()}; fastest run {bf16_peak_flops / 1e9:,.1f} GFLOP/s")
display(Markdown(speed.peak_sentence(theoretical, peak_flops) + " "
                 + speed.bf16_sentence("the fp32 matmul", matmul_timing, "the bf16 matmul", bf16_matmul_timing,
                                       cpu_features.cpu_matrix_units())))
# The classifier's head multiplies one vector per sequence, not one per token: the formula counts it per token.
head_weights = classifier.pre_classifier.weight.numel() + classifier.classifier.weight.numel()
print(f"(the classifier's head, {head_weights:,} weights, is {head_weights / speed.matmul_weights(classifier):.1%} of its "
      f"matmul weights: acting on one token per sequence, it makes the formula count that much too many FLOPs)")
utilisation = {}
for name, model, timing, tokens, seq_len in [
    ("course DistilBERT", classifier, classifier_timing, processed_tokens, classifier_batch["input_ids"].shape[1]),
    ("GPT-2-shaped, 4 layers", gpt, gpt_timing, gpt_tokens, LM_SEQ_LEN),
]:
    flops = speed.model_flops_per_token(model, seq_len)
    median, slowest, fastest = timing.rate(tokens)
    utilisation[name] = tuple(speed.mfu(rate, flops, peak_flops) for rate in (median, slowest, fastest))
    palm_mfu = "" if theoretical is None else f"MFU (theoretical fp32 peak) {speed.mfu(median, flops, theoretical.flops['fp32']):.1%}; "
    print(f"{name:>24}: {flops:>12,} FLOPs/token x {median:>8,.0f} tokens/s = {median * flops / 1e9:6.2f} GFLOP/s: "
          f"{palm_mfu}utilisation of the measured fp32 matmul {utilisation[name][0]:.1%} "
          f"(slowest run {utilisation[name][1]:.1%}, fastest {utilisation[name][2]:.1%})")

# %%
low_name, high_name = sorted(utilisation, key=lambda name: utilisation[name][0])
if not utilisation[high_name][1] > utilisation[low_name][2]:
    why = "their runs overlap, so this machine shows no measurable difference between the two"
elif high_name.startswith("GPT"):
    why = ("even its slowest run beats the other's fastest: its matrices are larger, so a larger share of its step "
           "can be large matrix products rather than element-wise operations, the optimizer and the fixed cost of "
           "each operator call")
else:
    why = ("even its slowest run beats the other's fastest: the larger model loses more to something other than "
           "its matrix products here; section 7's profiler shows where its time goes")
display(Markdown(
    f"The {high_name} uses {utilisation[high_name][0]:.0%} of the measured fp32 matmul's rate (median), the {low_name} "
    f"{utilisation[low_name][0]:.0%}: {why}. The tokens counted here are every position of the batch, padding "
    f"included: the hardware does that work, but padded positions learn nothing."
))

# %% [markdown]
# **bf16 on this CPU, step by step.** Whether bf16 pays depends on the CPU's
# bf16 units (the cell above measured its matrix products) *and* on how much of
# a step is matrix products. The course classifier is narrow (width 64): its
# matrix products are small, and bf16 autocast adds a cast of every weight and
# activation around each of them. Its step in fp32 and under
# `torch.autocast("cpu", dtype=torch.bfloat16)`, timed in turns, then three
# steps of each profiled, in turns: the operators' own time split into matrix
# products, casts and copies, and everything else.

# %%
def autocast_step():
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = classifier(**classifier_batch).loss
    loss.backward()
    classifier_optimizer.step()
    classifier_optimizer.zero_grad()


precision_steps = {"fp32": lambda: training_step(classifier, classifier_optimizer, classifier_batch),
                   "bf16 autocast": autocast_step}
precision_timings = speed.time_interleaved(precision_steps, repeats=5, desc="timing fp32 and bf16 steps, in turns")
profiled = {name: [] for name in precision_steps}
for _ in range(3):
    for name, step in precision_steps.items():
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as precision_profile:
            step()
        profiled[name].append(speed.time_by_kind(precision_profile))
kinds_by_precision = {name: {kind: speed.Timing(tuple(run[kind] / 1e3 for run in runs)) for kind in runs[0]}
                      for name, runs in profiled.items()}
for name, timing in precision_timings.items():
    kinds = ", ".join(f"{kind} {part.describe()}" for kind, part in kinds_by_precision[name].items())
    print(f"{name:>13}: step {timing.describe()}\n{'':>15}profiled: {kinds}")
step_verdict = speed.verdict("bf16 autocast", precision_timings["bf16 autocast"], "fp32", precision_timings["fp32"])
display(Markdown(
    speed.bf16_sentence("fp32", precision_timings["fp32"], "bf16 autocast", precision_timings["bf16 autocast"],
                        cpu_features.cpu_matrix_units())
    + " " + speed.bf16_cause_sentence(step_verdict, kinds_by_precision["fp32"], kinds_by_precision["bf16 autocast"])
))

# %% [markdown]
# ## 2. Padding is wasted work
#
# Sequences differ in length; a batch is a rectangle. Four ways to fill it,
# on the 128 pairs above with a small Llama-shaped language model (2 layers of
# width 128), batches of 16 sequences:
#
# - **pad to the maximum length**: every batch 64 tokens long;
# - **dynamic padding**: each batch as long as its longest sequence (what
#   `DataCollatorWithPadding` does, and lesson 1's loader);
# - **grouped by length**: sequences sorted by length, then batched, the batches
#   shuffled (`TrainingArguments(train_sampling_strategy="group_by_length")`
#   does a looser version: its `LengthGroupedSampler` sorts within random
#   mega-batches of up to 50 batches, so the order stays random;
#   `train_sampling_strategy="batch_rebalance"` instead balances the padded
#   tokens across devices and accumulation steps);
# - **packed**: sequences end to end in rows of 128 tokens, 4 rows a batch.

# %% tags=["nbval-check-output"]
def small_llama(attn_implementation="sdpa", seed=0):
    """A Llama-shaped causal LM, 2 layers of width 128, on the course's vocabulary.

    Its random weights are 10 times the default scale (initializer_range 0.2), so that which tokens
    attend to which changes the loss visibly, untrained: the packing check below needs that.
    """
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=128, intermediate_size=344, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512,
                         initializer_range=0.2, pad_token_id=tokenizer.pad_token_id, use_cache=False)
    return LlamaForCausalLM._from_config(config, attn_implementation=attn_implementation)


def model_inputs(batch):
    """Packed batches go in with their position ids and no attention mask: transformers then keeps the sequences apart."""
    if "position_ids" in batch:
        return {name: batch[name] for name in ("input_ids", "position_ids", "labels")}
    return batch


strategies = {
    "pad to 64 tokens": padding.pad_to_max_length(sequences, batch_size=16, max_length=64),
    "dynamic padding": padding.pad_dynamically(sequences, batch_size=16),
    "grouped by length": padding.group_by_length(sequences, batch_size=16, seed=0),
    "packed in rows of 128": padding.pack(sequences, max_length=128, rows_per_batch=4),
}
for name, batches in strategies.items():
    stats = padding.padding_stats(batches)
    print(f"{name:>22}: {len(batches):2} batches, {stats.processed:6,} tokens processed, {stats.real:,} real: "
          f"{stats.waste:5.1%} padding")

# %% [markdown]
# **Packing keeps the sequences apart.** In a packed row, a token must attend
# only to earlier tokens of *its own* sequence, and the first token of a
# sequence must not be predicted from the one before it. The position ids
# restart at 0 for each sequence; from them transformers builds a causal mask
# per sequence, and the label of each first token is `-100` (no loss). The
# check: the loss summed over every real token, the sequences unpacked
# (dynamic padding with its attention mask) against packed, and packed with the
# position ids left out (the sequences then see each other):

# %%
def summed_loss(model, batches, keep_positions=True):
    """Return (sum of the per-token losses, number of tokens with a loss) over ``batches``, without gradients."""
    total, count = 0.0, 0
    with torch.no_grad():
        for batch in batches:
            inputs = model_inputs(batch) if keep_positions else {k: v for k, v in batch.items() if k != "position_ids"}
            tokens = int((batch["labels"][:, 1:] != padding.IGNORE_INDEX).sum())
            total += model(**inputs, use_cache=False).loss.item() * tokens
            count += tokens
    return total, count


llama = small_llama().eval()
unpacked_sum, unpacked_count = summed_loss(llama, strategies["dynamic padding"])
packed_sum, packed_count = summed_loss(llama, strategies["packed in rows of 128"])
mixed_sum, mixed_count = summed_loss(llama, strategies["packed in rows of 128"], keep_positions=False)
print(f"unpacked:                    mean loss {unpacked_sum / unpacked_count:.6f} over {unpacked_count:,} predicted tokens")
print(f"packed, with position ids:   mean loss {packed_sum / packed_count:.6f} over {packed_count:,} "
      f"(difference {abs(packed_sum / packed_count - unpacked_sum / unpacked_count):.1e})")
print(f"packed, no position ids:     mean loss {mixed_sum / mixed_count:.6f} over {mixed_count:,} "
      f"(difference {abs(mixed_sum / mixed_count - unpacked_sum / unpacked_count):.1e})")

# %% [markdown]
# **The time.** One pass (forward and backward) over all 128 sequences per
# strategy, timed 3 times after a warm-up pass; the rate counts real tokens only.

# %%
llama.train()


def one_pass(batches):
    for batch in batches:
        llama(**model_inputs(batch), use_cache=False).loss.backward()
    llama.zero_grad()


padding_timings = speed.time_interleaved({name: lambda b=batches: one_pass(b) for name, batches in strategies.items()},
                                         repeats=3, desc="timing the four ways to batch, in turns")
real = padding.padding_stats(strategies["pad to 64 tokens"]).real
for name, timing in padding_timings.items():
    median, slowest, fastest = timing.rate(real)
    print(f"{name:>22}: {timing.describe()}, {median:,.0f} real tokens/s ({slowest:,.0f}-{fastest:,.0f})")
for name in list(strategies)[1:]:
    print(speed.compare(name, padding_timings[name], "pad to 64 tokens", padding_timings["pad to 64 tokens"]).sentence())
figure = speed_plots.plot_timings(padding_timings, "One pass over 128 sequences, four ways to batch them")

# %%
by_tokens = sorted(strategies, key=lambda name: padding.padding_stats(strategies[name]).processed)
by_time = sorted(padding_timings, key=lambda name: padding_timings[name].median)
display(Markdown(
    ("The median times rank the strategies as the tokens they process do: the work follows the tokens, padding included."
     if by_tokens == by_time else
     f"By tokens processed the order is {', '.join(by_tokens)}; by median time it is {', '.join(by_time)}: "
     "time does not follow the tokens alone here (the spreads above say how far apart they really are).")
    + " A packed row is 128 tokens long, so its attention term per token is twice a 64-token batch's (section 1's formula)."
))

# %% [markdown]
# **What keeping packed sequences apart costs.** The same packed rows, once
# with their position ids (each sequence kept to itself, the right loss) and
# once without (one causal mask over the whole row: the wrong loss, but the
# same arithmetic): the difference is the price of the per-sequence mask.

# %%
packed_batch = strategies["packed in rows of 128"][0]


def packed_step(keep_apart):
    inputs = model_inputs(packed_batch) if keep_apart else {name: packed_batch[name] for name in ("input_ids", "labels")}
    llama(**inputs, use_cache=False).loss.backward()


mask_timings = speed.time_interleaved({"sequences kept apart": lambda: packed_step(True),
                                       "one causal mask per row": lambda: packed_step(False)}, repeats=5)
llama.zero_grad()
for name, timing in mask_timings.items():
    print(f"{name:>24}: forward and backward of one packed batch {timing.describe()}")
mask_verdict = speed.compare("sequences kept apart", mask_timings["sequences kept apart"],
                             "one causal mask per row", mask_timings["one causal mask per row"])
print(mask_verdict.sentence())

# %% [markdown]
# With SDPA, transformers builds the per-sequence mask as a tensor (rows x 1 x
# 128 x 128) and passes it to the attention, where a plain causal mask needs
# none; the verdict above says what that costs here. On a GPU,
# FlashAttention's variable-length kernels take the sequence boundaries instead
# of a mask (transformers'
# `DataCollatorWithFlattening` with `attn_implementation="flash_attention_2"`;
# [Hugging Face's write-up, with measurements](https://huggingface.co/blog/packing-with-FA2)),
# which is where packing pays most.

# %% [markdown]
# ## 3. Attention kernels
#
# Eager attention, written in torch operations, computes the full matrix of
# scores (batch x heads x length x length), keeps the softmax of it for the
# backward pass, and multiplies by V. PyTorch's
# [`scaled_dot_product_attention`](https://pytorch.org/docs/stable/generated/torch.nn.functional.scaled_dot_product_attention.html)
# (SDPA, transformers' default `attn_implementation="sdpa"`) picks a fused
# kernel where one can run for this device, dtype, mask and head size, and
# falls back to the math kernel (the same scores as eager) where none can; the
# profiler below says which one ran here. Both on the small Llama, batches of
# 4 sequences of 256 tokens:

# %%
ATTENTION_BATCH, ATTENTION_SEQ = 4, 256
attention_ids = torch.randint(len(tokenizer), (ATTENTION_BATCH, ATTENTION_SEQ), generator=torch.Generator().manual_seed(0))
attention_models = {implementation: small_llama(implementation) for implementation in ("eager", "sdpa")}


def forward_backward(model):
    model(input_ids=attention_ids, labels=attention_ids).loss.backward()


attention_timings = speed.time_interleaved(
    {name: lambda model=model: forward_backward(model) for name, model in attention_models.items()},
    repeats=5, desc="timing both attentions, in turns")
attention_memory = {
    name: memory.measure_training_step_peak(model, torch.optim.AdamW(model.parameters()),
                                            {"input_ids": attention_ids, "labels": attention_ids})
    for name, model in attention_models.items()
}
planned = {
    implementation: memory.estimate_training_memory(small_llama(implementation), "adamw", ATTENTION_BATCH, ATTENTION_SEQ)
    for implementation in attention_models
}
for implementation, timing in attention_timings.items():
    measured = attention_memory[implementation]
    print(f"{implementation:>5}: forward and backward {timing.describe()}; measured peak {measured.peak / MIB:6.1f} MiB, "
          f"activations {measured.activations / MIB:5.1f} MiB")
print(speed.compare("sdpa", attention_timings["sdpa"], "eager", attention_timings["eager"]).sentence())
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as attention_profile:
    forward_backward(attention_models["sdpa"])
kernels = sorted({event.name for event in attention_profile.events() if "scaled_dot_product" in event.name})
display(Markdown(speed.sdpa_kernel_sentence(kernels)))
scores_bytes = ATTENTION_BATCH * 4 * ATTENTION_SEQ**2 * 4  # one layer's fp32 scores: batch x 4 heads x length x length
saved = attention_memory["eager"].activations - attention_memory["sdpa"].activations
print(f"activations kept for the backward pass: {saved / MIB:.1f} MiB fewer with sdpa, "
      f"{saved / scores_bytes:.1f} times one layer's fp32 score matrix ({scores_bytes / MIB:.1f} MiB)")
for implementation, plan in planned.items():
    print(f"the planner, following the {implementation} model on fake tensors: peak {plan.peak / MIB:.1f} MiB "
          f"(measured {attention_memory[implementation].peak / MIB:.1f} MiB)")

# %% [markdown]
# Eager attention keeps score-sized tensors (the softmax, and the dropout mask
# when dropout is on) for the backward pass; the fused kernel keeps only a
# small per-row summary and recomputes the scores in the backward pass. The
# score matrices grow with the square of the sequence length, so the memory
# the fused kernel saves grows with it. The planner runs the model as it is
# built, so its figures are those of the attention the model runs
# (`attn_implementation=` when you build it; "sdpa" is transformers' default).

# %% [markdown]
# **Which kernel will I get? Ask for it.** SDPA chooses silently. Inside
# `with sdpa_kernel(SDPBackend.FLASH_ATTENTION):` it may use only that kernel,
# and raises when the kernel cannot run on these inputs, instead of falling
# back: the way to find out, on any machine. On CUDA, FlashAttention needs
# fp16 or bf16 inputs, no arbitrary attention mask (`is_causal=True` is fine; a
# padded batch's mask is not) and a supported head size, so the lesson's fp32
# code, or a padded batch, does not get it there
# ([`sdpa_kernel`](https://pytorch.org/docs/stable/generated/torch.nn.attention.sdpa_kernel.html),
# [`scaled_dot_product_attention`'s notes on its kernels](https://pytorch.org/docs/stable/generated/torch.nn.functional.scaled_dot_product_attention.html)).
# Here, on this device, each backend alone, on fp32 inputs with a causal flag
# and with a padding mask:

# %%
from torch.nn.attention import SDPBackend, sdpa_kernel

query = torch.randn(2, 4, 64, 32, generator=torch.Generator().manual_seed(0))  # batch, heads, length, head size
padding_mask = torch.ones(2, 1, 64, 64, dtype=torch.bool)
padding_mask[1, :, :, 48:] = False  # the second sequence is 48 tokens, then padding
for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.MATH):
    for inputs, options in (("causal", {"is_causal": True}), ("padding mask", {"attn_mask": padding_mask})):
        try:
            with sdpa_kernel(backend), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as probe:
                torch.nn.functional.scaled_dot_product_attention(query, query, query, **options)
            ran = sorted({e.name for e in probe.events() if e.name.startswith("aten::_scaled_dot_product")})
            outcome = f"ran {', '.join(ran)}"
        except RuntimeError as error:
            outcome = f"raised RuntimeError: {str(error).splitlines()[0]}"
        print(f"{backend.name:>19}, {inputs:>12}: {outcome}")

# %% [markdown]
# ## 4. `torch.compile`
#
# `torch.compile(model)` captures the Python code of a forward pass into graphs
# (TorchDynamo), derives the backward graph (AOTAutograd) and generates fused
# code for both (Inductor: C++ on a CPU, Triton kernels on a GPU). Fused code
# reads and writes memory once where eager PyTorch runs one operator after
# another. The price is paid up front, at the first call, and again whenever
# the code meets shapes it was not compiled for.
#
# On a CPU, Inductor needs a C++ compiler. The lesson looks for one and, if it
# is missing, says so and skips the compiled timings; everything else runs.
#
# The model here is the feed-forward half of a GPT block, width 128: layer
# norm, two linear layers, the residual connection, and between the linear
# layers the GELU written out as nanoGPT writes it (`new_gelu`: the tanh
# approximation, seven element-wise operators in eager PyTorch, each reading
# and writing the whole activation, and more in the backward pass). About
# 130,000 parameters: compiling a whole transformer on a CPU takes minutes.

# %%
# Inductor compiles in a pool of worker processes by default; on a 2-core laptop one process is as fast.
import torch._inductor.config

torch._inductor.config.compile_threads = 1
compiler_path = compiling.cpp_compiler()


def new_gelu(x):
    """GELU, tanh approximation, as nanoGPT's model.py writes it."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class FeedForwardBlock(torch.nn.Module):
    def __init__(self, width=128):
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.up = torch.nn.Linear(width, 4 * width)
        self.down = torch.nn.Linear(4 * width, width)

    def forward(self, x):
        return x + self.down(new_gelu(self.up(self.norm(x))))


def feed_forward_block(seed=0):
    torch.manual_seed(seed)
    return FeedForwardBlock()


block_input = torch.randn(8, 64, 128, generator=torch.Generator().manual_seed(0))


def block_step(block):
    loss = block(block_input).square().mean()
    loss.backward()
    return loss


eager_block = feed_forward_block()
compile_timings = {"eager": speed.time_call(lambda: block_step(eager_block), repeats=7)}  # timed beside compiled below, if it runs
if compiler_path is None:
    print("No C++ compiler found ($CXX, g++, clang++; cl on Windows): torch.compile's Inductor cannot build code "
          "here, so this section shows no compiled timing. Install one (g++ on Linux, Xcode's command line tools on "
          "macOS, Visual Studio's C++ tools on Windows) to run it; the rest of the lesson does not need it.")
else:
    torch._dynamo.reset()
    compiled_block = torch.compile(feed_forward_block(), dynamic=False)
    with tqdm(total=2, desc="compiling (tens of seconds on a first run)") as bar:
        first_compile = compiling.time_compiling_call(lambda: block_step(compiled_block))
        bar.update()
        # A second sequence length: a recompilation, with Inductor's caches off so that it pays what a first run pays.
        other_length = torch.randn(8, 72, 128, generator=torch.Generator().manual_seed(1))
        recompile = compiling.time_compiling_call(lambda: compiled_block(other_length).square().mean().backward(),
                                                  use_caches=False)
        bar.update()
    compile_timings = speed.time_interleaved({"eager": lambda: block_step(eager_block),
                                              "compiled": lambda: block_step(compiled_block)}, repeats=7)
    print(f"C++ compiler: {compiler_path}")
    print(f"first call (capture and compile, and Inductor's one-off start in this process): {first_compile.describe()}")
    print(f"a new length (72 tokens), compiled again: {recompile.describe()}")
    display(Markdown(speed.compile_payback_sentence(recompile.seconds, compile_timings["eager"], compile_timings["compiled"])
                     + " The payback counts one new shape compiled with Inductor's caches off, what a learner's first "
                     "run pays per shape; the first call's time above is what this process paid at its start, with "
                     "the cache hits and misses it names."))
for name, timing in compile_timings.items():
    print(f"{name:>9}: {timing.describe()}")

# %% [markdown]
# **Recompilations.** Dynamo guards each graph on what it assumed: the
# shapes among others. A call with another sequence length breaks the guard
# and compiles again. Counted here with `backend="eager"` (graphs captured but
# run as they are: Dynamo's count, no C++ needed), over sequences of
# 40, 48, 56, 64 and 72 tokens, three ways:
#
# - `dynamic=False`: every new length is a new graph;
# - the default: after the first recompilation Dynamo marks the length
#   dynamic (a symbol, not a number) and compiles one graph for all lengths;
# - padding to a few lengths (*bucketing*, here multiples of 32): one graph per bucket.

# %% tags=["nbval-check-output"]
lengths = [40, 48, 56, 64, 72]


def block_loss(x):
    return eager_block(x).square().mean()


def by_length(length, bucket=None):
    padded = length if bucket is None else -(-length // bucket) * bucket
    return (torch.randn(8, padded, 128),)


graph_counts = {
    "dynamic=False": compiling.count_compiled_graphs(block_loss, [by_length(n) for n in lengths], dynamic=False),
    "default (automatic dynamic)": compiling.count_compiled_graphs(block_loss, [by_length(n) for n in lengths]),
    "padded to multiples of 32, dynamic=False": compiling.count_compiled_graphs(
        block_loss, [by_length(n, bucket=32) for n in lengths], dynamic=False),
}
for name, count in graph_counts.items():
    print(f"{name:>42}: {count} graph{'s' if count != 1 else ''} compiled for {len(lengths)} lengths")

# %% [markdown]
# Each of those graphs, in a real training step, costs an Inductor compile of
# its forward and backward, the time measured above. Padding to a few lengths
# wastes some tokens (section 2) to save compiles; dynamic shapes save both,
# with code that cannot specialise on the exact length.
#
# **A graph break.** Where Dynamo meets something it cannot put in a graph, it
# splits the function in two and runs the rest in Python: a *graph break*. A
# classic: logging the loss with `.item()` inside the compiled step (a Python
# number needs the value now, in the middle of the graph). `torch._dynamo.explain`
# reports the graphs and the reasons for the breaks.

# %%
logged_losses = []


def step_that_logs(x):
    loss = eager_block(x).square().mean()
    logged_losses.append(loss.item())  # a Python float, now: a graph break
    return loss * 2


def step_that_returns(x):
    return eager_block(x).square().mean() * 2  # the caller logs the returned loss: no break


# Dynamo logs a warning for the break at the moment it meets it; explain() below reports it (and its reason) instead.
logging.getLogger("torch._dynamo").setLevel(logging.ERROR)
for function in (step_that_logs, step_that_returns):
    torch._dynamo.reset()
    report = torch._dynamo.explain(function)(block_input)
    reasons = "; ".join(sorted({reason.reason.splitlines()[0] for reason in report.break_reasons})) or "none"
    print(f"{function.__name__}: {report.graph_count} graph{'s' if report.graph_count != 1 else ''}, "
          f"{report.graph_break_count} graph break{'s' if report.graph_break_count != 1 else ''} (reason: {reasons})")
torch._dynamo.reset()

# %% [markdown]
# The fix is to keep the value a tensor inside the compiled code and read it
# outside (after the step), or every few steps. Other frequent breaks: `print`,
# data-dependent `if tensor > 0:`, calls into libraries Dynamo cannot trace.
# `TORCH_LOGS="graph_breaks"` lists them in a real script.

# %% [markdown]
# ## 5. The optimizer step
#
# AdamW updates every parameter tensor with a dozen element-wise operations.
# Three implementations of the same arithmetic in `torch.optim.AdamW`:
#
# - `foreach=False`: a Python loop over the tensors, one operator at a time;
# - `foreach=True`: each operation once on the whole list of tensors
#   (`torch._foreach_*`; the default on CUDA);
# - `fused=True`: one fused operator (`torch._fused_adamw_`) does the whole
#   update, all of AdamW's arithmetic in one pass over each tensor.
#
# Each timed on the GPT-2-shaped model's parameters, the gradients of one
# batch in place, and the memory of a whole step from the planner:

# %%
gpt(**gpt_batch).loss.backward()
optimizer_variants = {"for-loop": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}
adamw_variants, optimizer_plans, after_one_step = {}, {}, {}
for name, options in optimizer_variants.items():
    parameters = [p.detach().clone().requires_grad_() for p in gpt.parameters()]
    for parameter, original in zip(parameters, gpt.parameters()):
        parameter.grad = original.grad.clone()
    adamw_variants[name] = torch.optim.AdamW(parameters, lr=1e-4, **options)
    adamw_variants[name].step()
    after_one_step[name] = [p.detach().clone() for p in parameters]
    optimizer_plans[name] = memory.estimate_training_memory(gpt, "adamw", 8, LM_SEQ_LEN, **options)
optimizer_timings = speed.time_interleaved({name: optimizer.step for name, optimizer in adamw_variants.items()},
                                           repeats=7, desc="timing three AdamW, in turns")
gpt.zero_grad()
for name, timing in optimizer_timings.items():
    plan = optimizer_plans[name]
    gap = max((a - b).abs().max().item() for a, b in zip(after_one_step[name], after_one_step["for-loop"]))
    print(f"{name:>8}: step {timing.describe()}; planned peak of the optimizer step "
          f"{plan.peak_by_phase['optimizer step'] / MIB:6.1f} MiB (state {plan.optimizer_state / MIB:.1f} MiB); "
          f"largest difference from the for-loop's parameters {gap:.1e}")
for name in ("foreach", "fused"):
    print(speed.compare(name, optimizer_timings[name], "for-loop", optimizer_timings["for-loop"]).sentence())

# %%
extra = {name: optimizer_plans[name].peak_by_phase["optimizer step"] - optimizer_plans["for-loop"].peak_by_phase["optimizer step"]
         for name in ("foreach", "fused")}
weights = optimizer_plans["for-loop"].weights
states = {optimizer_plans[name].optimizer_state for name in optimizer_plans}
display(Markdown(
    f"{'The same state' if len(states) == 1 else 'Different states'} "
    f"({', '.join(f'{optimizer_plans[n].optimizer_state / MIB:.1f} MiB' for n in optimizer_plans)}); the planner's peak "
    f"during the optimizer step differs from the for-loop's by {extra['foreach'] / MIB:+.1f} MiB for `foreach` and "
    f"{extra['fused'] / MIB:+.1f} MiB for `fused`, against weights of {weights / MIB:.1f} MiB. "
    + ("`foreach` works on the whole list at once, so its temporaries exist for all tensors together, where the loop "
       "has one tensor's at a time." if extra["foreach"] > 0 else "")
))

# %% [markdown]
# ## 6. The input pipeline
#
# The step waits while the next batch is made. Lesson 1's loader tokenises
# the whole dataset once, before training (`dataset.map`); a loader can also
# tokenise each pair when it is drawn, on the fly. `num_workers=1` moves that
# work to a worker process that prepares the next batches while the main
# process trains. Three loaders over the same 128 pairs, each feeding the
# course classifier's training step:

# %%
class PairsTokenisedOnTheFly(torch.utils.data.Dataset):
    """Each item is tokenised when the loader asks for it."""

    def __init__(self, pairs):
        self.pairs = pairs

    def __len__(self):
        return len(self.pairs)

    def __getitem__(self, index):
        row = self.pairs[index]
        encoded = tokenizer(row["sentence1"], row["sentence2"], truncation=True, max_length=data.DEFAULT_MAX_LENGTH)
        return {**encoded, "labels": row["label"]}


collator = transformers.DataCollatorWithPadding(tokenizer)
loaders = {
    "pre-tokenised": data.make_dataloader("train", batch_size=32, shuffle=False, limit=128),
    "on the fly": torch.utils.data.DataLoader(PairsTokenisedOnTheFly(pairs), batch_size=32, collate_fn=collator),
    "on the fly, 1 worker": torch.utils.data.DataLoader(PairsTokenisedOnTheFly(pairs), batch_size=32, collate_fn=collator,
                                                        num_workers=1),
}


def train_one_epoch(loader, profile_ranges=False):
    """Train one epoch; return the seconds spent waiting for batches."""
    waited = 0.0
    batches = iter(loader)
    while True:
        start = time.perf_counter()
        with torch.profiler.record_function("wait for data"):
            batch = next(batches, None)
        waited += time.perf_counter() - start
        if batch is None:
            return waited
        with torch.profiler.record_function("training step"):
            training_step(classifier, classifier_optimizer, batch)


waits = {name: [] for name in loaders}
loader_timings = speed.time_interleaved(
    {name: lambda loader=loader, name=name: waits[name].append(train_one_epoch(loader)) for name, loader in loaders.items()},
    repeats=3, desc="timing three loaders, in turns")
waits = {name: waited[1:] for name, waited in waits.items()}  # the warm-up epoch's wait is not counted
for name, timing in loader_timings.items():
    share = sorted(w / t for w, t in zip(waits[name], timing.seconds))
    print(f"{name:>21}: epoch {timing.describe()}; waiting for data {share[len(share) // 2]:.1%} of it "
          f"(from {share[0]:.1%} to {share[-1]:.1%})")
for name in ("on the fly", "on the fly, 1 worker"):
    print(speed.compare(name, loader_timings[name], "pre-tokenised", loader_timings["pre-tokenised"]).sentence())

# %% [markdown]
# **The profiler sees the waits.** `torch.profiler` records every operator and
# every range opened with `torch.profiler.record_function`; the training loop
# above marks "wait for data" and "training step". One epoch of the on-the-fly
# loader without workers, drawn as a timeline: the gaps in the "training step"
# row are the waits.

# %%
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as loader_profile:
    train_one_epoch(loaders["on the fly"])
loader_spans = speed_plots.timeline_spans(loader_profile, ("wait for data", "training step"))
figure = speed_plots.plot_timeline(
    [span for span in loader_spans if span[0] != "operators"],
    "One epoch, tokenising on the fly without workers: training steps and the waits between them",
)
waited_ms = sum(duration for lane, _, _, duration in loader_spans if lane == "wait for data")
stepped_ms = sum(duration for lane, _, _, duration in loader_spans if lane == "training step")
print(f"profiled: {waited_ms:.1f} ms waiting for data, {stepped_ms:.1f} ms in training steps "
      f"({waited_ms / (waited_ms + stepped_ms):.1%} waiting)")

# %% [markdown]
# The share of waiting depends on how long a step takes against how long a
# batch takes to make: with a larger model the step grows and the same
# tokenising matters less. Workers cost their start-up at every epoch
# (`persistent_workers=True` keeps them), and on a 2-core machine a worker
# competes with the training for the second core.

# %% [markdown]
# ## 7. Find the bottleneck with the profiler
#
# One training step of the GPT-2-shaped model, profiled, with its three parts
# marked. First the table of the operators that took the most time (their own
# time, without the operators they called), then the step's timeline.

# %%
def profiled_step(model, optimizer, batch):
    with torch.profiler.record_function("forward"):
        loss = model(**batch).loss
    with torch.profiler.record_function("backward"):
        loss.backward()
    with torch.profiler.record_function("optimizer step"):
        optimizer.step()
        optimizer.zero_grad()


profiled_step(gpt, gpt_optimizer, gpt_batch)  # warm-up, not profiled
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as step_profile:
    profiled_step(gpt, gpt_optimizer, gpt_batch)
print(step_profile.key_averages().table(sort_by="self_cpu_time_total", row_limit=8, max_name_column_width=40))

# %%
step_spans = speed_plots.timeline_spans(step_profile, ("forward", "backward", "optimizer step"))
figure = speed_plots.plot_timeline(step_spans, "One training step of the GPT-2-shaped model, profiled")
part_ms = {lane: sum(d for l, _, _, d in step_spans if l == lane) for lane in ("forward", "backward", "optimizer step")}
total_ms = sum(part_ms.values())
print(", ".join(f"{lane} {ms:.1f} ms ({ms / total_ms:.0%})" for lane, ms in part_ms.items())
      + f"; backward / forward = {part_ms['backward'] / part_ms['forward']:.2f}")
top = step_profile.key_averages()
top_operator = max(top, key=lambda event: event.self_cpu_time_total)
print(f"the operator with the most time of its own: {top_operator.key}, "
      f"{top_operator.self_cpu_time_total / 1e3:.1f} ms in {top_operator.count} calls")

# %% [markdown]
# The backward pass does about twice the forward's matrix products (section
# 1): the ratio printed above says how close the time comes to that. In the table,
# `aten::addmm` and `aten::mm` are the matrix products; the element-wise
# operators beside them are what `torch.compile` and fused kernels merge. (The
# profiler also writes a Chrome trace, `prof.export_chrome_trace("step.json")`,
# which `chrome://tracing` or [Perfetto](https://ui.perfetto.dev) open; the
# figure above needs neither.)

# %% [markdown]
# ## 8. Time against memory
#
# Lesson 5's levers shrink memory; what do they cost in speed? The course
# classifier, an effective batch of 32 sequences of 64 tokens per optimizer
# step, five ways: the planner's peak (lesson 4) and the measured tokens per second.

# %%
SEQ_LEN = 64
full_batch = memory.training_batch(classifier, 32, SEQ_LEN, generator=torch.Generator().manual_seed(0))


def micro_batches(size):
    return [{name: tensor[i:i + size] for name, tensor in full_batch.items()} for i in range(0, 32, size)]


def accumulating_step(model, optimizer, batches):
    for batch in batches:
        (model(**batch).loss / len(batches)).backward()
    optimizer.step()
    optimizer.zero_grad()


setups = {
    "batch 32": dict(micro=32, steps=1, checkpointing=False),
    "batch 32, checkpointing": dict(micro=32, steps=1, checkpointing=True),
    "2 x 16 accumulated": dict(micro=16, steps=2, checkpointing=False),
    "4 x 8 accumulated": dict(micro=8, steps=4, checkpointing=False),
    "batch 8 (a smaller batch)": dict(micro=8, steps=1, checkpointing=False),
}
steps, plans = {}, {}
for name, setup in setups.items():
    # Train mode: transformers skips checkpointing in eval mode, where from_pretrained leaves a model.
    model = models.load_pretrained_classifier().train()
    if setup["checkpointing"]:
        model.activation_checkpointing_enable()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batches = micro_batches(setup["micro"])[:setup["steps"]]
    steps[name] = lambda model=model, optimizer=optimizer, batches=batches: accumulating_step(model, optimizer, batches)
    plans[name] = memory.estimate_training_memory(model, "adamw", setup["micro"], SEQ_LEN,
                                                  gradient_accumulation_steps=setup["steps"])
step_timings = speed.time_interleaved(steps, repeats=5, desc="timing five set-ups, in turns")
speed_and_memory = {name: (step_timings[name], setup["micro"] * setup["steps"] * SEQ_LEN, plans[name].peak)
                    for name, setup in setups.items()}
for name, (timing, tokens, peak) in speed_and_memory.items():
    median, slowest, fastest = timing.rate(tokens)
    print(f"{name:>26}: planned peak {peak / MIB:5.1f} MiB, {median:8,.0f} tokens/s ({slowest:,.0f}-{fastest:,.0f})")
figure = speed_plots.plot_speed_against_memory(speed_and_memory, "The course classifier: speed against memory, five set-ups")

# %%
def per_token(name):
    """The seconds per token of each run: the set-ups process different numbers of tokens per step."""
    timing, tokens, _ = speed_and_memory[name]
    return speed.Timing(tuple(s / tokens for s in timing.seconds))


def verdict(name, reference="batch 32"):
    return speed.compare(name, per_token(name), reference, per_token(reference)).sentence()


display(Markdown("\n".join(f"- per token, {verdict(name)}" for name in list(setups)[1:])))

# %% [markdown]
# Checkpointing runs each block's forward a second time during the backward
# pass; accumulation and smaller batches run more, smaller operations, each
# with its fixed cost per call. The verdicts above say what that cost here,
# per token and against the run-to-run spread. Memory a lever frees is not
# only for fitting a step that would not fit: it is routinely spent on a larger
# micro-batch, which can run faster per token. Measured here:

# %%
display(Markdown(speed.larger_batch_sentence(
    speed.verdict("batch 32", per_token("batch 32"), "batch 8", per_token("batch 8 (a smaller batch)")),
    speed_and_memory["batch 32"][2] - speed_and_memory["batch 8 (a smaller batch)"][2])))

# %% [markdown]
# That is why selective checkpointing exists: it recomputes only the
# activations that are cheap to recompute and keeps the expensive ones
# (`torch.utils.checkpoint.create_selective_checkpoint_contexts` with a
# policy per operator, `CheckpointPolicy.MUST_SAVE` for the matrix products),
# so it frees much of the memory for a fraction of full checkpointing's extra
# forward; the memory freed then buys a larger batch. Exercise 2 asks you to
# choose within a budget.

# %% [markdown]
# ## 9. What changes on a GPU
#
# Nothing in this section was measured here: it is what the sources say, and
# what you should measure yourself with this lesson's tools on your GPU.
#
# - **bf16 and TF32 tensor cores.** On a CPU, bf16 pays only where the CPU has
#   bf16 units and the step is mostly matrix products: section 1 measured both
#   on yours. NVIDIA GPUs from Ampere (A100) on multiply bf16 and fp16 on
#   tensor cores, at several times their fp32 rate, and can run fp32 matrix
#   products in TF32 (`torch.backends.cuda.matmul.allow_tf32 = True`, or
#   `torch.set_float32_matmul_precision("high")`). Sources:
#   [CUDA semantics: TF32](https://pytorch.org/docs/stable/notes/cuda.html#tensorfloat-32-tf32-on-ampere-and-later-devices),
#   [automatic mixed precision](https://pytorch.org/docs/stable/amp.html), and the
#   peak FLOP/s in the vendor's data sheet. MFU on a GPU is PaLM's: the
#   tokens/s times the FLOPs per token over the data sheet's dense peak of the
#   precision you train in (section 1's first utilisation, not its second).
# - **Flash attention.** On CUDA, SDPA dispatches to FlashAttention kernels
#   when the inputs allow it (fp16 or bf16, no arbitrary mask, a supported
#   head size: section 3 shows how to ask for it); they tile the computation
#   in on-chip memory: less memory *and* less time, because attention on a GPU
#   is limited by memory traffic. Sources:
#   [FlashAttention](https://arxiv.org/abs/2205.14135),
#   [FlashAttention-2](https://arxiv.org/abs/2307.08691),
#   [SDPA tutorial](https://pytorch.org/tutorials/intermediate/scaled_dot_product_attention_tutorial.html).
# - **Fused kernels and `torch.compile`.** A GPU launches each operator as a
#   kernel, with a few microseconds of overhead, and element-wise kernels are
#   limited by memory bandwidth: fusing them (Inductor generates Triton
#   kernels) and fused optimizers (`fused=True`, `foreach=True`, the CUDA
#   default) matter more there than on a CPU. Sources:
#   [torch.compile tutorial](https://pytorch.org/tutorials/intermediate/torch_compile_tutorial.html),
#   [`torch.optim` docs on foreach and fused](https://pytorch.org/docs/stable/optim.html#algorithms),
#   [performance tuning guide](https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html).
# - **CUDA graphs.** A small model's step can be limited by the CPU launching
#   kernels; a CUDA graph records the launches once and replays them in one
#   go (`torch.compile(mode="reduce-overhead")` uses them). Source:
#   [Accelerating PyTorch with CUDA Graphs](https://pytorch.org/blog/accelerating-pytorch-with-cuda-graphs/).
# - **Overlapping communication.** With several GPUs, DDP all-reduces the
#   gradients in buckets *during* the backward pass, so communication hides
#   behind computation (lesson 6); FSDP prefetches the next layer's weights.
#   Sources: [PyTorch Distributed (VLDB 2020)](https://arxiv.org/abs/2006.15704),
#   [DDP notes](https://pytorch.org/docs/stable/notes/ddp.html).
# - **Timing on a GPU.** CUDA runs asynchronously: call
#   `torch.cuda.synchronize()` before reading the clock (or use CUDA events),
#   else you time the launch, not the work. `torch.cuda.max_memory_allocated()`
#   gives the peak. Source:
#   [CUDA semantics: asynchronous execution](https://pytorch.org/docs/stable/notes/cuda.html#asynchronous-execution).

# %% [markdown]
# ## 10. What good utilisation looks like
#
# Section 1 divided this CPU's work by a peak. What do the largest training
# runs reach, against the peak of the chips they ran on? As their papers report
# it (nothing here was measured on this machine):

# %%
import gc
import multiprocessing
import statistics

from course_utils import chunked_loss, input_pipeline, profiling, shapes, utilisation

rows = ["| model | hardware | chips | precision | utilisation | counts | TFLOP/s per chip | source |",
        "| --- | --- | ---: | --- | ---: | --- | ---: | --- |"]
for run in utilisation.PUBLISHED_RUNS:
    chips = f"{run.chips:,}" if run.chips else "(not given)"
    rate = f"{run.tflops_per_chip:,.0f}" if run.tflops_per_chip else ""
    rows.append(f"| {run.model} | {run.hardware} | {chips} | {run.precision} | {run.utilisation:.1%} | {run.counts} | "
                f"{rate} | {run.source} |")
model_flops_runs = [run.utilisation for run in utilisation.PUBLISHED_RUNS if run.counts == "model FLOPs"]
palm = {run.counts: run.utilisation for run in utilisation.PUBLISHED_RUNS if run.model == "PaLM 540B"}
display(Markdown("\n".join(rows) + f"\n\nThe MFU figures run from {min(model_flops_runs):.1%} to "
                 f"{max(model_flops_runs):.1%}; PaLM's {palm['model FLOPs']:.1%} MFU is the same run's "
                 f"{palm['hardware FLOPs']:.1%} HFU (below)."))

# %% [markdown]
# The figures only compare when both terms mean the same thing: the numerator's
# FLOPs (model or hardware, below) and the denominator's peak. Llama 3's
# paper gives its achieved TFLOP/s per GPU beside its MFU, so the peak it
# divided by can be recovered, and set beside what the data sheet prints:

# %%
peaks = {peak.chip: peak for peak in utilisation.DATA_SHEET_PEAKS}
h100 = peaks["H100 SXM"]
for run in utilisation.PUBLISHED_RUNS:
    if run.model.startswith("Llama 3"):
        print(f"{run.model:>26}, {run.chips:,} GPUs: {run.tflops_per_chip:.0f} TFLOP/s per GPU = "
              f"{run.tflops_per_chip / h100.dense_tflops:.1%} of the dense bf16 peak ({h100.dense_tflops:,.1f}), "
              f"{run.tflops_per_chip / h100.sparse_tflops:.1%} of the data sheet's headline ({h100.sparse_tflops:,.1f}); "
              f"the paper says {run.utilisation:.0%}")
for peak in utilisation.DATA_SHEET_PEAKS:
    sparse = f"{peak.sparse_tflops:,.1f} with 2:4 sparsity" if peak.sparse_tflops else "no sparsity figure"
    print(f"{peak.chip:>9} {peak.precision}: {peak.dense_tflops:,.1f} TFLOP/s dense, {sparse} ({peak.source})")

# %% [markdown]
# **The data-sheet trap.** The headline bf16 figure of an H100 or an A100 data
# sheet carries an asterisk: "with sparsity". It is the rate of *2:4 structured
# sparsity*, where two of every four weights are zero and the tensor cores skip
# them; a dense training step never gets it. Divided by that figure, the same
# Llama 3 run reads as half its MFU (above): divide by the dense peak of the
# precision you train in.
#
# **MFU against HFU.** MFU counts the FLOPs the model needs (6 per weight per
# token); *hardware* FLOPs utilisation (HFU) counts what the chips executed.
# With activation checkpointing (lesson 5) the backward pass runs each
# checkpointed forward again: 2 more FLOPs per weight, so 8 where the model
# needs 6, and the same step at the same speed reports an HFU 4/3 of its MFU.
# PaLM reports both (the table); Megatron-LM's figure counts the
# recomputation (its equation 3), so it is an HFU. torch's `FlopCounterMode`
# counts what runs, so it sees the difference: a stack of four linear blocks, its input needing
# a gradient, one step plain and one under `torch.utils.checkpoint`, with
# full recomputation and with torch's default, which stops recomputing once it
# has every tensor the backward still needs:

# %%
from torch.utils.checkpoint import checkpoint, set_checkpoint_early_stop

torch.manual_seed(0)
stack = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(4)])
stack_input = torch.randn(32, 64, requires_grad=True)


def checkpointed_stack_step():
    checkpoint(stack, stack_input, use_reentrant=False).sum().backward()


stack_plain = utilisation.count_flops(lambda: stack(stack_input).sum().backward())
with set_checkpoint_early_stop(False):
    stack_full = utilisation.count_flops(checkpointed_stack_step)
stack_default = utilisation.count_flops(checkpointed_stack_step)
print(f"plain step: {stack_plain:,} FLOPs; full recomputation: {stack_full:,} ({stack_full / stack_plain:.4f}x, "
      f"4/3 = {4 / 3:.4f}); torch's default (early stop): {stack_default:,} ({stack_default / stack_plain:.4f}x)")
display(Markdown(f"Full recomputation: {utilisation.describe_recomputation(stack_plain, stack_full)}. "
                 f"With the early stop: {utilisation.describe_recomputation(stack_plain, stack_default)}."))

# %% [markdown]
# A real model's ratio is lower still: what lies outside the checkpointed
# blocks (the output layer, the loss) is not recomputed. A 2-block Llama
# with a vocabulary of 32,000 (section 14 uses it again), checkpointed per
# block by transformers (`activation_checkpointing_enable()`), its output
# layer's share of the weights printed beside the ratio:

# %%
LLAMA_VOCAB, LLAMA_SEQ_LEN = 32_000, 128
torch.manual_seed(0)
big_vocab_llama = LlamaForCausalLM(LlamaConfig(
    vocab_size=LLAMA_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
    num_key_value_heads=2, max_position_embeddings=LLAMA_SEQ_LEN, use_cache=False)).train()
llama_ids = torch.randint(0, LLAMA_VOCAB, (2, LLAMA_SEQ_LEN), generator=torch.Generator().manual_seed(0))
llama_batch = {"input_ids": llama_ids, "labels": llama_ids}


def llama_backward(model):
    model(**llama_batch).loss.backward()


llama_plain = utilisation.count_flops(lambda: llama_backward(big_vocab_llama))
big_vocab_llama.activation_checkpointing_enable()
llama_checkpointed = utilisation.count_flops(lambda: llama_backward(big_vocab_llama))
big_vocab_llama.activation_checkpointing_disable()
big_vocab_llama.zero_grad()
head_share = big_vocab_llama.lm_head.weight.numel() / speed.matmul_weights(big_vocab_llama)
print(f"the output layer: {head_share:.1%} of the matmul weights; "
      f"{utilisation.describe_recomputation(llama_plain, llama_checkpointed)}")

# %% [markdown]
# ## 11. Shapes the hardware likes
#
# **Arithmetic intensity.** A matrix product of (m, k) by (k, n) does 2mkn
# FLOPs and moves at least mk + kn + mn numbers. With m the tokens of a
# micro-batch and k = n the width, few tokens mean few FLOPs per byte moved:
# the product waits on memory, not on arithmetic. Measured here, fp32, width
# 256, each product repeated until a timed call does enough work to read the clock:

# %%
WIDTH = 256
row_shapes = [(rows, WIDTH, WIDTH) for rows in (1, 8, 64, 512)]
row_timings = shapes.time_matmuls(row_shapes, repeats=7)
for shape, timing in row_timings.items():
    median, slowest, fastest = shapes.gflops(shape, timing)
    print(f"{shape[0]:>4} tokens x {WIDTH} x {WIDTH}: {shapes.arithmetic_intensity(shape):6.1f} FLOPs/byte, "
          f"{median:7.1f} GFLOP/s (slowest run {slowest:.1f}, fastest {fastest:.1f})")
display(Markdown(shapes.describe_shape_pair("1 token", row_shapes[0], row_timings[row_shapes[0]],
                                            "512 tokens", row_shapes[-1], row_timings[row_shapes[-1]]) + "."))

# %% [markdown]
# On a GPU the same curve is steeper: its peak is far higher against its
# memory bandwidth, so it needs more FLOPs per byte to be busy (NVIDIA's
# [Matrix Multiplication Background User's Guide](https://docs.nvidia.com/deeplearning/performance/dl-performance-matrix-multiplication/index.html),
# "Math And Memory Bounds"). That is a reason a micro-batch is made as large
# as memory allows.
#
# **Alignment, and vocabulary padding.** Tensor cores multiply tiles; cuBLAS
# uses them fully when the dimensions are multiples of 8 for fp16/bf16 (16
# bytes), and its larger tiles prefer multiples of 64 or 128 (the same guide,
# "Tensor Core Requirements"). The vocabulary is the one dimension a model
# rarely chooses: nanoGPT's `GPTConfig` (`model.py`) sets `vocab_size = 50304`,
# "GPT-2 vocab_size of 50257, padded up to nearest multiple of 64 for
# efficiency". The extra rows are tokens no text contains. On this CPU:

# %%
for vocabulary in (50_257, len(tokenizer)):
    print(f"vocabulary {vocabulary:,}: padded to a multiple of 64, {shapes.padded_to_multiple(vocabulary, 64):,} "
          f"(+{shapes.padded_to_multiple(vocabulary, 64) - vocabulary} rows)")
head_shapes = [(128, 64, 50_257), (128, 64, shapes.padded_to_multiple(50_257, 64))]
head_timings = shapes.time_matmuls(head_shapes, repeats=7)
for shape, timing in head_timings.items():
    print(f"logits of 128 tokens, width 64, vocabulary {shape[2]:,}: {timing.describe(1e3, 'ms')}, "
          f"{shapes.gflops(shape, timing)[0]:.1f} GFLOP/s")
display(Markdown(shapes.describe_shape_pair("vocabulary 50,257", head_shapes[0], head_timings[head_shapes[0]],
                                            "vocabulary 50,304", head_shapes[1], head_timings[head_shapes[1]]) + "."))

# %% [markdown]
# ## 12. `foreach` on a CPU, and on a GPU
#
# Section 5 timed `foreach=True` against the for-loop. What does the list
# operator do on this device? The profiler counts the operators each of
# section 5's AdamW steps runs, nested calls included:

# %%
loop_calls = profiling.operator_calls(adamw_variants["for-loop"].step)
foreach_calls = profiling.operator_calls(adamw_variants["foreach"].step)
print(f"{len(list(gpt.parameters()))} parameter tensors")
display(Markdown(profiling.describe_foreach_calls(loop_calls, foreach_calls, "aten::mul_", "aten::_foreach_mul_") + ". "
                 "Section 5's timing: " + speed.compare("foreach", optimizer_timings["foreach"], "for-loop",
                                                       optimizer_timings["for-loop"]).sentence() + "."))

# %% [markdown]
# On a CPU the arithmetic runs where the operator is called, so a list
# operator that loops in C++ saves only Python's cost per call; how much
# that is of this step, section 5's verdict above says. On CUDA each
# per-tensor operator is a kernel launch (a few microseconds each, and the GPU idles between small ones); the
# CUDA `_foreach_*` kernels process many tensors per launch
# (`multi_tensor_apply`), so a step over hundreds of parameter tensors makes
# many times fewer launches, and `fused=True` does all of AdamW's
# arithmetic in one pass. That is why `foreach` is the default on CUDA: the
# [`torch.optim` documentation, "Algorithms" and the `foreach` argument](https://pytorch.org/docs/stable/optim.html#algorithms)
# ("we will try to use foreach over the for-loop implementation on CUDA, since
# it is usually significantly more performant"), and the
# [`torch._foreach` note](https://pytorch.org/docs/main/foreach.html) (a
# horizontally fused multi-tensor kernel on an accelerator, a per-tensor
# fallback otherwise). Its price, on every device, is section 5's memory: the
# temporaries of all tensors at once.

# %% [markdown]
# ## 13. The input pipeline, again: where workers help
#
# **Reading section 6 again.** Tokenising on the fly made the loop wait
# longer than the pre-tokenised loader (its shares of waiting, above), while the
# epochs' verdict can say "no measurable difference": how do both hold? The
# two loaders make the same batches (same pairs, same order, same padding):

# %%
same_batches = all(
    torch.equal(a["input_ids"], b["input_ids"]) and torch.equal(a["attention_mask"], b["attention_mask"])
    for a, b in zip(loaders["pre-tokenised"], loaders["on the fly"]))
print(f"the same batches from both loaders: {same_batches}; shapes "
      f"{[tuple(batch['input_ids'].shape) for batch in loaders['pre-tokenised']]}")

# %% [markdown]
# So an epoch is its training steps (the same work) plus its waits. Section 6
# timed the loaders in turns: in each round, the time in training steps is
# the epoch minus its wait, and the two loaders' rounds can be compared pair by pair:

# %%
extra_wait = [fly - pre for fly, pre in zip(waits["on the fly"], waits["pre-tokenised"])]
steps_by_loader = {name: [epoch - waited for epoch, waited in zip(loader_timings[name].seconds, waits[name])]
                   for name in ("pre-tokenised", "on the fly")}
step_difference = [fly - pre for fly, pre in zip(steps_by_loader["on the fly"], steps_by_loader["pre-tokenised"])]
for round_, (added, stepped) in enumerate(zip(extra_wait, step_difference), 1):
    print(f"round {round_}: on the fly waits {added * 1e3:+6.1f} ms more; its training steps took "
          f"{stepped * 1e3:+6.1f} ms more; its epoch {(added + stepped) * 1e3:+6.1f} ms more")
epochs_differ = speed.compare("on the fly", loader_timings["on the fly"], "pre-tokenised",
                              loader_timings["pre-tokenised"]).measurable
display(Markdown(input_pipeline.describe_extra_wait(extra_wait, step_difference, epochs_differ) + "."))

# %% [markdown]
# The epoch is the sum of the two, round by round: the wait for data is
# there whatever the epochs' verdict says, and the verdict on whole epochs
# hides it whenever the training steps' own time moves by as much. Why the
# same training steps take a different time in the two loops, this
# measurement does not say; it shows where the wait went.

# %% [markdown]
# **Where a worker helps.** A worker process overlaps making the next batch
# with the training step. On a 2-core machine tokenising in a worker competes
# with the training for the cores (section 6); waiting does not. Reading from
# slow storage is waiting: `input_pipeline.WithReadLatency` adds 2 ms per
# item to the pre-tokenised pairs (a stand-in for a network file system,
# labelled as such), and three loaders feed the same training step for 2
# epochs each: no worker, one worker started at every epoch, and one kept
# across epochs with `persistent_workers=True`:

# %%
slow_pairs = input_pipeline.WithReadLatency(loaders["pre-tokenised"].dataset.select(range(32)), seconds=0.002)
pipeline_loaders = {
    "no worker": torch.utils.data.DataLoader(slow_pairs, batch_size=16, collate_fn=collator),
    "1 worker": torch.utils.data.DataLoader(slow_pairs, batch_size=16, collate_fn=collator, num_workers=1),
    "1 persistent worker": torch.utils.data.DataLoader(slow_pairs, batch_size=16, collate_fn=collator, num_workers=1,
                                                       persistent_workers=True),
}
epoch_records = {name: [] for name in pipeline_loaders}
pipeline_timings = speed.time_interleaved(
    {name: lambda name=name, loader=loader: epoch_records[name].append(input_pipeline.time_epochs(
        loader, lambda batch: training_step(classifier, classifier_optimizer, batch), epochs=2))
     for name, loader in pipeline_loaders.items()},
    repeats=3, desc="timing three loaders over 2 epochs, in turns")
second_epoch_waits = {name: [record.first_batch_waits[1] for record in records[1:]]  # the warm-up round left out
                      for name, records in epoch_records.items()}
for name, timing in pipeline_timings.items():
    print(f"{name:>20}: 2 epochs {timing.describe()}; waiting for the second epoch's first batch "
          f"{statistics.median(second_epoch_waits[name]) * 1e3:.1f} ms (median)")
for name in ("1 worker", "1 persistent worker"):
    print(speed.compare(name, pipeline_timings[name], "no worker", pipeline_timings["no worker"]).sentence())
print(speed.compare("1 persistent worker", pipeline_timings["1 persistent worker"], "1 worker",
                    pipeline_timings["1 worker"]).sentence())
display(Markdown(input_pipeline.describe_first_batch_waits(second_epoch_waits, "1 worker", "1 persistent worker")
                 + "."))
# A persistent worker lives as long as its loader: let the loaders go, so that no worker outlives this cell.
del pipeline_loaders
gc.collect()
print(f"worker processes still running: {len(multiprocessing.active_children())}")

# %% [markdown]
# Without `persistent_workers` the worker is started again at every epoch
# (a new process, with its copy of the dataset) before it reads anything; with it,
# the worker stays. In every loader the first batch of an epoch waits for
# its reads: nothing is read before the epoch asks for its first batch. Within an epoch
# the worker reads the next batch while this one trains, and that overlap is
# what a kept worker can gain over none; the verdicts above say what it gained here.

# %% [markdown]
# ## 14. A real model step: `torch.compile` and a chunked loss
#
# **Compiling a transformers Llama.** Section 4 compiled one feed-forward
# block. The 2-block Llama of section 10 (width 64, a vocabulary of 32,000)
# is a real transformers model: what does Dynamo make of it? `torch._dynamo.explain`
# captures the forward and the loss without generating code, and says how
# many graphs and breaks it found:

# %%
def llama_loss(model):
    return model(**llama_batch).loss


torch._dynamo.reset()
start = time.perf_counter()
llama_report = torch._dynamo.explain(llama_loss)(big_vocab_llama)
capture_seconds = time.perf_counter() - start
torch._dynamo.reset()
print(f"Dynamo's capture of the Llama forward and loss: {capture_seconds:.1f} s; {llama_report.graph_count} "
      f"graph{'s' if llama_report.graph_count != 1 else ''}, {llama_report.graph_break_count} graph "
      f"break{'s' if llama_report.graph_break_count != 1 else ''}, {len(llama_report.ops_per_graph[0])} operators "
      f"in the first graph")

# %% [markdown]
# That is the capture alone. Inductor's code generation adds a C++ compile
# of every fused kernel of the forward and of the backward, which on a
# laptop CPU takes much longer than the capture, so the lesson does not run
# it. `python -m benchmarks.bench_llama_compile` measures it on your machine (with Inductor's cache off: a cold compile),
# with the compiled step's time against eager. On a GPU the compile is paid
# once per distinct shape (section 4), and then every step saves its share.
#
# **A chunked cross-entropy.** The Llama's step makes logits of 2 x 128
# positions x 32,000 tokens: the largest activation of the step, with the
# softmax's gradient beside it. `chunked_loss.ChunkedLossLM` computes the same
# loss from the last hidden state, 64 positions at a time, each chunk under a
# checkpoint (its logits recomputed in the backward pass). First, the same
# loss and gradients:

# %%
chunked_llama = chunked_loss.ChunkedLossLM(big_vocab_llama, chunk_size=64)
plain_loss = big_vocab_llama(**llama_batch).loss
plain_loss.backward()
plain_gradients = [p.grad.clone() for p in big_vocab_llama.parameters()]
big_vocab_llama.zero_grad()
chunk_loss = chunked_llama(**llama_batch).loss
chunk_loss.backward()
gradient_gap = max((p.grad - g).abs().max().item() for p, g in zip(big_vocab_llama.parameters(), plain_gradients))
big_vocab_llama.zero_grad()
print(f"loss: plain {plain_loss.item():.6f}, chunked {chunk_loss.item():.6f} (difference "
      f"{abs(plain_loss.item() - chunk_loss.item()):.1e}); largest gradient difference {gradient_gap:.1e}")

# %% [markdown]
# Then the memory: the planner's plan of the plain step (lesson 4), and the
# allocator's record of each step (`memory.measure_allocator_rise`: the most
# the step held at once beyond the weights, optimizer state and batch it
# started with), with the largest tensor alive at that moment:

# %%
logits_bytes = llama_ids.numel() * LLAMA_VOCAB * 4
llama_plan = memory.estimate_training_memory(big_vocab_llama, "adamw", 2, LLAMA_SEQ_LEN)
planned_rise = llama_plan.peak - llama_plan.weights - llama_plan.optimizer_state
rises = {}
for name, model in (("plain loss", big_vocab_llama), ("chunked loss", chunked_llama)):
    rises[name] = memory.measure_allocator_rise(model, torch.optim.AdamW(model.parameters(), lr=1e-4), llama_batch)
big_vocab_llama.zero_grad(set_to_none=True)
print(f"logits of the whole batch: {logits_bytes / MIB:.1f} MiB; the planner's rise for the plain step: "
      f"{planned_rise / MIB:.1f} MiB")
for name, record in rises.items():
    largest, maker = record.live_at_peak[0]
    print(f"{name:>12}: the allocator's rise {record.rise / MIB:6.1f} MiB ({record.rise / logits_bytes:.2f} x the logits); "
          f"largest tensor alive at the peak {largest / MIB:.2f} MiB ({maker or 'no operator named'})")
saved = rises["plain loss"].rise - rises["chunked loss"].rise
print(f"the chunked loss holds {saved / MIB:.1f} MiB less at its peak: {saved / logits_bytes:.2f} x the logits")
chunk_timings = speed.time_interleaved({"plain loss": lambda: llama_backward(big_vocab_llama),
                                        "chunked loss": lambda: llama_backward(chunked_llama)}, repeats=5)
big_vocab_llama.zero_grad(set_to_none=True)
print(speed.compare("chunked loss", chunk_timings["chunked loss"], "plain loss", chunk_timings["plain loss"]).sentence())

# %% [markdown]
# The plain step's rise is a few logits-sized tensors (the logits, their log-softmax kept for the backward pass,
# the gradient of the logits); the chunked step holds one chunk's of each. It does one more product with the
# vocabulary matrix per chunk, in the backward pass; the verdict above says what the whole change did to the
# step's time here. Fused kernels
# ([Liger Kernel](https://github.com/linkedin/Liger-Kernel)'s fused linear cross-entropy,
# [Cut Cross-Entropy](https://arxiv.org/abs/2411.09009)) do the same on a GPU without the recomputation's Python loop.

# %% [markdown]
# ## 15. The profiler as a GPU script uses it
#
# Section 7 profiled one step. A training script profiles a few steps in the
# middle of training, on a schedule: `torch.profiler.schedule(wait, warmup,
# active, repeat)` skips `wait` steps, records `warmup` steps and throws them
# away (the profiler's own start-up lands there), keeps `active` steps, hands
# them to `on_trace_ready` (in a real script
# `torch.profiler.tensorboard_trace_handler(dir)` or `prof.export_chrome_trace`),
# and starts again `repeat` times. `record_shapes=True` records each operator's
# input shapes, so the table can be split by shape. The loop calls `prof.step()`
# after each step. Here, section 1's classifier step with `wait=1, warmup=1,
# active=2, repeat=2`:

# %%
scheduled = profiling.profile_on_schedule(lambda: training_step(classifier, classifier_optimizer, classifier_batch),
                                          wait=1, warmup=1, active=2, repeat=2)
for number, (recorded, last_step) in enumerate(scheduled.traces, 1):
    print(f"trace {number}: {recorded} steps recorded, handed over after step {last_step} of {scheduled.steps_run}")
print(scheduled.shapes_table)

# %% [markdown]
# The same operator appears once per input shape: the products of the attention
# and of the MLP are told apart, as a GPU script needs to find which shape is slow
# (on a GPU, `activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]` adds
# each kernel's GPU time; source: [torch.profiler](https://pytorch.org/docs/stable/profiler.html)).
#
# **The memory snapshot.** On CUDA, `torch.cuda.memory._record_memory_history()`
# records every allocation and free with its Python stack; after the steps,
# `torch.cuda.memory._dump_snapshot("snapshot.pickle")` writes them, and
# [pytorch.org/memory_viz](https://pytorch.org/memory_viz) draws the live
# tensors over time, each with the line that made it; it runs in the browser
# and uploads nothing (source: [Understanding CUDA Memory Usage](https://pytorch.org/docs/stable/torch_cuda_memory.html)).
# It records the CUDA caching allocator only, so a CPU run has nothing to
# record; the course's CPU counterparts are the tracker, the planner's step
# timeline (lesson 4) and the allocator record of section 14.

# %%
print(f"CUDA available here: {torch.cuda.is_available()}"
      + ("" if torch.cuda.is_available() else ": the snapshot has no allocator to record on this machine"))

# %% [markdown]
# ## Exercises
#
# ### Exercise 1 — The padding waste of a loader
#
# Write `padding_waste(batches)`: the share of the tokens processed that are
# padding, over all the batches together (a fraction between 0 and 1). Each
# batch is a dict with `input_ids` and `attention_mask`. The check runs it on
# loaders of its own; the cell after the hints runs it on section 2's four.

# %%
# BEGIN SOLUTION
def padding_waste(batches):
    real = processed = 0
    for batch in batches:
        real += int(batch["attention_mask"].sum())
        processed += batch["attention_mask"].numel()
    return 1 - real / processed
# END SOLUTION
# BEGIN STARTER
# def padding_waste(batches):
#     ____
# END STARTER


ex.q1.check()

# %%
# ex.q1.hint()
# ex.q1.solution()

# %%
if "strategies" not in globals():
    print("This cell runs your padding_waste on section 2's loaders, `strategies`: run section 2's first code cell "
          "(the one that builds the four ways to batch), then this one.")
elif ex.q1.evaluate(globals()).outcome.name == "CORRECT":
    for name, batches in strategies.items():
        print(f"{name:>22}: your padding_waste says {padding_waste(batches):.1%}")
else:
    print("Once exercise 1 is correct, this cell runs your padding_waste on section 2's loaders.")

# %% [markdown]
# ### Exercise 2 — The fastest set-up that fits
#
# Write `fastest_that_fits(setups, budget_bytes)`: `setups` maps a name to
# `(timing, tokens_per_step, peak_bytes)`, as `speed_and_memory` in section 8
# does. Return the name of the set-up with the most tokens per second (median)
# among those whose peak fits in `budget_bytes`, or `None` if none fits. The
# check runs it on set-ups of its own, drawn afresh at every check (their
# order, tokens per step, times and peaks), with budgets chosen so that each
# classic mistake picks another one; the cell after the hints runs it on
# section 8's measurements.

# %%
# BEGIN SOLUTION
def fastest_that_fits(setups, budget_bytes):
    fitting = {name: tokens / timing.median for name, (timing, tokens, peak) in setups.items() if peak <= budget_bytes}
    return max(fitting, key=fitting.get) if fitting else None
# END SOLUTION
# BEGIN STARTER
# def fastest_that_fits(setups, budget_bytes):
#     ____
# END STARTER


ex.q2.check()

# %%
# ex.q2.hint()
# ex.q2.solution()

# %%
if "speed_and_memory" not in globals():
    print("This cell runs your fastest_that_fits on section 8's measurements, `speed_and_memory`: run section 8's "
          "first code cell (the one that times five set-ups), then this one.")
elif ex.q2.evaluate(globals()).outcome.name == "CORRECT":
    print({name: f"{peak / MIB:.1f} MiB" for name, (_, _, peak) in speed_and_memory.items()})
    for budget_mib in (32, 16, 8):
        choice = fastest_that_fits(speed_and_memory, budget_mib * MIB)
        print(f"within {budget_mib} MiB, the fastest set-up measured here: {choice or 'none fits'}")
else:
    print("Once exercise 2 is correct, this cell runs your fastest_that_fits on section 8's measurements.")
