"""End-to-end forward time of mid-size models, kernelized with MatmulLinear vs torch.

Builds a Llama-style model from a config (hidden 4096, intermediate 11008,
32 heads, vocab 32000, a few layers; random weights, nothing downloaded) and,
unless --no-unet, a Stable-Diffusion-sized UNet2DConditionModel, in bf16 on
the GPU. Each model's forward is timed with CUDA events (warm-up first, the
median of --iters) with torch's nn.Linear, then again after kernelize has
mapped every nn.Linear to MatmulLinear (the same weights); the outputs are
compared (normwise relative error) and our op's calls are counted, so a fast
wrong or bypassed kernel shows.

    python scripts/integration_timing.py --out benchmarks/results/<date>-integration.md [--layers 4] [--batch 4] [--seq 512]

Prints a Markdown table (model, config, tokens, ms kernelized, ms torch, ratio)
with the GPU, torch/CUDA versions and commit, and writes it to --out.
Needs a GPU and the build in build/ (carry it to the device).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from harness.kernel import REPO_ROOT, load_kernel
from harness.provenance import environment, environment_lines
from harness.timing import warm_up_gpu
from profile_workload import print_kernel_times

sys.path.insert(0, str(REPO_ROOT / "examples"))  # the examples are scripts, not a package
import diffusers_unet as unet_example  # noqa: E402
import transformers_llama as llama_example  # noqa: E402
from kernelize_linear import DEFAULT_BUILD, compare_kernelized  # noqa: E402


def time_llama(args, build_dir: Path) -> dict:
    config = llama_example.llama_config(
        hidden_size=4096, intermediate_size=11008, num_hidden_layers=args.layers, num_attention_heads=32,
        num_key_value_heads=32, vocab_size=32000, max_position_embeddings=max(2048, args.seq))
    model = llama_example.build_llama(config, dtype=torch.bfloat16)
    ids = llama_example.random_input_ids(config, args.batch, args.seq)
    result = compare_kernelized(model, lambda m: llama_example.logits(m, ids), build_dir=build_dir,
                                time_iters=args.iters)
    params = sum(p.numel() for p in model.parameters())
    del model
    torch.cuda.empty_cache()
    return {
        "model": "LlamaForCausalLM",
        "config": f"{llama_example.describe(config)}; {params / 1e9:.2f}B params",
        "inputs": f"{args.batch} x {args.seq} tokens",
        "tokens": args.batch * args.seq,
        "result": result,
        "tolerance": llama_example.LOGITS_TOLERANCE[torch.bfloat16],
    }


def time_unet(args, build_dir: Path) -> dict:
    config = unet_example.unet_config(block_out_channels=(320, 640, 1280, 1280), layers_per_block=2,
                                      cross_attention_dim=768, attention_head_dim=8, sample_size=64,
                                      norm_num_groups=32)
    model = unet_example.build_unet(config, dtype=torch.bfloat16)
    inputs = unet_example.unet_inputs(config, batch=args.unet_batch, size=64, text_tokens=77, dtype=torch.bfloat16)

    def forward(m):
        return unet_example.predict(m, inputs)

    def kernel_times(label: str) -> None:  # --kernel-times: where a forward's GPU time goes
        if args.kernel_times:
            with torch.no_grad():
                print_kernel_times(f"UNet, {label}", lambda: forward(model), "forward", 3, top=args.kernel_times)

    kernel_times("torch")
    result = compare_kernelized(model, forward, build_dir=build_dir, time_iters=args.iters)
    kernel_times("kernelized")
    params = sum(p.numel() for p in model.parameters())
    del model
    torch.cuda.empty_cache()
    return {
        "model": "UNet2DConditionModel",
        "config": f"{unet_example.describe(config)}; {params / 1e9:.2f}B params",
        "inputs": f"{args.unet_batch} x 4x64x64 latents, 77 text tokens",
        "tokens": args.unet_batch * 64 * 64,  # latent positions at the first level
        "result": result,
        "tolerance": unet_example.OUTPUT_TOLERANCE[torch.bfloat16],
    }


def markdown(rows: list[dict], env: dict, args) -> str:
    lines = [
        "# End-to-end forward time: nn.Linear kernelized to MatmulLinear vs torch",
        "",
        *environment_lines(env),
        f"- Timing: CUDA events, 3 warm-up forwards then the median of {args.iters}; bf16, eager, under no_grad",
        "- torch / kernelized: above 1 the kernelized model is faster; rel. error: normwise, kernelized "
        "output against torch's (same weights, same dtype); tokens: the UNet's are latent positions",
        "",
        "| model | config | inputs | tokens | ms kernelized | ms torch | torch / kernelized | rel. error "
        "| Linear calls (our op) |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        r = row["result"]
        lines.append(
            f"| {row['model']} | {row['config']} | {row['inputs']} | {row['tokens']} | {r.ms_kernelized:.2f} | "
            f"{r.ms_torch:.2f} | {r.ms_torch / r.ms_kernelized:.2f}x | {r.rel_error:.2e} | "
            f"{r.linear_calls} ({r.op_calls}) |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="write the Markdown table to this file too")
    parser.add_argument("--build", type=Path, default=DEFAULT_BUILD, help="the build folder (default: %(default)s)")
    parser.add_argument("--layers", type=int, default=4, help="Llama decoder layers (default: %(default)s)")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--unet-batch", type=int, default=2)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--no-unet", action="store_true", help="time the Llama model only")
    parser.add_argument("--kernel-times", type=int, default=0, metavar="N",
                        help="also print the N kernels with the most GPU time in a UNet forward, torch and kernelized")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")

    pm, how = load_kernel(args.build.resolve().parent)
    env = environment(pm, how)
    warm_up_gpu()
    rows = [time_llama(args, args.build)]
    if not args.no_unet:
        rows.append(time_unet(args, args.build))
    text = markdown(rows, env, args)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    failed = [f"{row['model']}: our op ran {row['result'].op_calls} times for {row['result'].linear_calls} Linear calls"
              for row in rows if row["result"].op_calls != row["result"].linear_calls]
    failed += [f"{row['model']}: error {row['result'].rel_error:.2e} above {row['tolerance']:.0e}"
               for row in rows if not row["result"].rel_error <= row["tolerance"]]
    for line in failed:
        print("FAILED:", line)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
