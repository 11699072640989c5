"""The chunked rungs' operand preparation in the op entry (the operands_for op runs the
same C++ code on CPU tensors): what it copies and what it leaves alone."""

from __future__ import annotations

import pytest
import torch


def k_major(b: torch.Tensor) -> bool:
    k, n = b.shape
    return (b.stride(0) == 1 or k == 1) and (n == 1 or b.stride(1) % 8 == 0)


def fast_path_ok(a: torch.Tensor, b: torch.Tensor, need_kmajor: bool = False) -> bool:
    """The conditions csrc/tensor_core_launch.cuh checks (a_ok and b_layout; splitk: a K-major b)."""
    m, k = a.shape
    n = b.shape[1]
    a_ok = a.data_ptr() % 16 == 0 and (a.stride(1) == 1 or k == 1) and (m == 1 or a.stride(0) % 8 == 0)
    n_major = (b.stride(1) == 1 or n == 1) and (k == 1 or b.stride(0) % 8 == 0)
    return a_ok and b.data_ptr() % 16 == 0 and (k_major(b) or (n_major and not need_kmajor))


def prepared(pm, a, b, need_kmajor=False):
    return pm._matmul.ops.operands_for(a, b, 8, need_kmajor)


def layouts(m: int, n: int, k: int):
    """(name, a, b) in the layouts users pass: plain, transposed, sliced, offset."""
    big_a = torch.randn(m + 1, k + 9, dtype=torch.bfloat16)
    big_b = torch.randn(k + 1, n + 9, dtype=torch.bfloat16)
    yield "row-major", torch.randn(m, k, dtype=torch.bfloat16), torch.randn(k, n, dtype=torch.bfloat16)
    yield "linear weight", torch.randn(m, k, dtype=torch.bfloat16), torch.randn(n, k, dtype=torch.bfloat16).t()
    yield "transposed a", torch.randn(k, m, dtype=torch.bfloat16).t(), torch.randn(k, n, dtype=torch.bfloat16)
    yield "ld+9 slices", big_a[:m, :k], big_b[:k, :n]
    yield "odd offset", big_a[1:, 1 : k + 1], big_b[1:, 1 : n + 1]


@pytest.mark.parametrize("need_kmajor", [False, True], ids=["tile rungs", "splitk"])
@pytest.mark.parametrize("m, n, k", [(1, 1, 1), (7, 9, 5), (64, 64, 64), (65, 129, 4097), (3, 4104, 1)])
def test_prepared_operands_take_the_fast_path_and_keep_their_values(pm, m, n, k, need_kmajor):
    for name, a, b in layouts(m, n, k):
        pa, pb = prepared(pm, a, b, need_kmajor)
        assert fast_path_ok(pa, pb, need_kmajor), name
        assert torch.equal(pa, a) and torch.equal(pb, b), name


def test_operands_already_in_layout_are_not_copied(pm):
    a = torch.randn(64, 4096, dtype=torch.float16)
    for b in (torch.randn(4096, 256, dtype=torch.float16), torch.randn(256, 4096, dtype=torch.float16).t()):
        pa, pb = prepared(pm, a, b)
        assert pa.data_ptr() == a.data_ptr() and pb.data_ptr() == b.data_ptr()


def test_unaligned_leading_dimension_gets_a_padded_copy(pm):
    a = torch.randn(4097, 4097, dtype=torch.bfloat16)  # ld 4097: rows not 16-byte aligned
    # The copy pads rows to 128 bytes (64 elements), so they start on cache lines.
    pa, _ = prepared(pm, a, torch.randn(4097, 8, dtype=torch.bfloat16))
    assert pa.data_ptr() != a.data_ptr()
    assert pa.stride() == (4160, 1)


def test_splitk_gets_a_k_major_copy_of_a_row_major_b(pm):
    """splitk reads weight rows: a row-major b (N contiguous) is copied K-major, rows padded to 128 bytes."""
    a, b = torch.randn(4, 4104, dtype=torch.bfloat16), torch.randn(4104, 256, dtype=torch.bfloat16)
    _, kept = prepared(pm, a, b)
    assert kept.data_ptr() == b.data_ptr()
    _, pb = prepared(pm, a, b, need_kmajor=True)
    assert pb.data_ptr() != b.data_ptr() and pb.stride() == (1, 4160) and torch.equal(pb, b)
