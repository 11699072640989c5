"""GPU correctness tests of persistent_matmul's ``matmul`` and ``linear``, for every rung
of the build (``KERNELS``) that runs on the GPU at hand, with each dtype it takes.

Protocol (helpers in matmul_checks.py): random normal inputs compared with an fp64
product of the same rounded inputs by normwise relative error, under bf16 1e-2, fp16
2e-3, fp32 1e-4; small-integer inputs that must give bit-exact results; outputs
poisoned with NaN first.
Inputs are fresh every run: each test draws a random seed, prints it (pytest shows it
with a failure) and names it in its assertion messages.

Run on a machine with a CUDA GPU: ``python -m pytest -m gpu tests``. Without one,
conftest.py skips these tests.
"""

from __future__ import annotations

import secrets

import pytest
import torch

from matmul_checks import (
    DTYPE_NAMES,
    TOLERANCE,
    check_exact,
    exact_int_bias,
    exact_int_operands,
    matmul_error,
    nan_count,
    poison,
    random_operands,
)

pytestmark = pytest.mark.gpu

DEVICE = "cuda"

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
DTYPE_IDS = [DTYPE_NAMES[d] for d in DTYPES]
# (a transposed, b transposed): transposed operands reach the kernel as strided views.
TRANSPOSES = [(False, False), (True, False), (False, True), (True, True)]
TRANSPOSE_IDS = ["a.b", "aT.b", "a.bT", "aT.bT"]

MN_SIZES = [1, 7, 64, 65, 129]
K_SIZES = [1, 8, 65, 257]
# Bit-exact cases: long K (4104 is not a multiple of common tile depths), tails in M and N.
EXACT_SHAPES = [(1, 1, 1), (7, 65, 8), (64, 64, 257), (129, 129, 1), (1, 129, 4104),
                (129, 1, 4104), (65, 129, 4104), (129, 129, 4104)]


@pytest.fixture(scope="module")
def rungs(pm) -> dict[str, tuple[torch.dtype, ...]]:
    """The rungs that run on this GPU, each with the dtypes it takes; at least one must run."""
    available = pm.available_kernels()
    runnable = {name: tuple(info.dtypes) for name, info in available.items() if info.available}
    reasons = {name: info.reason for name, info in available.items()}
    assert runnable, f"no kernel rung runs on this GPU: {reasons}"
    return runnable


def taking(rungs: dict, dtype: torch.dtype) -> list[str]:
    """The rungs among ``rungs`` that take ``dtype``."""
    return [name for name, dtypes in rungs.items() if dtype in dtypes]


@pytest.fixture
def gen() -> torch.Generator:
    """A CUDA generator with a fresh random seed, printed so a failure can be replayed."""
    seed = secrets.randbits(63)
    print(f"random seed: {seed}")
    return torch.Generator(device=DEVICE).manual_seed(seed)


def _report(failures: list[str], gen: torch.Generator) -> str:
    shown = "\n".join(failures[:40])
    more = f"\n... and {len(failures) - 40} more" if len(failures) > 40 else ""
    return f"{len(failures)} case(s) failed (seed {gen.initial_seed()}):\n{shown}{more}"


# --------------------------------------------------------------------------- matmul


@pytest.mark.parametrize("transposes", TRANSPOSES, ids=TRANSPOSE_IDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_random_inputs_within_tolerance(pm, rungs, gen, dtype, transposes):
    """Every shape of MN_SIZES x MN_SIZES x K_SIZES: error under the bound, every element written."""
    a_t, b_t = transposes
    failures = []
    for rung in taking(rungs, dtype):
        for m in MN_SIZES:
            for n in MN_SIZES:
                for k in K_SIZES:
                    a, b = random_operands(m, n, k, dtype, DEVICE, a_t, b_t, generator=gen)
                    out = poison(torch.empty(m, n, dtype=dtype, device=DEVICE))
                    pm.matmul(a, b, kernel=rung, out=out)
                    err, nans = matmul_error(out, a, b), nan_count(out)
                    if nans or not err < TOLERANCE[dtype]:
                        failures.append(f"{rung} m={m} n={n} k={k}: rel error {err:.3g} "
                                        f"(bound {TOLERANCE[dtype]:g}), {nans} NaN")
    assert not failures, _report(failures, gen)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_allocated_output_and_auto_kernel(pm, rungs, gen, dtype):
    """Without ``out`` the result is a new tensor of the inputs' dtype and device;
    ``kernel="auto"`` (the default) computes the same product."""
    a, b = random_operands(129, 65, 257, dtype, DEVICE, generator=gen)
    for kernel in [*taking(rungs, dtype), "auto"]:
        result = pm.matmul(a, b, kernel=kernel)
        assert result.shape == (129, 65) and result.dtype == dtype and result.device == a.device
        err = matmul_error(result, a, b)
        assert err < TOLERANCE[dtype], f"kernel={kernel}: rel error {err:.3g} (seed {gen.initial_seed()})"
    assert matmul_error(pm.matmul(a, b), a, b) < TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_small_integers_bit_exact(pm, rungs, gen, dtype):
    """Inputs whose product is exact in fp32 and in ``dtype``: the output must equal it bit for bit."""
    failures = []
    for rung in taking(rungs, dtype):
        for m, n, k in EXACT_SHAPES:
            for (a_t, b_t), label in zip(TRANSPOSES, TRANSPOSE_IDS):
                a, b = exact_int_operands(m, n, k, dtype, DEVICE, a_t, b_t, generator=gen)
                out = poison(torch.empty(m, n, dtype=dtype, device=DEVICE))
                pm.matmul(a, b, kernel=rung, out=out)
                bad = check_exact(out, a, b)
                if bad:
                    failures.append(f"{rung} m={m} n={n} k={k} {label}: {bad} of {m * n} elements differ")
    assert not failures, _report(failures, gen)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_out_is_written_in_place_and_returned(pm, rungs, gen, dtype):
    for rung in taking(rungs, dtype):
        a, b = exact_int_operands(65, 129, 257, dtype, DEVICE, generator=gen)
        out = poison(torch.empty(65, 129, dtype=dtype, device=DEVICE))
        result = pm.matmul(a, b, kernel=rung, out=out)
        assert result is out or result.data_ptr() == out.data_ptr(), f"{rung}: out was not returned"
        assert check_exact(out, a, b) == 0, f"{rung}: wrong values in out (seed {gen.initial_seed()})"


def _strided_outs(m: int, n: int, dtype):
    """(buffer, out view) pairs: out is an m x n view with non-trivial strides into a
    larger poisoned buffer."""
    # A transposed slice: column-major out with a padded leading dimension.
    buffer = poison(torch.empty(n + 3, m + 5, dtype=dtype, device=DEVICE))
    yield "transposed slice", buffer, lambda t: t[:n, :m].t()
    # Every other row and every third column, offset from the start.
    buffer = poison(torch.empty(2 * m + 1, 3 * n + 2, dtype=dtype, device=DEVICE))
    yield "row/column steps", buffer, lambda t: t[1::2, 2::3][:m, :n]
    # Contiguous rows inside a wider buffer, every row start 16-byte aligned: the
    # layout the Hopper rungs store with TMA, whose boxes overhang the view's edges.
    width = (n + 8 + 64 + 7) // 8 * 8
    buffer = poison(torch.empty(m + 2, width, dtype=dtype, device=DEVICE))
    yield "aligned rows in a wider buffer", buffer, lambda t: t[1:m + 1, 8:8 + n]


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shape", [(65, 129, 257), (1, 7, 65), (129, 1, 8)], ids=str)
def test_strided_out_gets_values_and_the_rest_stays_untouched(pm, rungs, gen, dtype, shape):
    m, n, k = shape
    for rung in taking(rungs, dtype):
        for label, buffer, view in _strided_outs(m, n, dtype):
            a, b = exact_int_operands(m, n, k, dtype, DEVICE, generator=gen)
            out = view(buffer)
            assert out.shape == (m, n)
            result = pm.matmul(a, b, kernel=rung, out=out)
            assert result.data_ptr() == out.data_ptr() and result.stride() == out.stride()
            assert check_exact(out, a, b) == 0, f"{rung}, {label}: wrong values (seed {gen.initial_seed()})"
            written = torch.zeros(buffer.shape, dtype=torch.bool, device=DEVICE)
            view(written).fill_(True)
            untouched = buffer[~written]
            assert torch.isnan(untouched).all(), (
                f"{rung}, {label}: {int((~torch.isnan(untouched)).sum())} elements outside out were written"
            )


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_empty_dimensions(pm, rungs, dtype):
    """M = 0 or N = 0: an empty result; K = 0: the empty sum, zeros (also into a poisoned out)."""
    for rung in taking(rungs, dtype):
        for m, n in [(0, 5), (5, 0), (0, 0)]:
            a = torch.randn(m, 7, device=DEVICE).to(dtype)
            b = torch.randn(7, n, device=DEVICE).to(dtype)
            result = pm.matmul(a, b, kernel=rung)
            assert result.shape == (m, n) and result.dtype == dtype
            out = torch.empty(m, n, dtype=dtype, device=DEVICE)
            assert pm.matmul(a, b, kernel=rung, out=out).shape == (m, n)
        a = torch.empty(6, 0, dtype=dtype, device=DEVICE)
        b = torch.empty(0, 9, dtype=dtype, device=DEVICE)
        result = pm.matmul(a, b, kernel=rung)
        assert result.shape == (6, 9) and torch.equal(result, torch.zeros_like(result)), f"{rung}: K=0"
        out = poison(torch.empty(6, 9, dtype=dtype, device=DEVICE))
        result = pm.matmul(a, b, kernel=rung, out=out)
        assert result.data_ptr() == out.data_ptr() and torch.equal(out, torch.zeros_like(out)), f"{rung}: K=0 out"


# --------------------------------------------------------------------------- linear


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_linear_matches_fp64_reference(pm, rungs, gen, dtype):
    """``x @ weight.T + bias`` for 1-D to 4-D x, with and without bias."""
    failures = []
    for rung in taking(rungs, dtype):
        for lead in [(), (7,), (2, 5), (3, 1, 4)]:
            for k, n in [(1, 7), (65, 129), (257, 64)]:
                x = torch.randn(*lead, k, device=DEVICE, generator=gen).to(dtype)
                weight = torch.randn(n, k, device=DEVICE, generator=gen).to(dtype)
                bias = torch.randn(n, device=DEVICE, generator=gen).to(dtype)
                for b in (bias, None):
                    y = pm.linear(x, weight, b, kernel=rung)
                    err = matmul_error(y, x.reshape(-1, k), weight.t(), b)
                    if y.shape != (*lead, n) or y.dtype != dtype or not err < TOLERANCE[dtype]:
                        failures.append(f"{rung} x{tuple(x.shape)} weight{tuple(weight.shape)} "
                                        f"bias={b is not None}: shape {tuple(y.shape)}, rel error {err:.3g}")
    assert not failures, _report(failures, gen)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_linear_small_integers_with_bias_bit_exact(pm, rungs, gen, dtype):
    for rung in taking(rungs, dtype):
        for m, n, k in [(1, 1, 1), (65, 129, 4104), (129, 7, 65)]:
            a, w_t = exact_int_operands(m, n, k, dtype, DEVICE, b_transposed=True, generator=gen, headroom=1)
            bias = exact_int_bias(n, dtype, DEVICE, generator=gen)
            y = pm.linear(a.reshape(1, m, k), w_t.t(), bias, kernel=rung)
            assert check_exact(y.reshape(m, n), a, w_t, bias) == 0, (
                f"{rung} m={m} n={n} k={k} (seed {gen.initial_seed()})"
            )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_linear_adds_bias_before_rounding(pm, rungs, dtype):
    """The sum K + bias is rounded once. K = 257 (bf16) or 2049 (fp16) ones is a tie
    that rounds down to 256 / 2048; rounding it before adding a bias of -1 would then
    give 255 / 2047 instead of the exact 256 / 2048."""
    k = 257 if dtype == torch.bfloat16 else 2049
    x = torch.ones(3, k, dtype=dtype, device=DEVICE)
    weight = torch.ones(5, k, dtype=dtype, device=DEVICE)
    bias = torch.full((5,), -1.0, dtype=dtype, device=DEVICE)
    expected = torch.full((3, 5), float(k - 1), dtype=dtype, device=DEVICE)
    for rung in taking(rungs, dtype):
        y = pm.linear(x, weight, bias, kernel=rung)
        assert torch.equal(y, expected), f"{rung}: got {y[0, 0].item()}, expected {k - 1}"


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_linear_with_no_input_features_gives_the_bias(pm, rungs, dtype):
    """in_features = 0: the empty sum, so the bias broadcast over x's leading dims (zeros without bias)."""
    weight = torch.empty(6, 0, dtype=dtype, device=DEVICE)
    bias = torch.randn(6, device=DEVICE).to(dtype)
    for rung in taking(rungs, dtype):
        for lead in [(4,), (2, 3)]:
            x = torch.empty(*lead, 0, dtype=dtype, device=DEVICE)
            y = pm.linear(x, weight, bias, kernel=rung)
            assert y.shape == (*lead, 6) and torch.equal(y, bias.expand(*lead, 6)), rung
            y = pm.linear(x, weight, None, kernel=rung)
            assert torch.equal(y, torch.zeros(*lead, 6, dtype=dtype, device=DEVICE)), rung


# --------------------------------------------------------------------------- devices


@pytest.mark.parametrize("cpu_arg, with_out", [("a", False), ("b", False), ("a", True), ("b", True),
                                                ("out", True)])
def test_cpu_argument_to_matmul_is_named(pm, cpu_arg, with_out):
    """One CPU tensor among CUDA ones: a ValueError that names it (with or without ``out``)."""
    tensors = {
        "a": torch.randn(8, 4, device=DEVICE),
        "b": torch.randn(4, 5, device=DEVICE),
        "out": torch.empty(8, 5, device=DEVICE) if with_out else None,
    }
    tensors[cpu_arg] = tensors[cpu_arg].cpu()
    with pytest.raises(ValueError, match=rf"^{cpu_arg} is on cpu"):
        pm.matmul(tensors["a"], tensors["b"], out=tensors["out"])


def test_cuda_arguments_get_the_same_errors(pm):
    """matmul checks all-CUDA arguments of one dtype on a short path; whatever that
    path lets through, the full checks still raise the errors that name the problem."""
    a = torch.randn(8, 4, device=DEVICE, dtype=torch.bfloat16)
    b = torch.randn(4, 5, device=DEVICE, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match=r"^mixed dtypes are not supported: a is torch\.bfloat16, b is torch\.float16$"):
        pm.matmul(a, b.half())
    with pytest.raises(TypeError, match=r"^out has dtype torch\.float16, expected torch\.bfloat16"):
        pm.matmul(a, b, out=torch.empty(8, 5, device=DEVICE, dtype=torch.float16))
    with pytest.raises(ValueError, match=r"^out has shape \(8, 4\), expected \(8, 5\)$"):
        pm.matmul(a, b, out=torch.empty(8, 4, device=DEVICE, dtype=torch.bfloat16))
    square = torch.randn(8, 8, device=DEVICE, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"^out overlaps a in memory"):
        pm.matmul(square, torch.randn(8, 5, device=DEVICE, dtype=torch.bfloat16), out=square[:, :5])
    with pytest.raises(ValueError, match=r"^out has overlapping elements"):
        pm.matmul(a, b, out=torch.empty(1, 5, device=DEVICE, dtype=torch.bfloat16).expand(8, 5))
    with pytest.raises(TypeError, match=r"mixed dtypes are not supported: .*bias is torch\.float16"):
        pm.linear(a, b.t().contiguous(), torch.zeros(5, device=DEVICE, dtype=torch.float16))
    out = torch.empty(8, 5, device=DEVICE, dtype=torch.bfloat16)
    assert pm.matmul(a, b, kernel="naive", out=out) is out
    assert matmul_error(out, a, b) < TOLERANCE[torch.bfloat16]


@pytest.mark.parametrize("cpu_arg", ["x", "weight", "bias"])
def test_cpu_argument_to_linear_is_named(pm, cpu_arg):
    """linear's errors name linear's own arguments (x, weight, bias)."""
    tensors = {
        "x": torch.randn(2, 8, 4, device=DEVICE),
        "weight": torch.randn(5, 4, device=DEVICE),
        "bias": torch.randn(5, device=DEVICE),
    }
    tensors[cpu_arg] = tensors[cpu_arg].cpu()
    with pytest.raises(ValueError, match=rf"^{cpu_arg} is on cpu"):
        pm.linear(tensors["x"], tensors["weight"], tensors["bias"])


def test_tensors_on_two_gpus_are_rejected(pm):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA devices")
    a = torch.randn(8, 4, device="cuda:0")
    b = torch.randn(4, 5, device="cuda:1")
    with pytest.raises(ValueError, match="different devices"):
        pm.matmul(a, b)
    with pytest.raises(ValueError, match="cuda:1"):
        pm.linear(torch.randn(3, 4, device="cuda:1"), torch.randn(5, 4, device="cuda:0"))
