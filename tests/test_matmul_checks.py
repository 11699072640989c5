"""CPU tests of the correctness helpers in matmul_checks.py: the GPU tests and the
correctness sweep are only as good as these, so their promises are checked here."""

from __future__ import annotations

import math

import pytest
import torch

from matmul_checks import (
    EXACT_INT_LIMIT,
    TILE_ORDER_VARIANTS,
    TOLERANCE,
    cancellation_floor,
    check_exact,
    exact_int_bias,
    exact_int_nonzeros_per_row,
    exact_int_operands,
    matmul_error,
    poison,
    random_operands,
    reference,
    rel_error,
    timeline_parts,
)
from harness.provenance import git_commit

DTYPES = [torch.bfloat16, torch.float16, torch.float32]


@pytest.mark.parametrize("a_t", [False, True])
@pytest.mark.parametrize("b_t", [False, True])
def test_random_operands_shapes_and_strides(a_t, b_t):
    a, b = random_operands(5, 3, 7, torch.bfloat16, "cpu", a_transposed=a_t, b_transposed=b_t)
    assert a.shape == (5, 7) and b.shape == (7, 3)
    assert a.dtype == b.dtype == torch.bfloat16
    assert a.stride() == ((1, 5) if a_t else (7, 1))
    assert b.stride() == ((1, 7) if b_t else (3, 1))
    assert a.std() > 0.5 and b.std() > 0.5  # random normal, not zeros


def test_random_operands_fresh_and_reproducible():
    a1, _ = random_operands(8, 8, 8, torch.float32, "cpu")
    a2, _ = random_operands(8, 8, 8, torch.float32, "cpu")
    assert not torch.equal(a1, a2)
    g1, g2 = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    assert torch.equal(random_operands(4, 4, 4, torch.float16, "cpu", generator=g1)[0],
                       random_operands(4, 4, 4, torch.float16, "cpu", generator=g2)[0])


def test_reference_uses_rounded_inputs_in_fp64():
    a, b = random_operands(6, 5, 33, torch.bfloat16, "cpu")
    bias = torch.randn(5).to(torch.bfloat16)
    ref = reference(a, b, bias)
    assert ref.dtype == torch.float64
    expected = a.double() @ b.double() + bias.double()
    assert torch.equal(ref, expected)


def test_rel_error():
    ref = torch.tensor([[3.0, 4.0]], dtype=torch.float64)
    assert rel_error(ref.float(), ref) == 0.0
    assert rel_error(torch.tensor([[3.0, 4.5]]), ref) == pytest.approx(0.1)
    # NaN or inf never passes
    assert rel_error(torch.tensor([[3.0, float("nan")]]), ref) == math.inf
    assert rel_error(torch.tensor([[3.0, float("inf")]]), ref) == math.inf
    # all-zero reference: absolute error
    zero = torch.zeros(1, 2, dtype=torch.float64)
    assert rel_error(torch.tensor([[0.0, 0.5]]), zero) == pytest.approx(0.5)
    assert rel_error(torch.zeros(0, 3), torch.zeros(0, 3, dtype=torch.float64)) == 0.0


def test_rel_error_floor():
    ref = torch.tensor([[3.0, 4.0]], dtype=torch.float64)
    out = torch.tensor([[3.0, 4.5]])
    assert rel_error(out, ref, floor=1.0) == pytest.approx(0.1)  # floor below ||ref||: no effect
    assert rel_error(out, ref, floor=50.0) == pytest.approx(0.01)


def test_cancellation_floor():
    a, b = random_operands(40, 30, 500, torch.float32, "cpu")
    ratio = cancellation_floor(a, b) / torch.linalg.vector_norm(reference(a, b)).item()
    assert 0.5 < ratio < 0.8  # about 2/pi: below ||ref|| for ordinary random products
    k1a, k1b = random_operands(5, 6, 1, torch.float32, "cpu")
    assert cancellation_floor(k1a, k1b) == pytest.approx(torch.linalg.vector_norm(reference(k1a, k1b)).item())
    assert cancellation_floor(torch.ones(3, 0), torch.ones(0, 2)) == 0.0


def test_matmul_error_survives_a_cancelling_dot_product():
    """A 1x1xK product that cancels to ~0: a correct fp32 sum (sequential, like one thread
    of a naive kernel) has a large error relative to ref, but not to the floor; a wrong
    sum (one term missing) still fails."""
    k = 4104
    a = torch.randn(1, k, dtype=torch.float64)
    b = torch.randn(k, 1, dtype=torch.float64)
    b[-1, 0] -= (a @ b).item() / a[0, -1].item()  # make the fp64 dot product ~0
    a, b = a.float(), b.float()
    acc = torch.zeros((), dtype=torch.float32)
    for x, y in zip(a[0], b[:, 0]):
        acc = acc + x * y
    out = acc.reshape(1, 1)
    assert rel_error(out, reference(a, b)) > TOLERANCE[torch.float32]  # the unfloored measure fails
    assert matmul_error(out, a, b) < TOLERANCE[torch.float32] / 10
    wrong = (a[:, :-1] @ b[:-1]).reshape(1, 1)
    assert matmul_error(wrong, a, b) > TOLERANCE[torch.float32]


def test_matmul_error_survives_fp16_subnormal_outputs():
    """The flake seen on the H200 (fp16, m=1 n=64 k=1): a tiny a makes every product
    subnormal in fp16, where a correctly rounded result is off by more than 2e-3
    relative; the underflow floor lets it pass, and a wrong result still fails."""
    a = torch.full((1, 1), 2.0**-20, dtype=torch.float16)  # products below fp16's smallest normal, 2^-14
    b = torch.linspace(0.011, 0.9, 64, dtype=torch.float64).reshape(1, 64).half()
    ref = reference(a, b)
    good = ref.half()  # correctly rounded, subnormal
    assert rel_error(good, ref) > TOLERANCE[torch.float16]  # the unfloored measure fails
    assert matmul_error(good, a, b) < TOLERANCE[torch.float16]
    assert matmul_error(torch.zeros_like(good), a, b) > TOLERANCE[torch.float16]  # nothing written: fails
    # Outputs of normal size are untouched by the floor: one wrong element in 64 fails.
    a_normal, b_normal = torch.ones_like(a), b
    wrong = reference(a_normal, b_normal).half()
    wrong[0, 7] *= 1.5
    assert matmul_error(wrong, a_normal, b_normal) > TOLERANCE[torch.float16]


@pytest.mark.parametrize("dtype", DTYPES)
def test_rounding_a_product_passes_the_tolerance_and_an_error_fails_it(dtype):
    """The bounds are neither too tight (a correctly rounded product passes) nor
    too loose (one wrong element in 64 fails)."""
    a, b = random_operands(64, 64, 257, dtype, "cpu")
    ref = reference(a, b)
    good = ref.to(dtype)
    assert rel_error(good, ref) < TOLERANCE[dtype] / 2
    bad = good.clone()
    bad[::8, ::8] = 0
    assert rel_error(bad, ref) > TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", [1, 65, 4104])
@pytest.mark.parametrize("transposed", [False, True])
def test_exact_int_operands_are_exact(dtype, k, transposed):
    m, n = 33, 17
    a, b = exact_int_operands(m, n, k, dtype, "cpu", a_transposed=transposed, b_transposed=transposed)
    assert a.shape == (m, k) and b.shape == (k, n) and a.dtype == b.dtype == dtype
    if transposed:
        assert a.stride() == (1, m) and b.stride() == (1, k)
    # integers, within the entry bound
    for t in (a, b):
        assert torch.equal(t.double(), t.double().round())
    limit = exact_int_nonzeros_per_row(dtype)
    assert int((a != 0).sum(dim=1).max()) <= limit
    # every partial sum (prefix over K) is within the exact range, so it is exact in fp32
    prefix = torch.cumsum(a.double()[:, :, None] * b.double()[None, :, :], dim=1)
    assert prefix.abs().max() <= EXACT_INT_LIMIT[dtype]
    ref = reference(a, b)
    # and the output rounds to itself in the dtype
    assert torch.equal(ref.to(dtype).double(), ref)
    # a float32 computation (any order) is exact too
    assert torch.equal((a.float() @ b.float()).double(), ref)
    # not degenerate: the product is not all zeros and uses a good part of the range
    assert ref.abs().max() >= min(4, k)


def test_exact_int_operands_spread_nonzeros_over_k():
    """With K beyond the nonzero limit the kept positions still reach the K tail."""
    a, _ = exact_int_operands(64, 4, 4104, torch.bfloat16, "cpu")
    assert (a[:, -1] != 0).float().mean() > 0.4  # the last position is always kept (then 2/3 nonzero)
    assert (a[:, 0] != 0).float().mean() > 0.4
    nonzero_columns = (a != 0).any(dim=0).nonzero().flatten()
    assert len(nonzero_columns) > 4104 // 2  # spread over K, not a fixed block
    assert (a != 0).sum(dim=1).max() > 100


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_exact_int_bias_headroom(dtype):
    m, n, k = 8, 16, 5000
    a, b = exact_int_operands(m, n, k, dtype, "cpu", headroom=1)
    bias = exact_int_bias(n, dtype, "cpu")
    assert bias.abs().max() <= 1
    ref = reference(a, b, bias)
    assert ref.abs().max() <= EXACT_INT_LIMIT[dtype]
    assert torch.equal(ref.to(dtype).double(), ref)


def test_poison_and_check_exact():
    a, b = exact_int_operands(9, 10, 300, torch.bfloat16, "cpu")
    out = poison(torch.empty(9, 10, dtype=torch.bfloat16))
    assert torch.isnan(out).all()
    assert check_exact(out, a, b) == 90  # NaN counts as a mismatch
    out.copy_((a.float() @ b.float()).to(torch.bfloat16))
    assert check_exact(out, a, b) == 0
    out[3, 4] += 1
    out[0, 0] = float("nan")
    assert check_exact(out, a, b) == 2
    bias = exact_int_bias(10, torch.bfloat16, "cpu")
    out_b = (a.float() @ b.float() + bias.float()).to(torch.bfloat16)
    assert check_exact(out_b, a, b, bias) == 0


def test_variant_names_follow_the_packages_tile_orders(pm):
    """The benchmark's extra columns are the package's tile orders other than the default."""
    assert set(TILE_ORDER_VARIANTS) == {str(order) for order in pm.TileOrder} - {"split_tail"}


def test_commit_is_the_builds_own_before_the_checkouts(tmp_path):
    """A build records its source commit; the checkout it runs beside may be
    elsewhere (or no git checkout at all), and the measured kernels are the build's."""
    import subprocess

    repo, plain = tmp_path / "repo", tmp_path / "plain"
    repo.mkdir()
    plain.mkdir()

    def git(*args):
        return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout.strip()

    git("init", "-q")
    (repo / "f").write_text("x")
    git("add", "f")
    git("-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "one")
    head = git("rev-parse", "HEAD")
    built = {"provenance": {"kernel": {"commit": "0" * 40, "dirty": False}}}
    assert git_commit(built, repo) == ("0" * 40, f"metadata.json provenance; checkout at {head[:12]}")
    built_here = {"provenance": {"kernel": {"commit": head, "dirty": True}}}
    assert git_commit(built_here, repo) == (head, "metadata.json provenance (dirty build)")
    assert git_commit({}, repo) == (head, "git rev-parse HEAD")
    assert git_commit(built, plain) == ("0" * 40, "metadata.json provenance")
    assert git_commit({}, plain)[0] is None


class _TimelineKernel:
    """What timeline_parts asks of the kernel: its columns and a tile configuration."""

    TIMELINE_COLUMNS = ("tile_m", "tile_n", "k_begin", "k_end", "sm", "cta", "start_ns", "end_ns")

    def tile_config(self, m, n, *, kernel, k, cluster_size):
        return {"block_m": 64, "block_n": 64, "block_k": 64, "tiles": 4, "persistent_ctas": 3, "timeline_rows": 7}


def _timeline():
    """A 128 x 128 x 256 product in 2 x 2 tiles on 3 CTAs: three whole tiles in their own
    rows, tile (1, 1) cut into two parts in rows 4 and 5; rows 3 and 6 unused (-1)."""
    rows = torch.full((7, 8), -1, dtype=torch.int64)
    rows[0] = torch.tensor([0, 0, 0, 256, 0, 0, 0, 10])
    rows[1] = torch.tensor([0, 1, 0, 256, 1, 1, 0, 10])
    rows[2] = torch.tensor([1, 0, 0, 256, 2, 2, 0, 10])
    rows[4] = torch.tensor([1, 1, 0, 128, 0, 0, 10, 15])
    rows[5] = torch.tensor([1, 1, 128, 256, 1, 1, 10, 15])
    return rows


def _check(rows):
    return timeline_parts(_TimelineKernel(), "persistent", rows, 128, 128, 256, sm_count=3)


def test_timeline_parts_accepts_whole_tiles_and_parts():
    parts = _check(_timeline())
    assert len(parts) == 5 and parts[-1] == [1, 1, 128, 256, 1, 1, 10, 15]


@pytest.mark.parametrize(("change", "message"), [
    (lambda r: r.__setitem__(3, -2), "a row no unit wrote is -1 throughout"),
    (lambda r: r[0].__setitem__(1, 1), "row 0 holds another tile"),
    (lambda r: r[4].copy_(torch.tensor([1, 1, 0, 256, 0, 0, 10, 15])), "row 4 past the tiles' holds a whole tile"),
    (lambda r: r[5].__setitem__(2, 100), r"tile \(1, 1\): K-ranges \[\(0, 128\), \(100, 256\)\] do not cover"),
    (lambda r: r[5].__setitem__(2, 192), "do not cover"),
    (lambda r: r[1].__setitem__(7, 0), "row 1: start >= end"),
    (lambda r: r[1].__setitem__(4, 3), "row 1: SM or CTA out of range"),
    (lambda r: r[1].__setitem__(5, 4), "row 1: SM or CTA out of range"),
    (lambda r: r[2].__setitem__(0, 2), "row 2: tile outside the grid"),
    (lambda r: r[2].fill_(-1), "1 of 4 tiles have no part"),
    (lambda r: r[4].__setitem__(6, 5), "CTA 0 overlaps its own parts"),
])
def test_timeline_parts_names_what_is_wrong(change, message):
    rows = _timeline()
    change(rows)
    with pytest.raises(AssertionError, match=message):
        _check(rows)
