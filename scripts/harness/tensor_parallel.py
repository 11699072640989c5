"""Tensor parallelism for the scripts and tests: the process group, and transformers' plan.

* ``launch_problem(device)``: why this process cannot take part in a tensor-parallel
  run (not started by torchrun with 2+ ranks, no CUDA or too few GPUs), or None;
* ``init_distributed(device)``: the process group from torchrun's environment, NCCL
  on CUDA (NVLink multicast off: ``MULTICAST_OFF_ENV``) and gloo on the CPU;
* ``broadcast_parameters(model)``: rank 0's weights on every rank;
* ``apply_tp_plan(model)``: transformers' tensor-parallel plan (``tp_plan="auto"``:
  the model's own plan) applied to a model built from its config, the step
  ``from_pretrained(..., tp_plan="auto")`` takes between building the model and
  loading the weights into the shards (that path also needs accelerate, and a
  checkpoint to load).
"""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist

MULTICAST_OFF_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "NCCL_CUMEM_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
"""NVLink multicast stays off in NCCL, PyTorch and NVSHMEM: on a shared multi-GPU host a
program using it can take the host's GPUs out of service, and the all-reduces of a
tensor-parallel forward run over NVLink without it. NCCL's cuMem allocations, which its
multicast is built on, go with it."""

TORCHRUN_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")


def launch_problem(device: str, min_ranks: int = 2) -> str | None:
    """What stops this process from running tensor-parallel on ``device`` ("cuda" or
    "cpu"), as a sentence; None when nothing does."""
    if device not in ("cuda", "cpu"):
        return f"device must be 'cuda' or 'cpu', not {device!r}"
    missing = [name for name in TORCHRUN_VARIABLES if name not in os.environ]
    if missing:
        return (f"not started by torchrun ({', '.join(missing)} unset): run it as "
                f"`torchrun --nproc-per-node {min_ranks} ...`")
    world = int(os.environ["WORLD_SIZE"])
    if world < min_ranks:
        return f"needs at least {min_ranks} ranks, got WORLD_SIZE={world}: torchrun --nproc-per-node {min_ranks}"
    if device == "cuda":
        if not torch.cuda.is_available():
            return "needs CUDA GPUs, and none is present here (--device cpu runs the gloo smoke test)"
        local = int(os.environ["LOCAL_WORLD_SIZE"])
        if torch.cuda.device_count() < local:
            return f"{local} ranks on this host but only {torch.cuda.device_count()} GPU(s) visible: one GPU per rank"
    elif torch.cuda.is_available():
        # transformers builds the mesh on the accelerator it finds, whatever the process group.
        return "--device cpu is for machines without a GPU (transformers would build the tensor-parallel mesh on CUDA)"
    return None


def init_distributed(device: str, timeout_s: float = 600.0) -> torch.device:
    """Initialize the default process group from torchrun's environment and return this
    rank's device: NCCL with this rank's GPU bound (``MULTICAST_OFF_ENV`` set),
    or gloo on the CPU. Raises RuntimeError saying why if ``launch_problem`` finds a reason."""
    problem = launch_problem(device)
    if problem:
        raise RuntimeError(problem)
    timeout = datetime.timedelta(seconds=timeout_s)
    if device == "cpu":
        dist.init_process_group("gloo", timeout=timeout)
        return torch.device("cpu")
    # NCCL reads these when its first communicator is made; they override the caller's
    # environment, since multicast must stay off whoever starts the script.
    os.environ.update(MULTICAST_OFF_ENV)
    rank_device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(rank_device)
    dist.init_process_group("nccl", device_id=rank_device, timeout=timeout)
    return rank_device


@torch.no_grad()
def broadcast_parameters(model: torch.nn.Module, src: int = 0) -> None:
    """Copy rank ``src``'s parameters and buffers to every rank (random weights drawn on
    each GPU need not agree bit for bit; sharding assumes they do)."""
    for tensor in [*model.parameters(), *model.buffers()]:
        dist.broadcast(tensor.data, src=src)


def apply_tp_plan(model, tp_plan: str | dict = "auto"):
    """Shard ``model`` (a transformers PreTrainedModel on this rank's device, the same
    weights on every rank) over all ranks with ``tp_plan`` ("auto": its own
    ``base_model_tp_plan``), in place: weights become DTensors holding this rank's shard
    and each planned module's forward becomes the plan's wrapper. Returns the model."""
    from transformers.distributed import DistributedConfig

    if not dist.is_initialized():
        raise RuntimeError("apply_tp_plan needs an initialized process group (init_distributed)")
    config = DistributedConfig(tp_plan=tp_plan, tp_size=dist.get_world_size())
    config, _, mesh_manager = type(model).prepare_distribute_model(config)
    return type(model).maybe_distribute_model(model, config, mesh_manager)
