"""A Llama-style transformers model whose nn.Linear layers run persistent_matmul's MatmulLinear.

Builds a small LlamaForCausalLM from a LlamaConfig (random weights, nothing
downloaded), computes its logits, maps every nn.Linear (q/k/v/o, gate/up/down,
lm_head) to MatmulLinear from this repository's local build with
``kernels.kernelize``, and compares the logits again (normwise relative error)
while counting the calls of our ``linear_fwd`` op with the profiler.

    python examples/transformers_llama.py [--build build] [--batch 2] [--seq 128] [--dtype bf16]

On a GPU it prints the error, the op calls and the forward time of both; on a
machine without one the layers fall back to F.linear (same logits, no op call).

Two ways to kernelize, both offline:

* ``kernelize_linears`` (examples/kernelize_linear.py): kernels' own
  ``kernelize`` with ``use_kernel_mapping`` and a ``LocalLayerRepository``;
  any device and mode, ``Mode.TORCH_COMPILE`` and ``Mode.TRAINING`` included.
* ``kernelize_with_kernel_config``: transformers' ``KernelConfig`` path,
  ``model.set_use_kernels(True, KernelConfig(...))``. What we found with
  transformers 5.22.2 and kernels 0.17.2: it works offline with
  ``use_local_kernel=True`` and ``"<absolute build path>:MatmulLinear"``
  (it becomes a LocalLayerRepository, and transformers kernelizes with only
  that mapping); the Linear modules must be marked first
  (``sanitize_kernel_mapping`` rejects a layer name no module carries);
  it only maps accelerator devices (a model on the CPU is rejected with
  "Only devices in [...] are supported, got: cpu"); and the mode is fixed
  when the mapping is made, ``Mode.INFERENCE`` or ``Mode.TRAINING`` from
  ``model.training``, never ``Mode.TORCH_COMPILE``. A later ``model.train()``
  re-kernelizes for TRAINING against the INFERENCE-only mapping, which
  falls back to nn.Linear's forward without an error. It also registers
  transformers' default mapping in kernels' global mapping. For
  torch.compile or training, use ``kernelize_linears``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernelize_linear import (  # noqa: E402
    DEFAULT_BUILD,
    LAYER_NAME,
    Comparison,
    compare_kernelized,
    kernelize_linears,
    linear_repository,
    mark_linears,
    summary,
)
from kernels import Mode  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}

# Normwise relative error of the kernelized logits against the unkernelized model's, same dtype.
LOGITS_TOLERANCE = {torch.bfloat16: 2e-2, torch.float16: 5e-3, torch.float32: 1e-4}


def llama_config(
    *,
    hidden_size: int = 256,
    intermediate_size: int = 688,
    num_hidden_layers: int = 2,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    vocab_size: int = 1024,
    max_position_embeddings: int = 2048,
) -> LlamaConfig:
    """A Llama-style config; the defaults make a ~2M-parameter model (GQA, SwiGLU MLP, untied head)."""
    return LlamaConfig(
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        vocab_size=vocab_size,
        max_position_embeddings=max_position_embeddings,
    )


def build_llama(config: LlamaConfig, *, device: str = "cuda", dtype: torch.dtype = torch.bfloat16,
                seed: int = 0) -> LlamaForCausalLM:
    """LlamaForCausalLM with random weights (seeded), built directly on ``device``, in eval mode."""
    torch.manual_seed(seed)
    with torch.device(device):
        model = LlamaForCausalLM(config)
    return model.to(dtype).eval()


def random_input_ids(config: LlamaConfig, batch: int, seq: int, *, device: str = "cuda", seed: int = 1) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, config.vocab_size, (batch, seq), generator=generator).to(device)


def logits(model: LlamaForCausalLM, input_ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=input_ids, use_cache=False).logits


def kernelize_with_kernel_config(model: LlamaForCausalLM, build_dir: Path | str = DEFAULT_BUILD) -> None:
    """transformers' own path: mark the Linear modules, then ``set_use_kernels`` with a
    ``KernelConfig`` naming the local build (see the module docstring for its limits)."""
    from transformers import KernelConfig

    mark_linears(model)
    config = KernelConfig({LAYER_NAME: f"{Path(build_dir).resolve()}:{LAYER_NAME}"}, use_local_kernel=True)
    model.set_use_kernels(True, config)


def compare_llama(
    config: LlamaConfig | None = None,
    *,
    build_dir: Path | str = DEFAULT_BUILD,
    device: str = "cuda",
    dtype: torch.dtype = torch.bfloat16,
    batch: int = 2,
    seq: int = 64,
    seed: int = 0,
    how: str = "kernelize",
    fp32_reference: bool = False,
    time_iters: int = 0,
) -> Comparison:
    """Logits of a model from ``config`` before and after kernelizing its Linear layers
    (``compare_kernelized``). ``how`` is ``"kernelize"`` (kernels' kernelize with a
    LocalLayerRepository) or ``"kernel_config"`` (transformers' KernelConfig; GPU only)."""
    config = llama_config() if config is None else config
    model = build_llama(config, device=device, dtype=dtype, seed=seed)
    ids = random_input_ids(config, batch, seq, device=device)
    if how == "kernelize":
        def kernelize_model(m):
            kernelize_linears(m, mode=Mode.INFERENCE, device=torch.device(device).type,
                              repository=linear_repository(build_dir))
    elif how == "kernel_config":
        def kernelize_model(m):
            kernelize_with_kernel_config(m, build_dir)
    else:
        raise ValueError(f"how must be 'kernelize' or 'kernel_config', got {how!r}")
    return compare_kernelized(model, lambda m: logits(m, ids), build_dir=build_dir, kernelize_model=kernelize_model,
                              fp32_reference=fp32_reference, time_iters=time_iters)


def describe(config: LlamaConfig) -> str:
    return (f"Llama hidden {config.hidden_size}, intermediate {config.intermediate_size}, "
            f"{config.num_hidden_layers} layers, {config.num_attention_heads} heads "
            f"({config.num_key_value_heads} KV), vocab {config.vocab_size}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build", type=Path, default=DEFAULT_BUILD, help="the build folder (default: %(default)s)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--intermediate", type=int, default=688)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--iters", type=int, default=20, help="timed forwards per model on the GPU")
    parser.add_argument("--kernel-config", action="store_true",
                        help="kernelize through transformers' KernelConfig instead of kernels.kernelize")
    args = parser.parse_args(argv)

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = DTYPES[args.dtype]
    config = llama_config(hidden_size=args.hidden, intermediate_size=args.intermediate, num_hidden_layers=args.layers,
                          num_attention_heads=max(1, args.hidden // 64), num_key_value_heads=max(1, args.hidden // 128))
    how = "kernel_config" if args.kernel_config else "kernelize"
    if how == "kernel_config" and device == "cpu":
        parser.error("transformers' KernelConfig maps accelerator devices only; this machine has no GPU")
    result = compare_llama(config, build_dir=args.build, device=device, dtype=dtype, batch=args.batch, seq=args.seq,
                           how=how, fp32_reference=True, time_iters=args.iters if device == "cuda" else 0)
    print(f"{describe(config)}; {args.dtype}, batch {args.batch} x seq {args.seq}, on {device}, via {how}")
    lines, ok = summary(result, tolerance=LOGITS_TOLERANCE[dtype], on_gpu=device == "cuda", iters=args.iters)
    print("\n".join(lines))
    return 0 if ok else 1

if __name__ == "__main__":
    sys.exit(main())
