"""What `_run` passes to the matmul_out op for the persistent rungs' options, on a
machine without a GPU: the device checks and the op library are replaced by
stand-ins that record the call, so the Python plumbing of tile_order and
cluster_size (defaults, forced values) is checked before any GPU sees it."""

from __future__ import annotations

import sys

import pytest
import torch


class RecordingOps:
    """Records each op call's positional arguments by op name."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        return lambda *args: self.calls.append((name, args))


@pytest.fixture
def recorded(pm, monkeypatch):
    matmul = sys.modules[pm.__name__ + "._matmul"]
    ops = RecordingOps()
    monkeypatch.setattr(matmul, "ops", ops)
    monkeypatch.setattr(matmul, "check_cuda", lambda named: torch.device("cpu"))
    monkeypatch.setattr(matmul, "_resolve_rung", lambda kernel, dtype, device: matmul.RUNGS[kernel])
    return matmul, ops


def _operands():
    return torch.zeros(256, 64, dtype=torch.bfloat16), torch.zeros(64, 256, dtype=torch.bfloat16)


def test_wgmma_persistent_defaults_let_the_kernel_pick(recorded):
    matmul, ops = recorded
    a, b = _operands()
    matmul._run(a, b, None, None, "wgmma_persistent")
    (name, args), = ops.calls
    assert name == "matmul_out"
    kernel, tile_order, cluster_size, timeline = args[4:]
    assert kernel == "wgmma_persistent"
    assert tile_order == matmul.TILE_ORDERS[matmul.DEFAULT_TILE_ORDER]
    assert cluster_size == 0 and timeline is None


@pytest.mark.parametrize("cluster_size", [1, 2])
def test_wgmma_persistent_forced_cluster_size(recorded, cluster_size):
    """A forced size goes through with the default order (split tail: single CTAs
    split the dynamic order, pairs a static one)."""
    matmul, ops = recorded
    a, b = _operands()
    matmul._run(a, b, None, None, "wgmma_persistent", cluster_size=cluster_size)
    (_, args), = ops.calls
    assert args[5:7] == (matmul.TILE_ORDERS["split_tail"], cluster_size)


def test_persistent_gets_the_tile_order_only(recorded):
    matmul, ops = recorded
    a, b = _operands()
    matmul._run(a, b, None, None, "persistent", tile_order="hilbert", cluster_size=2)
    (name, args), = ops.calls
    assert name == "matmul_out" and args[4] == "persistent"
    assert args[5] == matmul.TILE_ORDERS["hilbert"]


def test_unknown_tile_order_is_named(recorded):
    matmul, ops = recorded
    a, b = _operands()
    with pytest.raises(ValueError, match=r"^unknown tile_order 'spiral'; choose one of: grouped, hilbert"):
        matmul._run(a, b, None, None, "persistent", tile_order="spiral")
    assert ops.calls == []
