"""Kernelized Linear layers under tensor parallelism: a Llama-3-8B-shaped model on 2 GPUs.

Started by torchrun, one process a GPU, NVLink multicast off:

    NCCL_NVLS_ENABLE=0 NCCL_CUMEM_ENABLE=0 torchrun --standalone --nproc-per-node 2 scripts/tp_benchmark.py \\
        [--layers 4] [--iters 20] [--out DIR] [--tag T]
    torchrun --nproc-per-node 2 scripts/tp_benchmark.py --device cpu   # gloo smoke run: tiny model, no timing

Every rank builds the model of scripts/model_benchmark.py from its config (hidden 4096,
intermediate 14336, 32 heads, 8 KV heads, vocab 128256, --layers layers, random weights,
rank 0's broadcast to all, nothing downloaded), bf16, and

1. runs it whole on its own GPU with torch's nn.Linear: the single-GPU reference
   (logits and times);
2. shards it with transformers' tensor-parallel plan (``tp_plan="auto"``: q/k/v, gate
   and up column-parallel, o and down row-parallel with an all-reduce, lm_head
   column-parallel with its output gathered; ``harness.tensor_parallel.apply_tp_plan``)
   and runs it with torch's nn.Linear on each rank's shards;
3. kernelizes every Linear with ``kernelize_linears`` on each rank (the plan's forward
   kept around MatmulLinear's) and runs it again: our kernels on the local shards
   (per rank at 2 GPUs: q 2048x4096, k/v 512x4096, o 4096x2048, gate/up 7168x4096,
   down 4096x7168, lm_head 64128x4096).

The cases are model_benchmark's: prefill 1x2048 and 4x2048, a decode step with a
static KV cache (512 tokens of prompt) at batch 1 and 32, eager and as a captured CUDA
graph (the NCCL all-reduces inside it), CUDA events, median of --iters. Per rank: ms
of each, the ratio torch / kernelized, the logits' normwise relative error against
the single-GPU torch logits, and the linear_fwd op calls of one kernelized forward
against its Linear calls (equal: our kernels ran on that rank's every Linear). Rank 0
prints the table and writes ``<date>-<tag>.md`` and ``.json`` (tag tp-benchmark) to
--out (default benchmarks/results): GPU, clocks, versions, commit and command first.
Exits 1 if a check failed: an error above the tolerance, or op calls short of the
Linear calls. A case that raises (a graph capture, say) is reported, not fatal.

``--device cpu`` runs the same steps on gloo with a small config whose local shapes
are not multiples of anything (vocabulary 301 splits 151 / 150), fp32, eager only and
untimed: the layer falls back to torch there, so the kernelized logits must equal the
tensor-parallel torch logits exactly. It checks the plan, the mapping and the script
on a machine without a GPU.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch

from harness.kernel import REPO_ROOT as ROOT, load_kernel
from harness.provenance import command_line, environment, environment_lines, gpu_clocks
from harness.results import RESULTS_DIR, result_path
from harness.tensor_parallel import apply_tp_plan, broadcast_parameters, init_distributed, launch_problem
from model_benchmark import llama3_8b_config, model_cases, normwise, time_case

sys.path.insert(0, str(ROOT / "examples"))  # kernelize_linear: the examples are scripts, not a package

TOLERANCE = {"cuda": 5e-2, "cpu": 1e-5}
"""Normwise relative error of the tensor-parallel logits against the single-GPU ones:
bf16 row-parallel partial sums reduced in another order (model_benchmark sees 1e-2 between
two single-GPU bf16 runs); fp32 on the CPU."""

PHASES = ("single", "torch", "kernelized")
"""single: the whole model on one GPU, torch's Linear; torch: the sharded model, torch's
Linear; kernelized: the sharded model, MatmulLinear."""


def small_config():
    """A Llama config for the CPU run whose shards are not multiples of anything: 2 layers,
    hidden 96, intermediate 202, 6 heads of 16, 2 KV heads, vocabulary 301."""
    from transformers import LlamaConfig

    return LlamaConfig(hidden_size=96, intermediate_size=202, num_hidden_layers=2, num_attention_heads=6,
                       num_key_value_heads=2, vocab_size=301, max_position_embeddings=256)


def cases_for(model, config, device: torch.device):
    """model_benchmark's cases, sized down on the CPU."""
    if device.type == "cpu":
        return model_cases(model, config, prompt=24, device="cpu", prefills=((1, 20), (3, 17)), decode_batches=(1, 5))
    return model_cases(model, config, device="cuda")


def rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_initialized() else 0


def run_cases(cases, *, label: str, timed: bool, iters: int, reference: dict, rows: dict) -> dict:
    """Run each case eager (and as a CUDA graph when ``timed``), recording ms and the
    logits' error against ``reference`` (filled instead, from the eager logits, while
    empty) in ``rows``. Returns the eager logits when untimed (the CPU run compares
    them exactly), else nothing."""
    fill = not reference
    kept = {}
    for name, _, forward, prefill in cases:
        for graphs in ((False, True) if timed else (False,)):
            key = f"{label}_{'graph' if graphs else 'eager'}"
            try:
                with torch.no_grad():
                    if timed:
                        logits, rows[name][f"{key}_ms"] = time_case(forward, prefill, graphs, iters)
                    else:
                        if prefill is not None:
                            prefill()
                        logits = forward().clone()
            except Exception as exc:  # noqa: BLE001 - a failed case is a result to report
                rows[name][f"{key}_error"] = f"{type(exc).__name__}: {exc}"[:300]
                print(f"rank {rank()}: {name} {key} FAILED: {rows[name][f'{key}_error']}", flush=True)
                continue
            if fill and not graphs:
                reference[name] = logits
            elif name in reference:
                rows[name][f"{key}_rel_error"] = normwise(logits, reference[name])
            if not timed:
                kept[name] = logits
            del logits
    return kept


def kernel_calls(model, build: Path, forward) -> dict:
    """linear_fwd op calls and Linear forward calls of one eager ``forward()``."""
    from kernelize_linear import count_module_calls, count_op_calls, linear_op_name, load_kernel as load_build

    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    op_name = linear_op_name(load_build(build))
    with torch.no_grad(), count_module_calls(linears) as calls, count_op_calls(op_name) as ops:
        forward()
    return {"linear_calls": calls[0], "op_calls": ops.calls}


def rank_report(args, device: torch.device) -> dict:
    """Build, shard, kernelize and measure on this rank; the rank's rows and checks."""
    from kernelize_linear import kernelize_linears, linear_repository
    from kernels import Mode
    from transformers import LlamaForCausalLM

    on_gpu = device.type == "cuda"
    config = llama3_8b_config(args.layers) if on_gpu else small_config()
    dtype = torch.bfloat16 if on_gpu else torch.float32
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(config).to(dtype).eval()
    broadcast_parameters(model)

    reference: dict = {}
    cases = cases_for(model, config, device)
    rows = {name: {"case": name, "tokens": tokens} for name, tokens, _, _ in cases}
    run_cases(cases, label="single", timed=on_gpu, iters=args.iters, reference=reference, rows=rows)
    del cases
    if on_gpu:
        torch.cuda.empty_cache()

    apply_tp_plan(model)
    shards = {name: tuple(m.weight.to_local().shape) for name, m in model.named_modules()
              if isinstance(m, torch.nn.Linear) and (name.startswith("model.layers.0.") or name == "lm_head")}
    # Fresh cases: the static KV caches take their shapes from the first keys they see,
    # which are this rank's heads now.
    cases = cases_for(model, config, device)
    torch_logits = run_cases(cases, label="torch", timed=on_gpu, iters=args.iters, reference=reference, rows=rows)

    kernelized = kernelize_linears(model, mode=Mode.INFERENCE, device=device.type,
                                   repository=linear_repository(args.build))
    calls = kernel_calls(model, args.build, cases[0][2])  # the first case: a prefill, no KV cache
    ours = run_cases(cases, label="kernelized", timed=on_gpu, iters=args.iters, reference=reference, rows=rows)
    for name, logits in ours.items():  # untimed runs only: torch's linear on both sides
        rows[name]["kernelized_equals_torch"] = bool(torch.equal(logits, torch_logits[name]))
    for row in rows.values():
        for mode in ("eager", "graph"):
            if f"torch_{mode}_ms" in row and f"kernelized_{mode}_ms" in row:
                row[f"{mode}_ratio"] = row[f"torch_{mode}_ms"] / row[f"kernelized_{mode}_ms"]
    return {"rank": rank(), "device": str(device), "kernelized_modules": len(kernelized), "shards": shards,
            **calls, "rows": list(rows.values())}


def checks(reports: list[dict], device_type: str) -> list[str]:
    """The failed checks, as sentences (empty: all passed)."""
    tolerance = TOLERANCE[device_type]
    failed = []
    for rep in reports:
        r = rep["rank"]
        expected_ops = rep["linear_calls"] if device_type == "cuda" else 0
        if rep["linear_calls"] == 0 or rep["op_calls"] != expected_ops:
            failed.append(f"rank {r}: {rep['op_calls']} linear_fwd calls for {rep['linear_calls']} Linear calls "
                          f"(expected {expected_ops})")
        for row in rep["rows"]:
            for key, value in row.items():
                if key.endswith("_rel_error") and not value <= tolerance:
                    failed.append(f"rank {r}, {row['case']}: {key} {value:.2e} above {tolerance:.0e}")
                if key.endswith("_error") and isinstance(value, str):
                    failed.append(f"rank {r}, {row['case']}: {key.removesuffix('_error')} raised {value}")
            if row.get("kernelized_equals_torch") is False:
                failed.append(f"rank {r}, {row['case']}: kernelized logits differ from torch's (CPU fallback)")
    return failed


def markdown(reports: list[dict], env: dict, args, failed: list[str]) -> str:
    world = len(reports)
    lines = [f"# Tensor parallelism over {world} ranks: MatmulLinear against torch's Linear", "",
             *environment_lines(env), "",
             f"Llama-3-8B-shaped model ({args.layers} layers, random weights), bf16, transformers' tp_plan=\"auto\" "
             "(harness.tensor_parallel.apply_tp_plan), every Linear kernelized with kernelize_linears on each rank. "
             f"CUDA events, median of {args.iters} forwards (eager) or graph replays, per rank; ratio: torch ms / "
             "kernelized ms on the same rank; rel. error: normwise, logits against the single-GPU torch model's "
             f"eager logits (tolerance {TOLERANCE['cuda']:.0e}).", "",
             "Local weight shapes (out x in) on rank 0: "
             + ", ".join(f"{name} {'x'.join(map(str, shape))}" for name, shape in reports[0]["shards"].items()) + ".",
             "", "| case | rank | single GPU eager / graph ms | TP torch eager / graph ms "
             "| TP kernelized eager / graph ms | eager ratio | graph ratio "
             "| rel. error TP torch eager / graph | rel. error TP kernelized eager / graph |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]

    def cell(row, key, fmt):
        if key in row:
            return fmt.format(row[key])
        return "failed" if key.rsplit("_", 1)[0] + "_error" in row else "n/a"

    for index in range(len(reports[0]["rows"])):
        for rep in reports:
            row = rep["rows"][index]
            pair = [" / ".join(cell(row, f"{phase}_{mode}_ms", "{:.3f}") for mode in ("eager", "graph"))
                    for phase in PHASES]
            errors = [" / ".join(cell(row, f"{phase}_{mode}_rel_error", "{:.1e}") for mode in ("eager", "graph"))
                      for phase in PHASES[1:]]
            lines.append(f"| {row['case']} | {rep['rank']} | {pair[0]} | {pair[1]} | {pair[2]} | "
                         f"{cell(row, 'eager_ratio', '{:.2f}')} | {cell(row, 'graph_ratio', '{:.2f}')} | "
                         f"{errors[0]} | {errors[1]} |")
    lines += ["", "linear_fwd op calls in one kernelized forward (prefill), per rank: "
              + "; ".join(f"rank {rep['rank']}: {rep['op_calls']} for {rep['linear_calls']} Linear calls"
                          for rep in reports) + ".", ""]
    lines += [f"- FAILED: {line}" for line in failed] or ["All checks passed."]
    return "\n".join(lines) + "\n"


def cpu_summary(reports: list[dict], failed: list[str]) -> str:
    lines = [f"tensor-parallel smoke run on gloo, {len(reports)} ranks, fp32 (no timing)"]
    for rep in reports:
        errors = ", ".join(f"{row['case']}: torch {row.get('torch_eager_rel_error', math.nan):.1e} / kernelized "
                           f"{row.get('kernelized_eager_rel_error', math.nan):.1e}"
                           f"{'' if row.get('kernelized_equals_torch') else ' (kernelized differs from torch)'}"
                           for row in rep["rows"])
        lines.append(f"rank {rep['rank']}: {rep['kernelized_modules']} Linear modules kernelized, shards "
                     f"{rep['shards']}; rel. error against the single-process model: {errors}")
    lines += [f"FAILED: {line}" for line in failed] or ["OK"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cuda: NCCL, one GPU a rank (default); cpu: the gloo smoke run")
    parser.add_argument("--layers", type=int, default=4, help="decoder layers of the model (default: %(default)s)")
    parser.add_argument("--iters", type=int, default=20, help="timed forwards per case (default: %(default)s)")
    parser.add_argument("--build", type=Path, default=ROOT / "build")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    parser.add_argument("--tag", default="tp-benchmark")
    args = parser.parse_args(argv)
    if args.layers < 1 or args.iters < 1:
        parser.error("--layers and --iters must be >= 1")
    problem = launch_problem(args.device)
    if problem:
        parser.error(problem)

    import torch.distributed as dist

    device = init_distributed(args.device)
    try:
        if device.type == "cuda":
            from harness.timing import warm_up_gpu

            warm_up_gpu()
        report = rank_report(args, device)
        reports: list = [None] * dist.get_world_size()
        dist.all_gather_object(reports, report)
    finally:
        dist.destroy_process_group()
    failed = checks(reports, device.type)
    if report["rank"] != 0:
        return 1 if failed else 0
    if device.type == "cpu":
        print(cpu_summary(reports, failed))
        return 1 if failed else 0

    pm, how = load_kernel(args.build.resolve().parent)
    env = environment(pm, how)
    env.update(command=command_line(), world_size=len(reports), clocks_at_end=gpu_clocks())
    text = markdown(reports, env, args, failed)
    args.out.mkdir(parents=True, exist_ok=True)
    md_path = result_path(args.out, args.tag, "md")
    md_path.write_text(text)
    md_path.with_suffix(".json").write_text(
        json.dumps({"environment": env, "tolerance": TOLERANCE["cuda"], "ranks": reports, "failed": failed},
                   indent=1, default=str) + "\n")
    print(text)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
