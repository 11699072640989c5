"""A diffusers UNet2DConditionModel whose nn.Linear layers run persistent_matmul's MatmulLinear.

Builds a small UNet2DConditionModel from a config dict (random weights,
nothing downloaded), runs one denoising step's forward, maps every nn.Linear
(attention q/k/v/out, GEGLU feed-forward, time embedding, the resnets'
time projections) to MatmulLinear from this repository's local build with
``kernels.kernelize``, and compares the predicted noise again (normwise
relative error) while counting the calls of our ``linear_fwd`` op.

    python examples/diffusers_unet.py [--build build] [--batch 2] [--size 32] [--dtype bf16]

diffusers has no kernelize hook of its own (none of its classes carries a
``kernel_layer_name``), but ``kernels.kernelize`` with ``use_kernel_mapping``
works on its models once the Linear modules are marked (``mark_linears``).
The convolutions, norms and attention itself stay torch's.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernelize_linear import (  # noqa: E402
    DEFAULT_BUILD,
    Comparison,
    compare_kernelized,
    kernelize_linears,
    linear_repository,
    summary,
)
from diffusers import UNet2DConditionModel  # noqa: E402
from kernels import Mode  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
_CASTS = {torch.bfloat16: "bfloat16", torch.float16: "half", torch.float32: "float"}

# Normwise relative error of the kernelized output against the unkernelized model's, same dtype.
OUTPUT_TOLERANCE = {torch.bfloat16: 2e-2, torch.float16: 5e-3, torch.float32: 1e-4}


def unet_config(
    *,
    block_out_channels: tuple[int, ...] = (32, 64),
    layers_per_block: int = 1,
    cross_attention_dim: int = 64,
    attention_head_dim: int = 8,
    sample_size: int = 16,
    norm_num_groups: int = 8,
) -> dict:
    """A UNet2DConditionModel config: cross-attention down/up blocks around plain ones,
    as in Stable Diffusion, scaled down (the defaults make a ~0.8M-parameter model)."""
    levels = len(block_out_channels)
    down = ["CrossAttnDownBlock2D"] * (levels - 1) + ["DownBlock2D"]
    up = ["UpBlock2D"] + ["CrossAttnUpBlock2D"] * (levels - 1)
    return {
        "sample_size": sample_size,
        "in_channels": 4,
        "out_channels": 4,
        "layers_per_block": layers_per_block,
        "block_out_channels": list(block_out_channels),
        "down_block_types": down,
        "up_block_types": up,
        "cross_attention_dim": cross_attention_dim,
        "attention_head_dim": attention_head_dim,
        "norm_num_groups": norm_num_groups,
    }


def build_unet(config: dict, *, device: str = "cuda", dtype: torch.dtype = torch.bfloat16,
               seed: int = 0) -> UNet2DConditionModel:
    """UNet2DConditionModel.from_config with random weights (seeded), built on ``device``, in eval mode."""
    torch.manual_seed(seed)
    with torch.device(device):
        model = UNet2DConditionModel.from_config(config)
    # .bfloat16() and the like, not .to(dtype): diffusers' .to warns about fp32-kept modules (there are none).
    return getattr(model, _CASTS[dtype])().eval()


def unet_inputs(config: dict, *, batch: int = 2, size: int | None = None, text_tokens: int = 16,
                device: str = "cuda", dtype: torch.dtype = torch.bfloat16, seed: int = 1) -> dict:
    """A latent batch, one timestep per sample and text-encoder states (all random, seeded)."""
    generator = torch.Generator().manual_seed(seed)
    size = config["sample_size"] if size is None else size
    sample = torch.randn(batch, config["in_channels"], size, size, generator=generator)
    timestep = torch.randint(0, 1000, (batch,), generator=generator)
    text = torch.randn(batch, text_tokens, config["cross_attention_dim"], generator=generator)
    return {
        "sample": sample.to(device, dtype),
        "timestep": timestep.to(device),
        "encoder_hidden_states": text.to(device, dtype),
    }


def predict(model: UNet2DConditionModel, inputs: dict) -> torch.Tensor:
    """The UNet's output (the predicted noise); floating inputs are cast to the model's dtype."""
    cast = {k: v.to(model.dtype) if v.is_floating_point() else v for k, v in inputs.items()}
    return model(**cast).sample


def compare_unet(
    config: dict | None = None,
    *,
    build_dir: Path | str = DEFAULT_BUILD,
    device: str = "cuda",
    dtype: torch.dtype = torch.bfloat16,
    batch: int = 2,
    size: int | None = None,
    seed: int = 0,
    fp32_reference: bool = False,
    time_iters: int = 0,
) -> Comparison:
    """The UNet's output before and after kernelizing its Linear layers (``compare_kernelized``)."""
    config = unet_config() if config is None else config
    model = build_unet(config, device=device, dtype=dtype, seed=seed)
    inputs = unet_inputs(config, batch=batch, size=size, device=device, dtype=dtype)

    def kernelize_model(m):
        kernelize_linears(m, mode=Mode.INFERENCE, device=torch.device(device).type,
                          repository=linear_repository(build_dir))

    return compare_kernelized(model, lambda m: predict(m, inputs), build_dir=build_dir,
                              kernelize_model=kernelize_model, fp32_reference=fp32_reference, time_iters=time_iters)


def describe(config: dict) -> str:
    return (f"UNet2DConditionModel channels {tuple(config['block_out_channels'])}, "
            f"{config['layers_per_block']} layer(s) per block, cross-attention dim {config['cross_attention_dim']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build", type=Path, default=DEFAULT_BUILD, help="the build folder (default: %(default)s)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--size", type=int, default=32, help="latent height and width")
    parser.add_argument("--iters", type=int, default=20, help="timed forwards per model on the GPU")
    args = parser.parse_args(argv)

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = DTYPES[args.dtype]
    # cuDNN runs fp32 convolutions in TF32 by default: its rounding of each conv input would
    # turn our kernel's last-bit differences from cuBLAS into much larger ones. Compare in real fp32.
    torch.backends.cudnn.allow_tf32 = False
    config = unet_config()
    result = compare_unet(config, build_dir=args.build, device=device, dtype=dtype, batch=args.batch,
                          size=args.size, fp32_reference=True, time_iters=args.iters if device == "cuda" else 0)
    print(f"{describe(config)}; {args.dtype}, batch {args.batch} x {args.size}x{args.size} latents, on {device}")
    lines, ok = summary(result, tolerance=OUTPUT_TOLERANCE[dtype], on_gpu=device == "cuda", iters=args.iters)
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
