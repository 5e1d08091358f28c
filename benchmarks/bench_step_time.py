"""Benchmark: the step-time model against real 2-process DDP, ZeRO-1/2/3 steps on this CPU, and against published runs.

Each launch measures what the model needs on this machine (the course
DistilBERT's forward and backward alone, its AdamW step alone, gloo's latency
and bandwidth on loopback, a large copy's rate, and the framework's own work:
a toy of the model's units and tensors laid out against the toy alone), then
times real DDP, ZeRO-1 and ZeRO-2/3 (FSDP2) steps; the
prediction from those measurements is printed beside the measured median and
range, launch by launch, so that the spread between launches shows too. On a
loaded machine the medians move; quote them with the load. Then the published
throughputs (torchtitan's reports) beside the model's predictions, derived from
the cards' sourced figures alone.

    .venv/bin/python -m benchmarks.bench_step_time [LAUNCHES] [BATCH]
"""

import sys

from course_utils import launcher, sharding, step_time_checks, threads


def main(launches: int = 3, batch_size: int = 32, steps: int = 7) -> dict:
    threads.use_course_threads()
    sharding.prepare(steps, batch_size)
    errors = {layout: [] for layout in step_time_checks.CPU_LAYOUTS}
    print(f"2 processes, batch {batch_size} ({batch_size // 2} per process), {steps} timed steps per layout")
    print("launch  layout  predicted ms (compute + optimizer + exposed comm + framework)  measured median ms (min-max)  error")
    for launch in range(launches):
        measured = launcher.launch(step_time_checks.measure_cpu_steps, (batch_size, steps), num_processes=2,
                                   quiet=True, timeout=600)
        slowest = step_time_checks.slowest_process(measured)
        device = step_time_checks.cpu_cluster(slowest).device
        print(f"{launch:>6}  the model's passes reached {device.fraction:.1%} of one core's theoretical fp32 peak "
              f"({device.peak / 1e9:,.1f} GFLOP/s); a 512 x 512 matmul {slowest['matmul_flops'] / device.peak:.1%}")
        for row in step_time_checks.compare_with_cpu_steps(slowest):
            predicted = row["predicted"]
            errors[row["layout"]].append(row["error"])
            print(f"{launch:>6}  {row['layout']:>6}  {predicted.step * 1e3:8.2f} ({predicted.compute * 1e3:.2f} + "
                  f"{predicted.optimizer * 1e3:.2f} + {predicted.exposed * 1e3:.2f} + {predicted.framework * 1e3:.2f})"
                  f"{'':10}{row['median'] * 1e3:8.2f} ({row['low'] * 1e3:.2f}-{row['high'] * 1e3:.2f})"
                  f"  {row['error']:+.0%}")
    for layout, values in errors.items():
        print(f"{layout}: error from {min(values):+.0%} to {max(values):+.0%} over {launches} launches")
    print()
    print(step_time_checks.describe_published(step_time_checks.compare_with_published()))
    return errors


if __name__ == "__main__":
    main(*(int(argument) for argument in sys.argv[1:]))
