"""Exercises of lesson 9: tensor, pipeline, context and expert parallelism, checked against launched runs.

- ``q1``: split a block's MLP column- then row-wise (``split_mlp``); launched on
  2 processes, each computes its share with the all-reduce, and the check
  compares the output and the gradients with the one-process MLP;
- ``q2``: predict a pipeline stage's activation peak under GPipe and 1F1B
  (``activation_peak``), checked against what each stage of a launched 4-stage
  run kept at most (``saved_activations.ActivationMeter``);
- ``q3``: lay out FSDP x TP on a 2 x 2 mesh (``fsdp_by_tp``);
- ``q4``-``q6``: context and expert parallelism (merge two softmaxes, the causal
  mask across ring steps, send each token to its expert's process), written in
  :mod:`course_utils.exercises.lesson9_cp_ep` and reached here, so that the
  lesson has one ``ex``.

Both checks launch processes, so they need what any launch needs: no
``Accelerator`` and no bitsandbytes in the notebook's own process.
"""

from __future__ import annotations

import copy
import functools
import math

import torch
import torch.nn.functional as F

from course_utils import meshes, parallel, pipeline, tensor_parallel
from course_utils.exercises.core import (
    CodeExercise, Incorrect, NotAttempted, as_number, contains_placeholder, describe_value,
)
from course_utils.exercises.lesson7 import LaunchedExercise

Q1_PROCESSES = 2
Q2_STAGES = 4
Q2_MICROBATCHES = (2, 6)  # fewer and more micro-batches than stages: each classic mistake fails on one of them
TOLERANCE = 1e-5

__all__ = ["q1", "q2", "q3", "q4", "q5", "q6"]


# --------------------------------------------------------------------------- q1


def _split_in_worker(split_mlp) -> dict:
    """What each worker of exercise 1 runs: the learner's shares of the MLP, computed with the all-reduce."""
    import torch.distributed as dist

    from course_utils.sharding import gloo_group

    with gloo_group():
        rank, world = dist.get_rank(), dist.get_world_size()
        mlp = tensor_parallel.tiny_block(seed=0).mlp
        torch.manual_seed(1)
        x, target = torch.randn(4, 8, mlp.up.in_features), torch.randn(4, 8, mlp.down.out_features)
        reference_x = x.clone().requires_grad_(True)
        reference = copy.deepcopy(mlp)
        reference_out = reference(reference_x)
        (reference_out * target).sum().backward()
        shares = split_mlp(copy.deepcopy(mlp), rank, world)
        if contains_placeholder(shares):
            return {"returned": None, "placeholder": True}
        if not isinstance(shares, (tuple, list)) or len(shares) != 3 or not all(
                isinstance(t, torch.Tensor) for t in shares):
            return {"returned": describe_value(shares)}
        shapes = [tuple(t.shape) for t in shares]
        facts = {"returned": None, "shapes": shapes, "checksum": [float(t.detach().double().sum()) for t in shares],
                 "full": {"up": tuple(mlp.up.weight.shape), "down": tuple(mlp.down.weight.shape)}}
        rows = mlp.up.out_features // world
        if shapes != [(rows, mlp.up.in_features), (rows,), (mlp.down.out_features, rows)]:
            return facts
        up_w, up_b, down_w = (t.detach().clone().float().requires_grad_(True) for t in shares)
        x = x.requires_grad_(True)
        hidden = F.gelu(F.linear(tensor_parallel.copy_to_tensor_parallel(x), up_w, up_b))
        out = tensor_parallel.reduce_from_tensor_parallel(F.linear(hidden, down_w)) + mlp.down.bias.detach()
        (out * target).sum().backward()
        mine = slice(rank * rows, (rank + 1) * rows)
        expected = [reference.up.weight.grad[mine], reference.up.bias.grad[mine], reference.down.weight.grad[:, mine]]
        facts["forward_gap"] = float((out - reference_out).detach().abs().max())
        facts["gradient_gap"] = max([float((g.grad - e).abs().max()) for g, e in zip((up_w, up_b, down_w), expected)]
                                    + [float((x.grad - reference_x.grad).abs().max())])
        return facts


class SplitMLP(LaunchedExercise):
    title = "Exercise 1"
    variables = ["split_mlp"]
    launch_cause = "Does `split_mlp` return on every process?"
    hints = [
        "`up` is split by its output features and `down` by its input features, the same hidden units in both: "
        "process `rank` takes hidden units `rank * n` to `(rank + 1) * n`, with `n = mlp.up.out_features // world_size`.",
        "A `Linear`'s weight is (out, in): `up`'s output features are the rows of `mlp.up.weight` (with the same "
        "entries of `mlp.up.bias`), `down`'s input features the columns of `mlp.down.weight`.",
        "```python\nn = mlp.up.out_features // world_size\nmine = slice(rank * n, (rank + 1) * n)\n"
        "return mlp.up.weight[mine], mlp.up.bias[mine], mlp.down.weight[:, mine]\n```",
    ]
    solution_code = """
        def split_mlp(mlp, rank, world_size):
            n = mlp.up.out_features // world_size
            mine = slice(rank * n, (rank + 1) * n)
            return mlp.up.weight[mine], mlp.up.bias[mine], mlp.down.weight[:, mine]
    """
    correct_message = (
        "Each process computed half of the hidden units from the whole input; one all-reduce summed the two partial "
        "outputs into the MLP's output, and each process's gradients are its half of one process's."
    )

    def check_answer(self, split_mlp):
        if not callable(split_mlp):
            raise Incorrect(f"`split_mlp` should be a function `split_mlp(mlp, rank, world_size)`, but it is "
                            f"{describe_value(split_mlp)}.")
        processes = self.launch_for_check(_split_in_worker, (split_mlp,), num_processes=Q1_PROCESSES)
        first = processes[0]
        if first.get("placeholder"):
            raise NotAttempted("`split_mlp` returns the placeholder `____`: replace it with your code.")
        if first["returned"] is not None:
            raise Incorrect(f"`split_mlp` returned {first['returned']}: return three tensors, "
                            "`(up_weight, up_bias, down_weight)`, this process's share.")
        reason = self._diagnose_shapes(first["shapes"], first["full"])
        if reason:
            raise Incorrect(reason)
        if processes[0]["checksum"] == processes[1]["checksum"]:
            raise Incorrect("Both processes returned the same share: use `rank` to pick each process's own hidden "
                            "units, so that together they cover all of them.")
        gaps = [p["forward_gap"] for p in processes] + [p["gradient_gap"] for p in processes]
        if not all(math.isfinite(gap) for gap in gaps):
            raise Incorrect("The output or the gradients are not finite numbers (NaN or inf): did `split_mlp` change "
                            "the values it returned?")
        if not max(p["forward_gap"] for p in processes) <= TOLERANCE:
            raise Incorrect(
                "The shapes are right, but the summed output differs from the MLP's: each process's rows of "
                "`up.weight` and columns of `down.weight` must be the *same* hidden units (the same slice), and "
                "`up.bias` must follow `up`'s rows."
            )
        if not max(p["gradient_gap"] for p in processes) <= TOLERANCE:
            raise Incorrect("The output is right but the gradients differ from one process's: return the "
                            "parameters' values unchanged.")
        return None

    @staticmethod
    def _diagnose_shapes(shapes, full) -> str | None:
        (up_out, up_in), (down_out, down_in) = full["up"], full["down"]
        n = up_out // Q1_PROCESSES
        up_w, up_b, down_w = shapes
        if up_w == (up_out, up_in):
            return ("`up_weight` is the whole of `up.weight`: each process should hold its share of the hidden "
                    "units only (a slice of the rows).")
        if up_w == (up_out, up_in // Q1_PROCESSES):
            return ("`up_weight` takes columns of `up.weight`, its input features. A column split of `Y = X A` "
                    "takes `A`'s columns, which PyTorch stores (out, in) as the **rows** of `up.weight` (dim 0).")
        if up_w != (n, up_in):
            return f"`up_weight` has the shape {up_w}, which is no share of `up.weight` {full['up']} by output features."
        if up_b != (n,):
            return ("`up_bias` should be the entries of `up.bias` that belong to your rows of `up.weight` (one per "
                    f"hidden unit you keep), but its shape is {up_b}.")
        if down_w == (down_out // Q1_PROCESSES, down_in):
            return ("`down_weight` takes rows of `down.weight`, its output features. The row split of `B` takes "
                    "`down`'s input features, the **columns** of `down.weight` (dim 1), the hidden units of your `up`.")
        if down_w == (down_out, down_in):
            return ("`down_weight` is the whole of `down.weight`: keep only the columns of your own hidden units; the "
                    "all-reduce sums the processes' partial outputs.")
        if down_w != (down_out, n):
            return f"`down_weight` has the shape {down_w}, which is no share of `down.weight` {full['down']} by columns."
        return None


# --------------------------------------------------------------------------- q2


@functools.cache
def _pipeline_run() -> tuple:
    """Return every stage's PipelineRun of a 4-stage run of both schedules (launched once, then kept)."""
    configs = [(name, m) for name in pipeline.SCHEDULES for m in Q2_MICROBATCHES]
    stages = parallel.launch(pipeline.run_pipeline, (configs, 1, 8, 16, 8), num_processes=Q2_STAGES, quiet=True,
                             oversubscribe=True, timeout=120)
    return tuple(run for runs in stages for run in runs)


class ActivationPeak(CodeExercise):
    title = "Exercise 2"
    variables = ["activation_peak"]
    time_limit_s = 120.0  # the first check launches the 4-stage run it compares with
    hints = [
        "Count the micro-batches whose forward pass a stage has run and whose backward pass it has not yet run: each "
        "keeps `microbatch_bytes` of activations until then. Walk through `pipeline.SCHEDULES[schedule](stage, "
        "num_stages, num_microbatches)`, or think it through.",
        "GPipe runs every forward before any backward. 1F1B's stage `stage` runs `num_stages - stage - 1` forwards, "
        "then one more before its first backward, and never has more in flight after that; but a stage cannot keep "
        "more micro-batches than there are.",
        "```python\nif schedule == \"GPipe\":\n    return num_microbatches * microbatch_bytes\n"
        "return min(num_stages - stage, num_microbatches) * microbatch_bytes\n```",
    ]
    solution_code = """
        def activation_peak(schedule, stage, num_stages, num_microbatches, microbatch_bytes):
            if schedule == "GPipe":
                return num_microbatches * microbatch_bytes
            return min(num_stages - stage, num_microbatches) * microbatch_bytes
    """
    correct_message = (
        "GPipe keeps every micro-batch on every stage until the backward passes start; 1F1B keeps at most "
        "`num_stages - stage`, so its first stage holds the most, and more micro-batches cost it no memory."
    )

    def cases(self):
        try:
            runs = _pipeline_run()
        except (parallel.LaunchError, parallel.WorkerError, parallel.WorkerTimeout) as error:
            raise Incorrect(f"The check could not launch the pipeline run it compares with: {error}") from None
        # More micro-batches than stages first: a mistake that shows only with fewer is named only then.
        runs = sorted(runs, key=lambda run: (run.schedule != "GPipe", -run.num_microbatches, run.stage))
        return [(run.schedule, run.stage, run.num_stages, run.num_microbatches, run.microbatch_activations)
                for run in runs]

    def reference(self, schedule, stage, num_stages, num_microbatches, microbatch_bytes):
        """The peak the launched stage measured (not a formula)."""
        return next(run.activation_peak for run in _pipeline_run() if (run.schedule, run.stage, run.num_microbatches)
                    == (schedule, stage, num_microbatches))

    def describe_case(self, args):
        schedule, stage, num_stages, m, micro = args
        return f"For {schedule}, stage {stage} of {num_stages}, {m} micro-batches of {micro:,} bytes"

    def diagnose(self, got, expected, args):
        schedule, stage, num_stages, m, micro = args
        number = as_number(got)
        where = self.describe_case(args)
        if number is None:
            return f"{where}, `activation_peak` returned {describe_value(got)}: return one number of bytes."
        value = number[0]
        if not math.isfinite(value):
            return f"{where}, `activation_peak` returned {value}, which is no number of bytes."
        if value == expected // micro:
            return f"{where}, you returned a number of micro-batches: multiply it by `microbatch_bytes`."
        if schedule == "GPipe" and value in (num_stages * micro, min(num_stages - stage, m) * micro):
            return (f"{where}: GPipe runs every forward pass before the first backward pass, so every micro-batch's "
                    "activations are alive at once on every stage.")
        if schedule == "1F1B" and value == m * micro:
            return f"{where}: that is GPipe's peak; 1F1B starts backward passes before all the forwards have run."
        if schedule == "1F1B" and value == (num_stages - stage) * micro and num_stages - stage > m:
            return f"{where}: a stage cannot keep more micro-batches than the batch has."
        if schedule == "1F1B" and value == num_stages * micro:
            return (f"{where}: a later stage starts its backward passes sooner (it has fewer stages after it), so it "
                    "keeps fewer micro-batches: the count depends on `stage`.")
        if schedule == "1F1B" and value == (num_stages - stage - 1) * micro:
            return (f"{where}: after its warm-up forwards, the stage runs one more forward before its first backward "
                    "pass, so one more micro-batch is alive then.")
        return None


q1 = SplitMLP()
q2 = ActivationPeak()


# --------------------------------------------------------------------------- q3


def _layout_in_worker(layout):
    """What each worker of exercise 3 runs: one step of two blocks laid out by the learner's ``layout``."""
    return meshes.run_mesh(["FSDP x TP"], apply=layout)["FSDP x TP"]


def _planned_fsdp_by_tp_weights() -> int:
    """Bytes of weights one process holds under FSDP x TP on 2 x 2: split matrices over 4, the rest over 2."""
    whole = {"norm1.weight", "norm1.bias", "norm2.weight", "norm2.bias", "attn.out.bias", "mlp.down.bias"}
    return sum(4 * p.numel() // (2 if name.split(".", 1)[1] in whole else 4)
               for name, p in meshes.two_blocks().named_parameters())


class MeshLayout(LaunchedExercise):
    title = "Exercise 3"
    variables = ["fsdp_by_tp"]
    launch_cause = "Does every process apply the same calls, on the same dimensions of the mesh?"
    hints = [
        "Two calls per block: `parallelize_module(block, mesh[...], tensor_parallel.block_plan())` splits it inside "
        "a row, then `fully_shard(block, mesh=mesh[...])` shards what each process holds across the rows.",
        "Tensor parallelism's all-reduces follow every layer: they belong on the `\"tp\"` dimension (inside a node). "
        "FSDP's all-gathers and reduce-scatters go on `\"dp\"`.",
        "```python\nfor block in model:\n    parallelize_module(block, mesh[\"tp\"], tensor_parallel.block_plan())\n"
        "    fully_shard(block, mesh=mesh[\"dp\"])\nfully_shard(model, mesh=mesh[\"dp\"])\n```",
    ]
    solution_code = """
        def fsdp_by_tp(model, mesh):
            for block in model:
                parallelize_module(block, mesh["tp"], tensor_parallel.block_plan())
                fully_shard(block, mesh=mesh["dp"])
            fully_shard(model, mesh=mesh["dp"])
            return model
    """
    correct_message = (
        "Each process holds a quarter of every split matrix; the all-reduces ran on `tp` only, FSDP's collectives on "
        "`dp` only, and the step equals one process's."
    )

    def check_answer(self, fsdp_by_tp):
        if not callable(fsdp_by_tp):
            raise Incorrect(f"`fsdp_by_tp` should be a function `fsdp_by_tp(model, mesh)`, but it is "
                            f"{describe_value(fsdp_by_tp)}.")
        processes = self.launch_for_check(_layout_in_worker, (fsdp_by_tp,), num_processes=4)
        run = processes[0]
        traffic = run.traffic
        kinds = {kind for dimension in traffic.values() for kind in dimension}
        if "all_reduce" not in kinds:
            raise Incorrect("No all-reduce ran: the blocks were not split by tensor parallelism. Call "
                            "`parallelize_module` on each block with `tensor_parallel.block_plan()`.")
        if "all_gather" not in kinds:
            raise Incorrect("No all-gather ran: nothing was sharded by FSDP. Call `fully_shard` on each block.")
        if "all_reduce" in traffic.get("dp", {}) or "all_gather" in traffic.get("tp", {}):
            raise Incorrect("The dimensions are swapped: tensor parallelism's all-reduces ran on `dp` (or FSDP's "
                            "all-gathers on `tp`). Split with `mesh[\"tp\"]`, shard with `mesh[\"dp\"]`.")
        unknown = set(traffic) - {"dp", "tp"}
        if unknown:
            raise Incorrect(f"Some collectives ran on another group ({', '.join(sorted(unknown))}), not along one "
                            "dimension of the mesh: pass `mesh[\"tp\"]` and `mesh[\"dp\"]`, not the whole mesh.")
        gaps = [p.forward_gap for p in processes] + [p.gradient_gap for p in processes]
        if not all(math.isfinite(gap) and gap <= TOLERANCE for gap in gaps):
            raise Incorrect("The collectives ran where they should, but the step differs from one process's: did "
                            "`fsdp_by_tp` change the model?")
        if run.held["weights"] != _planned_fsdp_by_tp_weights():
            raise Incorrect(f"Each process holds {run.held['weights']:,} bytes of weights, not its share of every "
                            "block: every block needs both calls.")
        return None


q3 = MeshLayout()

# Exercises 4-6, one module of their own (context and expert parallelism), under the lesson's one `ex`.
from course_utils.exercises.lesson9_cp_ep import q1 as q4, q2 as q5, q3 as q6  # noqa: E402
