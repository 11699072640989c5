"""MatmulLinear and kernelize_linears under tensor parallelism, on the CPU with gloo.

Two processes (torch.multiprocessing, a FileStore rendezvous) shard a small Llama with
transformers' tensor-parallel plan (harness.tensor_parallel.apply_tp_plan) whose local
shapes are multiples of nothing (intermediate 202: 101 a rank; vocabulary 301: 151 and
150), kernelize it, and compare with the unkernelized sharded model and the whole model
in one process; the layer is also called directly with DTensors. Without a GPU the layer
computes with torch, so the kernelized logits equal the sharded torch logits exactly;
what is checked is that the plan's forward survives kernelize around MatmulLinear's
(local shards in inference, DTensors with gradients), and that a lost wrapper is a
clear error. Then scripts/tp_benchmark.py's gloo smoke run, its refusals, and its
checks and table on made-up reports. The GPU test at the end runs on the device.
"""

from __future__ import annotations

import copy
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "examples"))
import kernelize_linear as kl  # noqa: E402
from harness import tensor_parallel as tp  # noqa: E402

WORLD = 2


def _small_llama_config():
    from transformers import LlamaConfig

    return LlamaConfig(hidden_size=96, intermediate_size=202, num_hidden_layers=2, num_attention_heads=6,
                       num_key_value_heads=2, vocab_size=301, max_position_embeddings=64)


# --- in each of the two processes ------------------------------------------------------------


def _layer_with_dtensors(layer, rank: int) -> None:
    """MatmulLinear.forward on DTensors gives F.linear's product; mixed kinds raise TypeError."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (WORLD,))
    torch.manual_seed(1)
    x, w, b = torch.randn(3, 5), torch.randn(7, 5), torch.randn(7)
    expected = F.linear(x, w, b)
    module = torch.nn.Linear(5, 7)
    module.forward = types.MethodType(layer.forward, module)
    # column-parallel (out_features 7: rows 4 and 3), then row-parallel (in_features 5: 3 and 2)
    for w_place, b_place, x_place in ((Shard(0), Shard(0), Replicate()), (Shard(1), Replicate(), Shard(1))):
        module.weight = torch.nn.Parameter(distribute_tensor(w, mesh, [w_place]))
        module.bias = torch.nn.Parameter(distribute_tensor(b, mesh, [b_place]))
        y = module(distribute_tensor(x, mesh, [x_place]))
        assert isinstance(y, DTensor)
        torch.testing.assert_close(y.full_tensor(), expected, rtol=1e-6, atol=1e-6)
    assert module.weight.to_local().shape == ((7, 3) if rank == 0 else (7, 2))
    with pytest.raises(TypeError, match="DTensor weight and bias but plain input"):
        module(torch.randn(3, 5))


def _kernelized_tp_llama(layer, build_dir: str, rank: int) -> None:
    from kernels import Mode
    from torch.distributed.tensor import DTensor
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    whole = LlamaForCausalLM(_small_llama_config()).eval()
    ids = torch.randint(0, 301, (2, 11), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        reference = whole(input_ids=ids).logits
    sharded = tp.apply_tp_plan(copy.deepcopy(whole))
    down = sharded.model.layers[0].mlp.down_proj
    assert isinstance(down.weight, DTensor) and down.weight.to_local().shape == (96, 101)
    assert sharded.lm_head.weight.to_local().shape == ((151, 96) if rank == 0 else (150, 96))
    with torch.no_grad():
        torch_logits = sharded(input_ids=ids).logits
    torch.testing.assert_close(torch_logits, reference, rtol=1e-5, atol=1e-5)

    names = kl.kernelize_linears(sharded, mode=Mode.INFERENCE, device="cpu",
                                 repository=kl.linear_repository(build_dir))
    assert len(names) == 2 * 7 + 1
    # Every Linear call must reach MatmulLinear's forward, inside the plan's wrapper.
    calls = [0]
    globals_ = layer.forward.__globals__
    kernels_take = globals_["kernels_take"]

    def counted(*tensors):
        calls[0] += 1
        return kernels_take(*tensors)

    linears = [m for m in sharded.modules() if isinstance(m, torch.nn.Linear)]
    globals_["kernels_take"] = counted
    try:
        with torch.no_grad(), kl.count_module_calls(linears) as module_calls:
            logits = sharded(input_ids=ids).logits
    finally:
        globals_["kernels_take"] = kernels_take
    assert module_calls[0] == 2 * 7 + 1 and calls[0] == module_calls[0]
    assert torch.equal(logits, torch_logits)

    # With gradients the plan hands the layer DTensors, which it leaves to torch.
    whole.train()
    sharded.train()
    whole(input_ids=ids).logits.square().mean().backward()
    grad_logits = sharded(input_ids=ids).logits
    torch.testing.assert_close(grad_logits, reference, rtol=1e-5, atol=1e-5)
    grad_logits.square().mean().backward()
    for name in ("model.layers.1.mlp.down_proj", "model.layers.0.self_attn.q_proj", "lm_head"):
        got = sharded.get_submodule(name).weight.grad
        assert isinstance(got, DTensor)
        torch.testing.assert_close(got.full_tensor(), whole.get_submodule(name).weight.grad, rtol=1e-4, atol=1e-6)

    # kernelize without the plan's wrapper: the layer sees a DTensor weight and a plain input.
    bare = types.MethodType(layer.forward, down)
    with pytest.raises(TypeError, match="DTensor weight but plain input"):
        bare(torch.randn(2, 101))


def _worker(rank: int, store: str, build_dir: str) -> None:
    import torch.distributed as dist
    from kernels import get_local_kernel

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    try:
        layer = get_local_kernel(Path(build_dir)).layers.MatmulLinear
        _layer_with_dtensors(layer, rank)
        _kernelized_tp_llama(layer, build_dir, rank)
    finally:
        dist.destroy_process_group()


def test_kernelized_layers_under_a_tensor_parallel_plan_on_two_gloo_ranks(variant_dir, tmp_path):
    import torch.multiprocessing as mp

    mp.spawn(_worker, args=(str(tmp_path / "store"), str(variant_dir.parent)), nprocs=WORLD, join=True)


# --- in this process ----------------------------------------------------------------------------


def test_kernelize_linears_refuses_a_wrapper_that_is_not_a_tensor_parallel_plan(variant_dir):
    from kernels import Mode

    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    inner = model[1].forward
    model[1].forward = lambda x: inner(x) * 2  # a hook-style wrapper, as accelerate installs
    with pytest.raises(ValueError, match=r"not their tensor-parallel plan's .*\['1'\]"):
        kl.kernelize_linears(model, mode=Mode.INFERENCE, device="cpu",
                             repository=kl.linear_repository(variant_dir.parent))
    assert "forward" in vars(model[1]) and "forward" not in vars(model[0])  # nothing kernelized


def test_kernelize_linears_twice_replaces_its_own_forward(variant_dir):
    from kernels import Mode

    model = torch.nn.Sequential(torch.nn.Linear(4, 3))
    repository = kl.linear_repository(variant_dir.parent)
    for _ in range(2):
        assert kl.kernelize_linears(model, mode=Mode.INFERENCE, device="cpu", repository=repository) == ["0"]
    x = torch.randn(2, 4)
    assert torch.equal(model(x), F.linear(x, model[0].weight, model[0].bias))


@pytest.mark.parametrize("env, device, expected", [
    ({}, "cpu", "not started by torchrun"),
    ({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1"}, "cpu", "at least 2 ranks"),
    ({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}, "tpu", "device must be"),
])
def test_launch_problem_names_what_is_missing(monkeypatch, env, device, expected):
    for name in tp.TORCHRUN_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert expected in tp.launch_problem(device)
    with pytest.raises(RuntimeError, match=expected):
        tp.init_distributed(device)


def test_launch_problem_on_this_machine_for_two_ranks(monkeypatch):
    for name, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(name, value)
    if torch.cuda.device_count() >= 2:
        assert tp.launch_problem("cuda") is None
    else:
        assert "GPU" in tp.launch_problem("cuda")
    assert (tp.launch_problem("cpu") is None) == (not torch.cuda.is_available())


def _tp_benchmark(args: list[str], env: dict, torchrun: bool) -> subprocess.CompletedProcess:
    command = [sys.executable]
    if torchrun:
        command += ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    return subprocess.run([*command, str(REPO / "scripts" / "tp_benchmark.py"), *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=240)


def test_tp_benchmark_refuses_to_start_outside_torchrun(subprocess_env):
    result = _tp_benchmark([], subprocess_env, torchrun=False)
    assert result.returncode == 2
    assert "not started by torchrun" in result.stderr and "--nproc-per-node 2" in result.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="the gloo smoke run is for machines without a GPU")
def test_tp_benchmark_cpu_smoke_run_on_two_ranks(subprocess_env, tmp_path):
    result = _tp_benchmark(["--device", "cpu", "--out", str(tmp_path)], subprocess_env, torchrun=True)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "tensor-parallel smoke run on gloo, 2 ranks" in result.stdout
    for rank, lm_head in ((0, 151), (1, 150)):
        assert f"rank {rank}: 15 Linear modules kernelized" in result.stdout
        assert f"'lm_head': ({lm_head}, 96)" in result.stdout
    assert result.stdout.rstrip().endswith("OK")


@pytest.mark.skipif(torch.cuda.is_available(), reason="without a GPU the default device must be refused")
def test_tp_benchmark_without_cuda_says_so(subprocess_env):
    result = _tp_benchmark([], subprocess_env, torchrun=True)
    assert result.returncode != 0
    assert "needs CUDA GPUs, and none is present here" in result.stderr


def _report(rank: int, **row) -> dict:
    case = {"case": "prefill 1x2048", "tokens": 2048, "single_eager_ms": 10.0, "single_graph_ms": 9.0,
            "torch_eager_ms": 6.0, "torch_graph_ms": 5.5, "kernelized_eager_ms": 5.0, "kernelized_graph_ms": 5.0,
            "torch_eager_rel_error": 1e-2, "torch_graph_rel_error": 1e-2, "kernelized_eager_rel_error": 1.2e-2,
            "kernelized_graph_rel_error": 1.1e-2, "eager_ratio": 1.2, "graph_ratio": 1.1, **row}
    return {"rank": rank, "device": f"cuda:{rank}", "kernelized_modules": 29, "linear_calls": 29, "op_calls": 29,
            "shards": {"lm_head": (64128, 4096)}, "rows": [case]}


def test_tp_benchmark_checks_and_table():
    import tp_benchmark

    good = [_report(0), _report(1)]
    assert tp_benchmark.checks(good, "cuda") == []
    bad = [_report(0, kernelized_eager_rel_error=0.9), {**_report(1), "op_calls": 0}]
    bad[1]["rows"][0].pop("kernelized_graph_ms")
    bad[1]["rows"][0]["kernelized_graph_error"] = "RuntimeError: capture failed"
    failed = tp_benchmark.checks(bad, "cuda")
    assert any("rank 0" in f and "kernelized_eager_rel_error 9.00e-01" in f for f in failed)
    assert any("rank 1: 0 linear_fwd calls for 29 Linear calls" in f for f in failed)
    assert any("kernelized_graph raised RuntimeError: capture failed" in f for f in failed)
    args = types.SimpleNamespace(layers=4, iters=20)
    text = tp_benchmark.markdown(bad, {"gpu": "NVIDIA H100 80GB HBM3", "git_commit": "abc"}, args, failed)
    assert "- GPU: NVIDIA H100 80GB HBM3" in text and "lm_head 64128x4096" in text
    assert "| prefill 1x2048 | 0 | 10.000 / 9.000 | 6.000 / 5.500 | 5.000 / 5.000 | 1.20 | 1.10 |" in text
    assert "| prefill 1x2048 | 1 |" in text and "5.000 / failed" in text
    assert "- FAILED: rank 1: 0 linear_fwd calls" in text


# --- on the GPU ---------------------------------------------------------------------------------


@pytest.mark.gpu
def test_dtensors_on_cuda_are_left_to_torch(pm, tmp_path, monkeypatch):
    """On CUDA a DTensor reports a device and dtype our kernels take: kernels_take must
    still refuse it, and the layer must give F.linear's DTensor product."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

    for name, value in tp.MULTICAST_OFF_ENV.items():
        monkeypatch.setenv(name, value)
    compile_mod = sys.modules[pm.__name__ + "._compile"]
    dist.init_process_group("nccl", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cuda", (1,))
        x = torch.randn(5, 64, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(48, 64, device="cuda", dtype=torch.bfloat16)
        wd = distribute_tensor(w, mesh, [Shard(0)])
        xd = distribute_tensor(x, mesh, [Replicate()])
        assert compile_mod.kernels_take(x, w) and not compile_mod.kernels_take(xd, wd)
        module = torch.nn.Linear(64, 48, bias=False, device="cuda", dtype=torch.bfloat16)
        module.forward = types.MethodType(pm.layers.MatmulLinear.forward, module)
        module.weight = torch.nn.Parameter(wd)
        y = module(xd)
        assert isinstance(y, DTensor)
        torch.testing.assert_close(y.full_tensor(), F.linear(x, w))
        with pytest.raises(TypeError, match="plain input"):
            module(x)
    finally:
        dist.destroy_process_group()
