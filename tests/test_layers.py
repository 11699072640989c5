"""layers.MatmulLinear and the linear_fwd custom op, on a machine without a GPU.

Covers what runs on the CPU: kernelize's layer validator, the per-call
fallback to torch.nn.functional.linear, kernelize with a CPU mapping, the
op's fake kernel (shape/dtype), the autograd formula and dynamo tracing.
The GPU side (opcheck, backward numerics, torch.compile) is in
test_gpu_autograd.py.
"""

from __future__ import annotations

import sys
import types

import pytest
import torch
import torch.nn.functional as F


@pytest.fixture(scope="module")
def compile_mod(pm):
    mod = sys.modules[pm.__name__ + "._compile"]
    assert getattr(pm, "_compile", None) is mod
    return mod


# --- kernelize's validator -------------------------------------------------------


def test_layer_passes_kernels_validation_for_every_mode(pm):
    from kernels import Mode
    from kernels.layer.layer import _validate_layer, _validate_layer_has_mode

    layer = pm.layers.MatmulLinear
    _validate_layer(check_cls=torch.nn.Linear, cls=layer, repo="persistent-matmul (local build)")
    assert layer.has_backward is True and layer.can_torch_compile is True
    for mode in (Mode.INFERENCE, Mode.TRAINING, Mode.INFERENCE | Mode.TORCH_COMPILE,
                 Mode.TRAINING | Mode.TORCH_COMPILE):
        assert _validate_layer_has_mode(layer_name="Linear", module=layer, repo="r", repo_mode=mode)


# --- per-call fallback ---------------------------------------------------------------


def _host(pm, in_features, out_features, bias, dtype):
    """An nn.Linear whose forward is MatmulLinear.forward (as kernelize installs it)."""
    module = torch.nn.Linear(in_features, out_features, bias=bias, dtype=dtype)
    module.forward = types.MethodType(pm.layers.MatmulLinear.forward, module)
    return module


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("x_shape", [(5, 8), (2, 3, 8), (8,)])
def test_cpu_forward_falls_back_to_f_linear_exactly(pm, dtype, bias, x_shape):
    torch.manual_seed(0)
    module = _host(pm, 8, 6, bias, dtype)
    x = torch.randn(x_shape, dtype=dtype)
    y = module(x)
    expected = F.linear(x, module.weight, module.bias)
    assert y.dtype == dtype and y.shape == expected.shape
    assert torch.equal(y, expected)


def test_cpu_fallback_backward_matches_f_linear(pm):
    torch.manual_seed(0)
    module = _host(pm, 4, 3, True, torch.float64)
    x = torch.randn(2, 5, 4, dtype=torch.float64, requires_grad=True)
    module(x).square().sum().backward()
    grads = [x.grad, module.weight.grad, module.bias.grad]
    x2 = x.detach().clone().requires_grad_()
    w2 = module.weight.detach().clone().requires_grad_()
    b2 = module.bias.detach().clone().requires_grad_()
    F.linear(x2, w2, b2).square().sum().backward()
    for got, want in zip(grads, [x2.grad, w2.grad, b2.grad]):
        assert torch.equal(got, want)


def test_kernelize_cpu_mapping_gives_plain_models_output(pm, variant_dir):
    from kernels import LocalLayerRepository, Mode, kernelize, use_kernel_forward_from_hub, use_kernel_mapping

    @use_kernel_forward_from_hub("PersistentMatmulLinearFallbackTest")
    class Linear(torch.nn.Linear):
        pass

    torch.manual_seed(0)
    model = torch.nn.Sequential(Linear(8, 16), torch.nn.GELU(), Linear(16, 4, bias=False))
    x = torch.randn(3, 8)
    expected = model(x)
    repo = LocalLayerRepository(repo_path=variant_dir.parent, layer_name="MatmulLinear")
    for mode in (Mode.INFERENCE, Mode.TRAINING):
        with use_kernel_mapping({"PersistentMatmulLinearFallbackTest": {"cpu": repo}}, inherit_mapping=False):
            kernelize(model, device="cpu", mode=mode)
        assert model[0].forward.__func__ is pm.layers.MatmulLinear.forward
        assert torch.equal(model(x), expected)


# --- the linear_fwd op -------------------------------------------------------------------


def test_linear_fwd_is_registered_in_the_builds_namespace(pm, compile_mod):
    ns = sys.modules[pm.__name__ + "._ops"].add_op_namespace_prefix("linear_fwd")
    assert compile_mod.LINEAR_OP_NAME == ns
    assert str(compile_mod.linear_op._schema) == (
        f"{ns}(Tensor x, Tensor weight, Tensor? bias, str kernel) -> Tensor"
    )


def test_linear_fwd_has_fake_and_autograd_registrations(compile_mod):
    name = compile_mod.LINEAR_OP_NAME
    assert torch._C._dispatch_has_kernel_for_dispatch_key(name, "Meta")
    assert torch._C._dispatch_has_kernel_for_dispatch_key(name, "Autograd")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("x_shape", [(5, 8), (2, 3, 8), (8,), (0, 8)])
def test_fake_tensor_mode_gives_shape_and_dtype(compile_mod, dtype, bias, x_shape):
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(x_shape, dtype=dtype, device="cpu")
        w = torch.empty(6, 8, dtype=dtype)
        b = torch.empty(6, dtype=dtype) if bias else None
        y = compile_mod.linear_op(x, w, b, "auto")
    assert tuple(y.shape) == (*x_shape[:-1], 6)
    assert y.dtype == dtype


def test_meta_tensors_give_shape_and_dtype(pm):
    x = torch.empty(2, 3, 8, dtype=torch.bfloat16, device="meta")
    w = torch.empty(6, 8, dtype=torch.bfloat16, device="meta")
    b = torch.empty(6, dtype=torch.bfloat16, device="meta")
    y = pm.linear(x, w, b)
    assert y.device.type == "meta" and y.shape == (2, 3, 6) and y.dtype == torch.bfloat16


def test_meta_backward_gives_gradient_shapes(pm):
    x = torch.empty(2, 3, 8, device="meta", requires_grad=True)
    w = torch.empty(6, 8, device="meta", requires_grad=True)
    b = torch.empty(6, device="meta", requires_grad=True)
    gx, gw, gb = torch.autograd.grad(pm.linear(x, w, b).sum(), (x, w, b))
    assert gx.shape == x.shape and gw.shape == w.shape and gb.shape == b.shape


def test_autograd_formula_matches_f_linear_on_cpu(compile_mod):
    """The registered backward, called directly (CPU tensors go through torch's matmul)."""
    torch.manual_seed(0)
    x = torch.randn(2, 5, 4, dtype=torch.float64, requires_grad=True)
    w = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, dtype=torch.float64, requires_grad=True)
    grad = torch.randn(2, 5, 3, dtype=torch.float64)
    ctx = types.SimpleNamespace(needs_input_grad=(True, True, True, False))
    ctx.save_for_backward = lambda *ts: setattr(ctx, "saved_tensors", ts)
    compile_mod._setup_context(ctx, (x.detach(), w.detach(), b.detach(), "auto"), None)
    gx, gw, gb, gk = compile_mod._backward(ctx, grad)
    want = torch.autograd.grad(F.linear(x, w, b), (x, w, b), grad)
    assert gk is None
    for got, expected in zip((gx, gw, gb), want):
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


def test_dynamo_traces_linear_as_one_op_without_graph_breaks(pm, compile_mod):
    """torch.compile(fullgraph=True) captures pm.linear as a single linear_fwd node (the
    backend runs the graph on meta tensors, since the real kernel needs CUDA)."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)

        def run(*args):
            return gm(*[a.to("meta") if isinstance(a, torch.Tensor) else a for a in args])

        return run

    torch._dynamo.reset()
    fn = torch.compile(lambda x, w, b: pm.linear(x, w, b), backend=backend, fullgraph=True)
    y = fn(torch.randn(2, 3, 8), torch.randn(6, 8), torch.randn(6))
    assert y.shape == (2, 3, 6)
    assert len(graphs) == 1
    targets = [n.target for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert targets == [compile_mod.linear_op], targets
