"""transformers and diffusers models with their nn.Linear layers kernelized to MatmulLinear.

The models are built from configs (random weights, nothing downloaded) by
examples/transformers_llama.py and examples/diffusers_unet.py, which these
tests import. Without a GPU: the mapping replaces every Linear forward, the
fallback gives exactly the unkernelized output and our op is never called,
kernelize works in every mode, dynamo traces the kernelized model without
graph breaks. On the GPU (marked ``gpu``): the outputs stay within the
dtype's tolerance of torch's with our op called once per Linear call,
transformers' KernelConfig path, torch.compile(fullgraph=True), and a
training step whose gradients match torch's.
"""

from __future__ import annotations

import copy
import socket
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
import diffusers_unet as unet_example  # noqa: E402
import kernelize_linear as kl  # noqa: E402
import transformers_llama as llama_example  # noqa: E402
from kernels import LayerRepository, Mode  # noqa: E402

REPO_ID = "persistent-matmul/persistent-matmul"


@pytest.fixture(scope="module")
def build_dir(variant_dir) -> Path:
    return variant_dir.parent


@pytest.fixture
def no_network(monkeypatch):
    """Records every attempt to open a network connection; the test asserts there was none."""
    attempts = []

    def refuse(*args, **kwargs):
        attempts.append(args[1:] if args and isinstance(args[0], socket.socket) else args)
        raise OSError("network access refused by the test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    return attempts


def _dtype_id(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _llama_linear_count(config) -> int:
    return config.num_hidden_layers * 7 + 1  # q, k, v, o, gate, up, down per layer; lm_head


def _plain_linear_count(model: torch.nn.Module) -> int:
    return sum(1 for m in model.modules() if type(m) is torch.nn.Linear)


# --- marking -------------------------------------------------------------------------------


def test_mark_linears_marks_plain_linears_only_and_changes_nothing_else():
    class QuantLinear(torch.nn.Linear):  # a subclass with its own behaviour must be left alone
        pass

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), QuantLinear(16, 16),
                                torch.nn.Conv1d(1, 1, 1), torch.nn.Linear(16, 4, bias=False))
    x = torch.randn(3, 8)
    before_out = model[4](model[2](model[1](model[0](x))))
    before_state = {k: v.clone() for k, v in model.state_dict().items()}

    assert kl.mark_linears(model, include=lambda name, m: name != "4") == ["0"]
    assert kl.mark_linears(model) == ["0", "4"]
    assert [type(m).__name__ for m in model] == ["KernelizableLinear", "ReLU", "QuantLinear", "Conv1d",
                                                 "KernelizableLinear"]
    assert type(model[0]).kernel_layer_name == kl.LAYER_NAME == "MatmulLinear"
    assert not hasattr(QuantLinear, "kernel_layer_name") and not hasattr(torch.nn.Linear, "kernel_layer_name")
    state = model.state_dict()
    assert state.keys() == before_state.keys() and all(torch.equal(state[k], before_state[k]) for k in state)
    assert torch.equal(model[4](model[2](model[1](model[0](x)))), before_out)


def test_op_counter_counts_linear_fwd_calls_and_nothing_else(pm):
    """The GPU tests prove our op ran with count_op_calls: it must count each call of the op
    (meta tensors reach the fake kernel through the same dispatcher entry) and no other op."""
    x = torch.empty(4, 8, device="meta")
    w = torch.empty(6, 8, device="meta")
    name = kl.linear_op_name(pm)
    assert name.endswith("::linear_fwd") and torch._C._dispatch_has_kernel_for_dispatch_key(name, "Meta")
    with kl.count_op_calls(name) as ops:
        for _ in range(3):
            pm.linear(x, w)
        F.linear(x, w)
    assert ops.calls == 3
    with kl.count_op_calls(name) as ops:
        F.linear(torch.randn(2, 8), torch.randn(6, 8))
    assert ops.calls == 0


# --- transformers Llama on the CPU ------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=_dtype_id)
def test_llama_from_config_kernelized_on_cpu_gives_the_same_logits(build_dir, no_network, dtype):
    config = llama_example.llama_config()
    result = llama_example.compare_llama(config, build_dir=build_dir, device="cpu", dtype=dtype, seq=32)
    expected = _llama_linear_count(config)
    assert result.linear_modules == result.replaced == expected == 15
    assert result.linear_calls == expected
    assert result.op_calls == 0  # CPU tensors: MatmulLinear falls back to F.linear ...
    assert result.rel_error == 0.0  # ... which is exactly nn.Linear's forward
    assert no_network == []


def test_llama_kernelize_every_mode_on_cpu_keeps_outputs_and_gradients(build_dir, pm):
    config = llama_example.llama_config(num_hidden_layers=1)
    ids = llama_example.random_input_ids(config, 2, 16, device="cpu")
    reference = llama_example.build_llama(config, device="cpu", dtype=torch.float32).train()
    ref_loss = reference(input_ids=ids, labels=ids, use_cache=False).loss
    ref_loss.backward()
    for mode in (Mode.INFERENCE, Mode.TRAINING, Mode.INFERENCE | Mode.TORCH_COMPILE,
                 Mode.TRAINING | Mode.TORCH_COMPILE):
        model = llama_example.build_llama(config, device="cpu", dtype=torch.float32).train()
        replaced = kl.kernelize_linears(model, mode=mode, repository=kl.linear_repository(build_dir))
        assert len(replaced) == _llama_linear_count(config)
        assert all(model.get_submodule(n).forward.__func__ is pm.layers.MatmulLinear.forward for n in replaced)
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        assert torch.equal(loss, ref_loss), mode
        for (name, p), q in zip(model.named_parameters(), reference.parameters()):
            assert torch.equal(p.grad, q.grad), (mode, name)


def test_llama_kernelized_traces_without_graph_breaks_on_cpu(build_dir):
    config = llama_example.llama_config(num_hidden_layers=1)
    model = llama_example.build_llama(config, device="cpu", dtype=torch.float32)
    kl.kernelize_linears(model, mode=Mode.INFERENCE | Mode.TORCH_COMPILE, repository=kl.linear_repository(build_dir))
    ids = llama_example.random_input_ids(config, 1, 8, device="cpu")
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(model)(input_ids=ids, use_cache=False)
    torch._dynamo.reset()
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1


def test_layer_repository_through_local_kernels_works_offline(build_dir, repo_root, pm, no_network, monkeypatch):
    """LayerRepository by Hub id, resolved to this repo by LOCAL_KERNELS with no network:
    revision="v1" loads it; version=1 needs the Hub (or its cache) to list the versions."""
    monkeypatch.setenv("LOCAL_KERNELS", f"{REPO_ID}={repo_root}")
    repository = LayerRepository(REPO_ID, layer_name=kl.LAYER_NAME, revision="v1")
    config = llama_example.llama_config(num_hidden_layers=1)
    model = llama_example.build_llama(config, device="cpu", dtype=torch.float32)
    replaced = kl.kernelize_linears(model, mode=Mode.INFERENCE, repository=repository)
    assert len(replaced) == _llama_linear_count(config)
    assert model.lm_head.forward.__func__ is pm.layers.MatmulLinear.forward
    assert no_network == []


def test_kernel_config_needs_marked_linears_and_an_accelerator(build_dir):
    """transformers' KernelConfig with our local build: its check accepts the mapping once the
    Linear modules carry our layer name, and it maps accelerator devices only."""
    from transformers import KernelConfig

    config = llama_example.llama_config(num_hidden_layers=1)
    mapping = {kl.LAYER_NAME: f"{build_dir.resolve()}:{kl.LAYER_NAME}"}
    model = llama_example.build_llama(config, device="cpu", dtype=torch.float32)
    with pytest.raises(ValueError, match="not registered in the model"):
        KernelConfig(dict(mapping), use_local_kernel=True).sanitize_kernel_mapping(model)
    kl.mark_linears(model)
    kernel_config = KernelConfig(dict(mapping), use_local_kernel=True)
    kernel_config.sanitize_kernel_mapping(model)
    assert set(kernel_config.registered_layer_names.values()) >= {kl.LAYER_NAME}
    with pytest.raises(ValueError, match="got: cpu"):
        kernel_config.create_compatible_mapping(model)


def test_llama_example_script_on_cpu(build_dir, capsys):
    assert llama_example.main(["--build", str(build_dir), "--seq", "16", "--layers", "1"]) == 0
    out = capsys.readouterr().out
    assert "Linear modules: 8, running MatmulLinear: 8" in out
    assert "linear_fwd op calls: 0" in out and out.rstrip().endswith("OK")


# --- diffusers UNet on the CPU -----------------------------------------------------------


def test_unet_from_config_kernelized_on_cpu_gives_the_same_output(build_dir, no_network):
    config = unet_example.unet_config()
    expected = _plain_linear_count(unet_example.build_unet(config, device="cpu", dtype=torch.float32))
    result = unet_example.compare_unet(config, build_dir=build_dir, device="cpu", dtype=torch.float32)
    assert expected > 40  # attention q/k/v/out, feed-forward, time embedding, resnet time projections
    assert result.linear_modules == result.replaced == expected
    assert result.linear_calls == expected
    assert result.op_calls == 0
    assert result.rel_error == 0.0
    assert no_network == []


def test_diffusers_example_script_on_cpu(build_dir, capsys):
    assert unet_example.main(["--build", str(build_dir), "--size", "16", "--batch", "1"]) == 0
    out = capsys.readouterr().out
    assert "running MatmulLinear: 50" in out and out.rstrip().endswith("OK")


# --- scripts/integration_timing.py -------------------------------------------------------


def test_integration_timing_table_and_its_refusal_without_gpu():
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    import argparse

    import integration_timing

    result = kl.Comparison(rel_error=3e-3, linear_modules=29, replaced=29, linear_calls=29, op_calls=29,
                           ms_kernelized=20.0, ms_torch=10.0)
    row = {"model": "LlamaForCausalLM", "config": "hidden 4096", "inputs": "4 x 512 tokens", "tokens": 2048,
           "result": result, "tolerance": 2e-2}
    text = integration_timing.markdown([row], {"gpu": "NVIDIA H200", "torch": "2.11.0", "git_commit": "abc123"},
                                       argparse.Namespace(iters=10))
    assert "| LlamaForCausalLM | hidden 4096 | 4 x 512 tokens | 2048 | 20.00 | 10.00 | 0.50x | 3.00e-03 | 29 (29) |" \
        in text.splitlines()
    assert "- GPU: NVIDIA H200" in text and "- torch: 2.11.0" in text and "- Commit: abc123" in text
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit):
            integration_timing.main([])


# --- on the GPU --------------------------------------------------------------------------

# Normwise tolerances, kernelized against the unkernelized model in the same dtype. On the
# UNet, two correct bf16 linears (fp32 vs fp64 accumulation) already differ by ~1e-2: its
# norms and attention amplify single rounding flips, hence the wider bf16 bound.
LLAMA_TOL = llama_example.LOGITS_TOLERANCE
UNET_TOL = unet_example.OUTPUT_TOLERANCE
GRAD_TOL = {torch.float32: 1e-3, torch.bfloat16: 5e-2}


@pytest.fixture
def exact_fp32():
    """fp32 convolutions and matmuls in full fp32, not TF32 (cuDNN's default for convolutions):
    TF32's 10-bit rounding of each conv input would turn our kernel's last-bit differences
    from cuBLAS into differences far above the fp32 bounds."""
    # Saved and restored by hand: pytest's monkeypatch cannot restore these (the cuBLAS flag
    # lives behind a module __getattr__, which monkeypatch does not see).
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def _check_gpu_comparison(result, *, linear_count, tolerance, dtype):
    assert result.linear_modules == result.replaced == linear_count
    assert result.linear_calls == linear_count
    assert result.op_calls == result.linear_calls, "our linear_fwd op must run once per Linear call"
    assert result.rel_error <= tolerance, result
    if dtype != torch.float32:  # as accurate as torch against the same weights in fp32
        assert result.rel_error_fp32_kernelized <= 1.5 * result.rel_error_fp32_torch + 1e-3, result


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=_dtype_id)
def test_llama_logits_on_gpu_match_torch(build_dir, exact_fp32, dtype):
    config = llama_example.llama_config()
    result = llama_example.compare_llama(config, build_dir=build_dir, dtype=dtype, seq=128, fp32_reference=True)
    _check_gpu_comparison(result, linear_count=_llama_linear_count(config), tolerance=LLAMA_TOL[dtype], dtype=dtype)


@pytest.mark.gpu
def test_llama_kernel_config_path_on_gpu(build_dir):
    config = llama_example.llama_config()
    result = llama_example.compare_llama(config, build_dir=build_dir, dtype=torch.bfloat16, seq=128,
                                         how="kernel_config", fp32_reference=True)
    _check_gpu_comparison(result, linear_count=_llama_linear_count(config), tolerance=LLAMA_TOL[torch.bfloat16],
                          dtype=torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=_dtype_id)
def test_unet_output_on_gpu_matches_torch(build_dir, exact_fp32, dtype):
    config = unet_example.unet_config()
    count = _plain_linear_count(unet_example.build_unet(config, device="cpu", dtype=torch.float32))
    result = unet_example.compare_unet(config, build_dir=build_dir, dtype=dtype, size=32, fp32_reference=True)
    _check_gpu_comparison(result, linear_count=count, tolerance=UNET_TOL[dtype], dtype=dtype)


def _llama_case(dtype, training=False):
    config = llama_example.llama_config()
    model = llama_example.build_llama(config, dtype=dtype)
    ids = llama_example.random_input_ids(config, 2, 64)
    return model.train(training), (lambda m: m(input_ids=ids, use_cache=False).logits), _llama_linear_count(config)


def _unet_case(dtype, training=False):
    config = unet_example.unet_config()
    model = unet_example.build_unet(config, dtype=dtype)
    inputs = unet_example.unet_inputs(config, batch=2, size=16, dtype=dtype)
    return model.train(training), (lambda m: unet_example.predict(m, inputs)), _plain_linear_count(model)


CASES = {"llama": (_llama_case, LLAMA_TOL), "unet": (_unet_case, UNET_TOL)}


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(CASES))
def test_torch_compile_fullgraph_on_gpu_runs_our_op_without_graph_breaks(build_dir, pm, name):
    make_case, tol = CASES[name]
    model, forward, linear_count = make_case(torch.bfloat16)
    with torch.no_grad():
        reference = forward(model)
        replaced = kl.kernelize_linears(model, mode=Mode.INFERENCE | Mode.TORCH_COMPILE,
                                        repository=kl.linear_repository(build_dir))
        assert len(replaced) == linear_count
        eager = forward(model)
        torch._dynamo.reset()
        compiled = torch.compile(model, fullgraph=True)
        forward(compiled)  # compiles (the op's fake kernel runs while tracing: not counted below)
        with kl.count_op_calls(kl.linear_op_name(pm)) as ops:
            out = forward(compiled)
            torch.cuda.synchronize()
    assert ops.calls == linear_count, "the compiled graph must call our op once per Linear"
    # Twice the eager bound: inductor's fused bf16 elementwise code rounds differently from eager
    # on its own (with a torch linear on the CPU: 7e-3 on this Llama, 1.3e-2 on this UNet).
    assert kl.normwise_error(out, eager) <= 2 * tol[torch.bfloat16]
    assert kl.normwise_error(out, reference) <= 2 * tol[torch.bfloat16]
    torch._dynamo.reset()
    with torch.no_grad():
        explanation = torch._dynamo.explain(lambda: forward(model))()
    torch._dynamo.reset()
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1


def _loss(name, output):
    if name == "llama":  # next-token loss on fixed random targets
        target = torch.randint(0, output.shape[-1], output.shape[:-1], generator=torch.Generator().manual_seed(7))
        return F.cross_entropy(output.float().flatten(0, 1), target.to(output.device).flatten())
    target = torch.randn(output.shape, generator=torch.Generator().manual_seed(7)).to(output.device)
    return F.mse_loss(output.float(), target)


@pytest.mark.gpu
@pytest.mark.parametrize("name,dtype", [("llama", torch.float32), ("llama", torch.bfloat16), ("unet", torch.float32)],
                         ids=["llama-float32", "llama-bfloat16", "unet-float32"])
def test_training_step_on_gpu_matches_torch_gradients(build_dir, pm, exact_fp32, name, dtype):
    make_case, _ = CASES[name]
    model, forward, linear_count = make_case(dtype, training=True)
    reference = copy.deepcopy(model)
    ref_loss = _loss(name, forward(reference))
    ref_loss.backward()

    replaced = kl.kernelize_linears(model, mode=Mode.TRAINING, repository=kl.linear_repository(build_dir))
    assert len(replaced) == linear_count
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    input_needs_grad = []
    handles = [m.register_forward_hook(lambda mod, args, out: input_needs_grad.append(args[0].requires_grad))
               for m in linears]
    op = kl.linear_op_name(pm)
    with kl.count_op_calls(op) as forward_ops:
        loss = _loss(name, forward(model))
    for handle in handles:
        handle.remove()
    with kl.count_op_calls(op) as backward_ops:
        loss.backward()
        torch.cuda.synchronize()
    assert forward_ops.calls == len(input_needs_grad) == linear_count
    # backward: weight's gradient always, input's where the input needs one, each through our op
    assert backward_ops.calls == linear_count + sum(input_needs_grad)
    assert abs(loss.item() - ref_loss.item()) <= GRAD_TOL[dtype] * abs(ref_loss.item())
    compared = 0
    for (pname, p), q in zip(model.named_parameters(), reference.parameters()):
        assert (p.grad is None) == (q.grad is None), pname
        if p.grad is not None:
            assert kl.normwise_error(p.grad, q.grad) <= GRAD_TOL[dtype], pname
            compared += 1
    assert compared >= linear_count

    before = [m.weight.detach().clone() for m in linears]
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    # every Linear weight moves (bf16 norm weights of 1.0 may not: the step is below their ulp)
    assert all(not torch.equal(m.weight.detach(), b) for m, b in zip(linears, before))
    with torch.no_grad():
        assert _loss(name, forward(model)).item() < loss.item()
