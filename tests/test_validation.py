"""Argument validation of persistent_matmul, on a machine without a GPU.

Every check that needs no device runs before the device checks, so each bad
input below is rejected with its own message even though the tensors are on
the CPU. The module under test is the built variant, loaded by kernels
(the `pm` fixture), not the source directory.
"""

from __future__ import annotations

import re
import sys

import pytest
import torch

NO_CUDA = "no CUDA device is present"


@pytest.fixture(scope="module")
def validate(pm):
    """The package's `_validate` submodule, as kernels imported it."""
    mod = sys.modules[pm.__name__ + "._validate"]
    assert getattr(pm, "_validate", None) is mod
    return mod


@pytest.fixture(autouse=True)
def _no_gpu():
    if torch.cuda.is_available():
        pytest.skip("these tests describe behaviour on a machine without a CUDA device")


def t(*shape, dtype=torch.float32):
    return torch.zeros(shape, dtype=dtype)


# --- matmul: per-argument checks -------------------------------------------------


@pytest.mark.parametrize("name", ["a", "b"])
@pytest.mark.parametrize("bad", [[[1.0, 2.0]], 3.0, None], ids=["list", "float", "None"])
def test_matmul_non_tensor(pm, name, bad):
    args = {"a": t(2, 2), "b": t(2, 2)}
    args[name] = bad
    with pytest.raises(TypeError, match=rf"^{name} must be a torch\.Tensor, got {type(bad).__name__}$"):
        pm.matmul(args["a"], args["b"])


@pytest.mark.parametrize("name", ["a", "b"])
@pytest.mark.parametrize("shape", [(4,), (2, 4, 4), ()], ids=["1d", "3d", "0d"])
def test_matmul_wrong_ndim(pm, name, shape):
    args = {"a": t(4, 4), "b": t(4, 4)}
    args[name] = t(*shape)
    msg = rf"^{name} must be 2-D, got a {len(shape)}-D tensor of shape {re.escape(str(tuple(shape)))}$"
    with pytest.raises(ValueError, match=msg):
        pm.matmul(args["a"], args["b"])


@pytest.mark.parametrize("name", ["a", "b"])
@pytest.mark.parametrize("dtype", [torch.int32, torch.float64, torch.bool, torch.complex64])
def test_matmul_unsupported_dtype(pm, name, dtype):
    args = {"a": t(2, 2), "b": t(2, 2)}
    args[name] = t(2, 2, dtype=dtype)
    msg = rf"^{name} has dtype {re.escape(str(dtype))}; supported dtypes are float32, float16, bfloat16$"
    with pytest.raises(TypeError, match=msg):
        pm.matmul(args["a"], args["b"])


def test_matmul_size_over_int32(pm):
    # An expanded tensor: 2**31 rows, no memory.
    huge = torch.zeros(1, 2).expand(2**31, 2)
    with pytest.raises(ValueError, match=r"^a has size 2147483648 in dim 0; at most 2147483647 is supported$"):
        pm.matmul(huge, t(2, 2))
    with pytest.raises(ValueError, match=r"^b has size 2147483648 in dim 0"):
        pm.matmul(t(2, 2), torch.zeros(1, 2).expand(2**31, 2))


def test_matmul_mixed_dtypes(pm):
    with pytest.raises(TypeError, match=r"^mixed dtypes are not supported: a is torch\.float16, b is torch\.bfloat16$"):
        pm.matmul(t(2, 3, dtype=torch.float16), t(3, 2, dtype=torch.bfloat16))


def test_matmul_inner_dims_differ(pm):
    with pytest.raises(ValueError, match=r"^inner dimensions differ: a is 2x3 and b is 4x5$"):
        pm.matmul(t(2, 3), t(4, 5))


@pytest.mark.parametrize("kernel", ["fast", "Naive", "", "auto "])
def test_matmul_unknown_kernel(pm, kernel):
    choices = ", ".join(["auto", *pm.KERNELS])
    assert "naive" in pm.KERNELS
    msg = rf"^unknown kernel {re.escape(repr(kernel))}; choose one of: {re.escape(choices)}$"
    with pytest.raises(ValueError, match=msg):
        pm.matmul(t(2, 2), t(2, 2), kernel=kernel)


@pytest.mark.parametrize("kernel", [None, 0, ["naive"], b"naive"])
def test_matmul_kernel_not_str(pm, kernel):
    msg = rf"^kernel must be a str \(one of: auto, .*\), got {type(kernel).__name__}$"
    with pytest.raises(TypeError, match=msg):
        pm.matmul(t(2, 2), t(2, 2), kernel=kernel)


# --- matmul: out ---------------------------------------------------------------


def test_out_not_tensor(pm):
    with pytest.raises(TypeError, match=r"^out must be a torch\.Tensor, got list$"):
        pm.matmul(t(2, 3), t(3, 4), out=[[0.0] * 4] * 2)


@pytest.mark.parametrize("shape", [(4, 2), (2, 4, 1), (8,)])
def test_out_wrong_shape(pm, shape):
    msg = rf"^out has shape {re.escape(str(shape))}, expected \(2, 4\)$"
    with pytest.raises(ValueError, match=msg):
        pm.matmul(t(2, 3), t(3, 4), out=t(*shape))


def test_out_wrong_dtype(pm):
    msg = r"^out has dtype torch\.float16, expected torch\.float32 \(the dtype of the inputs\)$"
    with pytest.raises(TypeError, match=msg):
        pm.matmul(t(2, 3), t(3, 4), out=t(2, 4, dtype=torch.float16))


def test_out_wrong_device(pm):
    """out's device is checked with the inputs': here, no CUDA device, and each one named."""
    out = torch.empty(2, 4, device="meta")
    with pytest.raises(RuntimeError, match=r"no CUDA device is present .*a is on cpu, b is on cpu, out is on meta"):
        pm.matmul(t(2, 3), t(3, 4), out=out)


def test_out_internal_overlap(pm):
    out = torch.zeros(1, 4).expand(2, 4)
    with pytest.raises(ValueError, match=r"^out has overlapping elements \(strides \(0, 1\)\); it cannot be written$"):
        pm.matmul(t(2, 3), t(3, 4), out=out)


def test_out_is_a(pm):
    a, b = t(3, 3), t(3, 3)
    with pytest.raises(ValueError, match=r"^out overlaps a in memory; pass an out that shares no memory"):
        pm.matmul(a, b, out=a)


def test_out_is_view_of_a(pm):
    storage = torch.zeros(4, 3)
    a = storage[:2, :]  # 2x3
    out = storage[1:3, :2]  # 2x2, shares row 1 with a
    with pytest.raises(ValueError, match=r"^out overlaps a in memory"):
        pm.matmul(a, t(3, 2), out=out)


def test_out_overlaps_b_transposed(pm):
    b = t(3, 3)
    with pytest.raises(ValueError, match=r"^out overlaps b in memory"):
        pm.matmul(t(3, 3), b, out=b.t())


def test_empty_expanded_out_is_not_overlapping(pm):
    out = torch.zeros(1, 0).expand(3, 0)
    with pytest.raises(RuntimeError, match=NO_CUDA):
        pm.matmul(t(3, 2), t(2, 0), out=out)


def test_out_disjoint_from_inputs_reaches_device_check(pm):
    """An out in the same storage as a but disjoint from it passes the out checks."""
    storage = torch.zeros(4, 3)
    a, out = storage[:2], storage[2:]
    with pytest.raises(RuntimeError, match=NO_CUDA):
        pm.matmul(a, t(3, 3), out=out)


# --- linear --------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(12,), (3, 4, 1)])
def test_linear_weight_not_2d(pm, shape):
    msg = rf"^weight must be 2-D, got a {len(shape)}-D tensor of shape {re.escape(str(shape))}$"
    with pytest.raises(ValueError, match=msg):
        pm.linear(t(2, 4), t(*shape))


def test_linear_x_zero_dim(pm):
    with pytest.raises(ValueError, match=r"^x must be 1-D or 2-D or .* or 8-D, got a 0-D tensor"):
        pm.linear(torch.tensor(1.0), t(3, 4))


def test_linear_x_not_tensor(pm):
    with pytest.raises(TypeError, match=r"^x must be a torch\.Tensor, got list$"):
        pm.linear([1.0, 2.0], t(3, 2))


@pytest.mark.parametrize("x_shape", [(2, 5), (5,), (2, 3, 5)])
def test_linear_in_features_mismatch(pm, x_shape):
    msg = r"^x has 5 features in its last dim but weight is 3x4 \(out_features x in_features\)$"
    with pytest.raises(ValueError, match=msg):
        pm.linear(t(*x_shape), t(3, 4))


@pytest.mark.parametrize("n", [2, 4, 1])
def test_linear_bias_wrong_length(pm, n):
    with pytest.raises(ValueError, match=rf"^bias has {n} elements but weight has 3 rows$"):
        pm.linear(t(2, 4), t(3, 4), t(n))


def test_linear_bias_not_1d(pm):
    with pytest.raises(ValueError, match=r"^bias must be 1-D, got a 2-D tensor of shape \(1, 3\)$"):
        pm.linear(t(2, 4), t(3, 4), t(1, 3))


def test_linear_bias_mixed_dtype(pm):
    with pytest.raises(TypeError, match=r"mixed dtypes are not supported: .*bias is torch\.float16"):
        pm.linear(t(2, 4), t(3, 4), t(3, dtype=torch.float16))


def test_linear_mixed_dtype_names_x_and_weight(pm):
    with pytest.raises(TypeError, match=r"x is torch\.float16, weight is torch\.bfloat16"):
        pm.linear(t(2, 4, dtype=torch.float16), t(3, 4, dtype=torch.bfloat16))


# --- device checks, after all structural checks --------------------------------


@pytest.mark.parametrize("kernel", ["auto", "naive"])
def test_matmul_cpu_tensors_no_cuda(pm, kernel):
    msg = rf"needs a CUDA device, and {NO_CUDA} .*a is on cpu, b is on cpu"
    with pytest.raises(RuntimeError, match=msg):
        pm.matmul(t(2, 3), t(3, 4), kernel=kernel)


def test_matmul_cpu_with_out_no_cuda(pm):
    with pytest.raises(RuntimeError, match=rf"{NO_CUDA} .*out is on cpu"):
        pm.matmul(t(2, 3), t(3, 4), out=t(2, 4))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_linear_cpu_tensors_no_cuda(pm, dtype):
    with pytest.raises(RuntimeError, match=rf"{NO_CUDA}.*bias is on cpu"):
        pm.linear(t(2, 4, dtype=dtype), t(3, 4, dtype=dtype), t(3, dtype=dtype))


def test_empty_inputs_still_need_cuda(pm):
    with pytest.raises(RuntimeError, match=NO_CUDA):
        pm.matmul(t(0, 3), t(3, 4))
    with pytest.raises(RuntimeError, match=NO_CUDA):
        pm.matmul(t(2, 0), t(0, 4))


def test_cpu_tensor_rejected_when_cuda_claims_present(pm, monkeypatch):
    """The next device check: with CUDA 'present', CPU tensors are named as not on CUDA."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(ValueError, match=r"^a is on cpu; persistent_matmul takes CUDA tensors only$"):
        pm.matmul(t(2, 3), t(3, 4))


# --- available_kernels ---------------------------------------------------------


@pytest.mark.parametrize("device", [None, 0, torch.device("cuda")], ids=["default", "int", "device"])
def test_available_kernels_no_gpu(pm, device):
    avail = pm.available_kernels(device)
    assert "naive" in avail
    assert tuple(avail) == tuple(pm.KERNELS)
    for name, info in avail.items():
        assert isinstance(info, pm.KernelAvailability)
        assert info.name == name
        assert info.available is False
        assert NO_CUDA in info.reason
        assert info.dtypes and set(info.dtypes) <= {torch.float32, torch.float16, torch.bfloat16}
    assert set(avail["naive"].dtypes) == {torch.float32, torch.float16, torch.bfloat16}


def test_public_api(pm):
    assert {"KERNELS", "available_kernels", "layers", "linear", "matmul"} <= set(pm.__all__)
    for name in pm.__all__:
        assert hasattr(pm, name), name


# --- _validate.overlaps / has_internal_overlap ---------------------------------


def _overlap_cases():
    buf = torch.zeros(16)
    m = torch.zeros(4, 4)
    other = torch.zeros(16)
    return [
        ("same tensor", buf, buf, True),
        ("disjoint slices", buf[:8], buf[8:], False),
        ("adjacent, no shared element", buf[:4], buf[4:5], False),
        ("sharing one element", buf[:5], buf[4:], True),
        ("contained slice", buf, buf[3:7], True),
        ("separate storages", buf, other, False),
        ("tensor and its transpose", m, m.t(), True),
        ("disjoint row blocks", m[:2], m[2:], False),
        ("disjoint rows", m[0], m[3], False),
        # Conservative: byte ranges intersect though no element is shared.
        ("interleaved columns", m[:, :2], m[:, 2:], True),
        ("interleaved even/odd", buf[0::2], buf[1::2], True),
        ("empty tensor", torch.zeros(0), buf, False),
        ("empty slice of same storage", buf[4:4], buf, False),
        ("expanded view of buf", buf[:1].expand(4, 3), buf[0:1], True),
        ("different devices", buf, torch.zeros(16, device="meta"), False),
    ]


@pytest.mark.parametrize("case", _overlap_cases(), ids=lambda c: c[0])
def test_overlaps(validate, case):
    _, x, y, expected = case
    assert validate.overlaps(x, y) is expected
    assert validate.overlaps(y, x) is expected


def _internal_cases():
    m = torch.zeros(4, 6)
    return [
        ("contiguous", m, False),
        ("transposed", m.t(), False),
        ("column slice", m[:, ::2], False),
        ("row slice, transposed", m[1:3].t(), False),
        ("expanded row", torch.zeros(1, 4).expand(3, 4), True),
        ("expanded scalar", torch.tensor(1.0).expand(5), True),
        ("expanded column", torch.zeros(4, 1).expand(4, 3), True),
        ("size-1 dim with stride 0", torch.zeros(4).unsqueeze(0).expand(1, 4), False),
        ("empty", torch.zeros(0, 4), False),
        ("empty expanded", torch.zeros(1, 0).expand(3, 0), False),
        ("single element", torch.zeros(1, 1), False),
        ("sliding window", torch.zeros(8).as_strided((3, 3), (1, 1)), True),
        ("unfold with overlap", torch.zeros(10).unfold(0, 4, 2), True),
        ("unfold without overlap", torch.zeros(12).unfold(0, 4, 4), False),
    ]


@pytest.mark.parametrize("case", _internal_cases(), ids=lambda c: c[0])
def test_has_internal_overlap(validate, case):
    _, x, expected = case
    assert validate.has_internal_overlap(x) is expected
    # torch's own answer, where it has one (0: no overlap, 1: overlap, 2: too hard).
    verdict = torch._debug_has_internal_overlap(x)
    if verdict in (0, 1):
        assert bool(verdict) is expected


# --- layers.MatmulLinear -------------------------------------------------------


def test_matmul_linear_passes_kernels_layer_validation(pm):
    from kernels.layer.layer import _validate_layer, _validate_layer_has_mode
    from kernels import Mode

    layer = pm.layers.MatmulLinear
    _validate_layer(check_cls=torch.nn.Linear, cls=layer, repo="persistent-matmul (local build)")
    # linear_fwd has fake and autograd registrations: every mode is accepted.
    for mode in (Mode.INFERENCE, Mode.TRAINING, Mode.INFERENCE | Mode.TORCH_COMPILE):
        assert _validate_layer_has_mode(layer_name="Linear", module=layer, repo="r", repo_mode=mode)


def test_kernelize_replaces_linear_forward(pm, variant_dir):
    """kernelize swaps in MatmulLinear.forward (mapped for 'cpu' so no GPU is needed to resolve it);
    on CPU tensors it falls back to torch.nn.functional.linear."""
    from kernels import LocalLayerRepository, Mode, kernelize, use_kernel_forward_from_hub, use_kernel_mapping

    @use_kernel_forward_from_hub("PersistentMatmulLinearTest")
    class Linear(torch.nn.Linear):
        pass

    model = torch.nn.Sequential(Linear(4, 3))
    x = torch.randn(2, 4)
    expected = model(x)  # the original forward runs on CPU
    repo = LocalLayerRepository(repo_path=variant_dir.parent, layer_name="MatmulLinear")
    with use_kernel_mapping({"PersistentMatmulLinearTest": {"cpu": repo}}, inherit_mapping=False):
        kernelize(model, device="cpu", mode=Mode.INFERENCE)
    assert model[0].forward.__func__ is pm.layers.MatmulLinear.forward
    assert torch.equal(model(x), expected)


# --- matmul_timeline --------------------------------------------------------------


def test_timeline_unknown_tile_order(pm):
    with pytest.raises(ValueError, match=r"^unknown tile_order 'spiral'; choose one of: grouped, hilbert, dynamic, split_tail$"):
        pm.matmul_timeline(t(4, 4, dtype=torch.bfloat16), t(4, 4, dtype=torch.bfloat16), tile_order="spiral")


TIMELINE_RUNGS = "tiled, persistent, wgmma, wgmma_persistent, wgmma_streamk"


def test_timeline_needs_an_instrumented_rung(pm):
    for kernel in ("naive", "splitk"):
        with pytest.raises(ValueError, match=rf"^kernel '{kernel}' has no instrumented build; choose one of: "
                                             rf"{TIMELINE_RUNGS}$"):
            pm.matmul_timeline(t(4, 4), t(4, 4), kernel=kernel)


def test_timeline_columns_are_the_parts_of_tiles(pm):
    """A row per unit of work: the tile, the K-range it summed, where and when it ran."""
    assert pm.TIMELINE_COLUMNS == ("tile_m", "tile_n", "k_begin", "k_end", "sm", "cta", "start_ns", "end_ns")
    assert {n for n, r in pm._rungs.RUNGS.items() if r.has_timeline} == set(TIMELINE_RUNGS.split(", "))


@pytest.mark.parametrize("a_shape, b_shape", [((0, 4), (4, 4)), ((4, 0), (0, 4)), ((4, 4), (4, 0))])
def test_timeline_needs_nonempty_operands(pm, a_shape, b_shape):
    with pytest.raises(ValueError, match=r"^matmul_timeline needs M, N and K >= 1"):
        pm.matmul_timeline(t(*a_shape, dtype=torch.bfloat16), t(*b_shape, dtype=torch.bfloat16))


@pytest.mark.parametrize("kernel", TIMELINE_RUNGS.split(", "))
def test_timeline_on_cpu_says_no_cuda_device(pm, kernel):
    with pytest.raises(RuntimeError, match=NO_CUDA):
        pm.matmul_timeline(t(4, 4, dtype=torch.bfloat16), t(4, 4, dtype=torch.bfloat16), kernel=kernel)


def test_tile_config_op_rejects_negative_sizes_and_a_missing_device(pm):
    with pytest.raises(RuntimeError, match=r"tile_config needs m, n >= 0"):
        pm._matmul.ops.tile_config(-1, 4, 0)
    with pytest.raises(RuntimeError, match=r"tile_config needs a CUDA device; cuda:0 is not present"):
        pm._matmul.ops.tile_config(4, 4, 0)
    for kernel in ("wgmma", "wgmma_streamk"):  # the Hopper rungs' configurations
        with pytest.raises(RuntimeError, match=r"tile_config needs a CUDA device; cuda:0 is not present"):
            pm._matmul.ops.tile_config(4, 4, 0, kernel, 4096)
    # The op names the rungs with tiles before it needs a device.
    for kernel in ("splitk", "naive", "auto", "wgmma2"):
        with pytest.raises(RuntimeError, match=rf"kernel '{kernel}' has no tile configuration; choose one of: "
                                               rf"{TIMELINE_RUNGS}$"):
            pm._matmul.ops.tile_config(4, 4, 0, kernel)


def test_tile_config_names_the_rungs_that_have_one(pm):
    for kernel in ("naive", "warptiled", "splitk", "auto"):
        with pytest.raises(ValueError, match=rf"^kernel '{kernel}' has no tile configuration; choose one of: "
                                             rf"{TIMELINE_RUNGS}$"):
            pm.tile_config(64, 64, 0, kernel=kernel)
    with pytest.raises(ValueError, match=r"unknown kernel 'wgmma2'"):
        pm.tile_config(64, 64, 0, kernel="wgmma2")


@pytest.mark.parametrize(("k", "error", "message"), [
    (0, ValueError, r"^k must be None or at least 1, got 0$"),
    (-5, ValueError, r"^k must be None or at least 1, got -5$"),
    (4096.0, TypeError, r"^k must be None or an int, got float$"),
    (True, TypeError, r"^k must be None or an int, got bool$"),
])
def test_tile_config_checks_k(pm, k, error, message):
    """wgmma_streamk's grid depends on K, which tile_config takes as ``k``."""
    with pytest.raises(error, match=message):
        pm.tile_config(16, 4096, 0, kernel="wgmma_streamk", k=k)


@pytest.mark.parametrize(("kernel", "cluster_size", "error", "message"), [
    ("wgmma_persistent", 3, ValueError, r"^cluster_size must be None \(the kernel picks\), 1 or 2, got 3$"),
    ("wgmma_persistent", "2", TypeError, r"^cluster_size must be None, 1 or 2, got str$"),
    ("wgmma_streamk", 2, ValueError, r"^kernel 'wgmma_streamk' takes cluster_size 1 \(or None: the kernel picks\), got 2$"),
    ("tiled", 1, ValueError, r"^kernel 'tiled' takes no cluster_size; the rungs that do: wgmma_persistent, wgmma_streamk$"),
])
def test_tile_config_and_timeline_check_cluster_size(pm, kernel, cluster_size, error, message):
    """tile_config and matmul_timeline take matmul's cluster_size, refused as matmul refuses
    it, before they need a device."""
    with pytest.raises(error, match=message):
        pm.tile_config(64, 64, 0, kernel=kernel, k=64, cluster_size=cluster_size)
    a = t(4, 4, dtype=torch.bfloat16)
    with pytest.raises(error, match=message):
        pm.matmul_timeline(a, a, kernel=kernel, cluster_size=cluster_size)


def test_tile_config_op_checks_cluster_size_before_the_device(pm):
    tile_config = pm._matmul.ops.tile_config
    with pytest.raises(RuntimeError, match=r"cluster_size must be 0 \(the kernel picks\), 1 or 2, got 3"):
        tile_config(4, 4, 0, "wgmma_persistent", 0, 3)
    with pytest.raises(RuntimeError, match=r"kernel 'tiled' takes no cluster_size \(0\), got 1"):
        tile_config(4, 4, 0, "tiled", 0, 1)
    with pytest.raises(RuntimeError, match=r"kernel 'wgmma_streamk' takes cluster_size 1 .* got 2"):
        tile_config(4, 4, 0, "wgmma_streamk", 4096, 2)
    for kernel, clusters in (("wgmma_streamk", 1), ("wgmma_persistent", 1), ("wgmma_persistent", 2)):
        with pytest.raises(RuntimeError, match=r"tile_config needs a CUDA device; cuda:0 is not present"):
            tile_config(4, 4, 0, kernel, 4096, clusters)


def test_tile_config_of_wgmma_streamk_asks_the_device(pm):
    """With a good k, wgmma_streamk's configuration goes to the op, which needs a device."""
    with pytest.raises(RuntimeError, match=r"tile_config needs a CUDA device; cuda:0 is not present"):
        pm.tile_config(16, 4096, 0, kernel="wgmma_streamk", k=4096)
