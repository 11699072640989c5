"""GPU tests of the linear_fwd custom op: opcheck, backward numerics, torch.compile, training.

Run on the device: python -m pytest tests/test_gpu_autograd.py -q
"""

from __future__ import annotations

import sys

import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.gpu

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
# Normwise tolerances ||got - ref|| / ||ref|| against an fp32 F.linear reference.
TOL = {torch.bfloat16: 2e-2, torch.float16: 5e-3, torch.float32: 1e-4}


@pytest.fixture(scope="module")
def compile_mod(pm):
    return sys.modules[pm.__name__ + "._compile"]


def _normwise(got: torch.Tensor, ref: torch.Tensor) -> float:
    got, ref = got.double(), ref.double()
    return ((got - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def _rand(*shape, dtype, requires_grad=False, gen=None):
    t = torch.randn(*shape, dtype=torch.float32, device="cuda", generator=gen).to(dtype)
    return t.requires_grad_(requires_grad)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("x_shape", [(17, 64), (2, 9, 64)])
def test_opcheck(compile_mod, dtype, bias, x_shape):
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = _rand(*x_shape, dtype=dtype, requires_grad=True, gen=gen)
    w = _rand(48, 64, dtype=dtype, requires_grad=True, gen=gen)
    b = _rand(48, dtype=dtype, requires_grad=True, gen=gen) if bias else None
    torch.library.opcheck(compile_mod.linear_op, (x, w, b, "auto"))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [True, False])
def test_backward_matches_torch(pm, dtype, bias):
    gen = torch.Generator(device="cuda").manual_seed(1)
    x = _rand(3, 37, 96, dtype=dtype, requires_grad=True, gen=gen)
    w = _rand(80, 96, dtype=dtype, requires_grad=True, gen=gen)
    b = _rand(80, dtype=dtype, requires_grad=True, gen=gen) if bias else None
    grad = _rand(3, 37, 80, dtype=dtype, gen=gen)
    y = pm.linear(x, w, b)
    inputs = (x, w) if b is None else (x, w, b)
    got = torch.autograd.grad(y, inputs, grad)

    ref_inputs = [t.detach().float().requires_grad_() for t in inputs]
    y_ref = F.linear(ref_inputs[0], ref_inputs[1], ref_inputs[2] if bias else None)
    want = torch.autograd.grad(y_ref, ref_inputs, grad.float())
    assert _normwise(y, y_ref) <= TOL[dtype]
    for name, g, r in zip(("x", "weight", "bias"), got, want):
        assert g.dtype == dtype and g.shape == r.shape, name
        assert _normwise(g, r) <= TOL[dtype], name


def _model(pm, variant_dir, mode, dtype=torch.float32, seed=0):
    from kernels import LocalLayerRepository, kernelize, use_kernel_forward_from_hub, use_kernel_mapping

    @use_kernel_forward_from_hub("PersistentMatmulLinearGpuTest")
    class Linear(torch.nn.Linear):
        pass

    torch.manual_seed(seed)
    model = torch.nn.Sequential(Linear(64, 128), torch.nn.GELU(), Linear(128, 32)).to("cuda", dtype)
    repo = LocalLayerRepository(repo_path=variant_dir.parent, layer_name="MatmulLinear")
    with use_kernel_mapping({"PersistentMatmulLinearGpuTest": {"cuda": repo}}, inherit_mapping=False):
        kernelize(model, device="cuda", mode=mode)
    assert model[0].forward.__func__ is pm.layers.MatmulLinear.forward
    return model


@pytest.mark.parametrize("dtype", DTYPES)
def test_torch_compile_fullgraph_matches_eager(pm, variant_dir, dtype):
    from kernels import Mode

    model = _model(pm, variant_dir, Mode.INFERENCE | Mode.TORCH_COMPILE, dtype)
    x = _rand(4, 16, 64, dtype=dtype)
    with torch.no_grad():
        eager = model(x)
        torch._dynamo.reset()
        compiled = torch.compile(model, fullgraph=True)(x)
    assert _normwise(compiled, eager) <= TOL[dtype]
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(model)(x)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1


def test_torch_compile_backward_matches_eager(pm, variant_dir):
    from kernels import Mode

    model = _model(pm, variant_dir, Mode.TRAINING | Mode.TORCH_COMPILE)
    x = _rand(4, 16, 64, dtype=torch.float32)
    model(x).square().mean().backward()
    eager = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    torch._dynamo.reset()
    torch.compile(model, fullgraph=True)(x).square().mean().backward()
    for g, e in zip((p.grad for p in model.parameters()), eager):
        assert _normwise(g, e) <= TOL[torch.float32]


@pytest.mark.parametrize("compiled", [False, True])
def test_training_step_reduces_loss(pm, variant_dir, compiled):
    from kernels import Mode

    mode = Mode.TRAINING | Mode.TORCH_COMPILE if compiled else Mode.TRAINING
    model = _model(pm, variant_dir, mode, seed=2)
    gen = torch.Generator(device="cuda").manual_seed(3)
    x = _rand(256, 64, dtype=torch.float32, gen=gen)
    target = _rand(256, 32, dtype=torch.float32, gen=gen)
    torch._dynamo.reset()
    fwd = torch.compile(model, fullgraph=True) if compiled else model
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    before = [p.detach().clone() for p in model.parameters()]
    loss0 = F.mse_loss(fwd(x), target)
    loss0.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
    optimizer.step()
    assert all(not torch.equal(p.detach(), b) for p, b in zip(model.parameters(), before))
    with torch.no_grad():
        loss1 = F.mse_loss(fwd(x), target)
    assert loss1.item() < loss0.item()
