"""Benchmark: torch.compile (Inductor) on a 2-block transformers Llama's training step, cold, against eager (lesson 8).

Lesson 8, section 14, captures this model's forward with Dynamo only: Inductor's
C++ code generation for its forward and backward takes much longer than the
lesson's time budget on a laptop CPU. This script measures it: the first
compiled step with Inductor's graph cache off (a cold compile, what a learner's
first run pays, and every new shape pays again), then eager and compiled steps
timed in turns, and the number of steps after which the compile is paid back.
One torch thread, as in the lessons; Inductor compiles in this process.

    .venv/bin/python -m benchmarks.bench_llama_compile
"""

import time

import torch
import torch._inductor.config
from transformers import LlamaConfig, LlamaForCausalLM

from course_utils import compiling, speed, threads

VOCAB, SEQ_LEN, BATCH = 32_000, 128, 2


def llama(seed=0):
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=SEQ_LEN, use_cache=False)
    return LlamaForCausalLM(config).train()


def main():
    threads.use_course_threads()
    if compiling.cpp_compiler() is None:
        print("No C++ compiler found: Inductor cannot build code here.")
        return
    torch._inductor.config.compile_threads = 1  # a 2-core laptop: one process is as fast
    torch._inductor.config.fx_graph_cache = False  # a cold compile, whatever earlier runs cached
    ids = torch.randint(0, VOCAB, (BATCH, SEQ_LEN), generator=torch.Generator().manual_seed(0))
    batch = {"input_ids": ids, "labels": ids}

    def step(model):
        model(**batch).loss.backward()

    eager = llama()
    compiled = torch.compile(llama())
    start = time.perf_counter()
    step(compiled)
    compile_seconds = time.perf_counter() - start
    timings = speed.time_interleaved({"eager": lambda: step(eager), "compiled": lambda: step(compiled)}, repeats=9)
    print(f"first compiled step (Dynamo capture + Inductor compile, cache off): {compile_seconds:.1f} s")
    for name, timing in timings.items():
        print(f"{name:>9} step: {timing.describe()}")
    verdict = speed.compare("compiled", timings["compiled"], "eager", timings["eager"])
    print(verdict.sentence())
    saved = timings["eager"].median - timings["compiled"].median
    if verdict.faster == "compiled" and verdict.measurable and saved > 0:
        print(f"the compile is paid back after {compile_seconds / saved:,.0f} steps (median saving {saved * 1e3:.2f} ms)")
    else:
        print("no measurable saving per step here, so the compile is not paid back on this machine")


if __name__ == "__main__":
    main()
