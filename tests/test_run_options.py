"""matmul's options (bias, tile_order, cluster_size) and the TileOrder enum, on a machine
without a GPU: the op calls are replaced by stand-ins that record them, so what the
Python plumbing passes to the op (defaults, forced values, the fast path when no option
is given) and the errors it raises are checked before any GPU sees them. The enum is
checked against the C++ sources, the only place its ints mean something."""

from __future__ import annotations

import re
import sys

import pytest
import torch


class Recorder:
    """A stand-in op that records each call's positional arguments."""

    def __init__(self, name, calls):
        self.name, self.calls = name, calls

    def __call__(self, *args):
        self.calls.append((self.name, args))


@pytest.fixture
def recorded(pm, monkeypatch):
    """(pm, calls): the package with both matmul ops replaced by recorders."""
    matmul = sys.modules[pm.__name__ + "._matmul"]
    calls = []
    monkeypatch.setattr(matmul, "_matmul_op", Recorder("matmul", calls))
    monkeypatch.setattr(matmul, "_matmul_out_op", Recorder("matmul_out", calls))
    return pm, calls


def _operands():
    return torch.zeros(256, 64, dtype=torch.bfloat16), torch.zeros(64, 256, dtype=torch.bfloat16)


def test_no_option_takes_the_matmul_op(recorded):
    """The common call goes straight to the matmul op: no option conversion, no allocation here."""
    pm, calls = recorded
    a, b = _operands()
    pm.matmul(a, b, kernel="wgmma_persistent")
    (name, args), = calls
    assert name == "matmul" and args[2] == "wgmma_persistent" and len(args) == 3


def test_wgmma_persistent_defaults_let_the_kernel_pick(recorded):
    """None options reach matmul_out as the op's defaults (-1: split tail, 0: the kernel
    picks the cluster size), with an output of the product's shape allocated here."""
    pm, calls = recorded
    a, b = _operands()
    bias = torch.zeros(256, dtype=torch.bfloat16)
    out = pm.matmul(a, b, kernel="wgmma_persistent", bias=bias)
    (name, args), = calls
    assert name == "matmul_out"
    assert args[2] is bias and args[3] is out and out.shape == (256, 256) and out.dtype == torch.bfloat16
    kernel, tile_order, cluster_size, timeline = args[4:]
    assert (kernel, tile_order, cluster_size, timeline) == ("wgmma_persistent", -1, 0, None)


@pytest.mark.parametrize("cluster_size", [1, 2])
def test_wgmma_persistent_forced_cluster_size(recorded, cluster_size):
    """A forced size goes through with the default order (split tail: single CTAs
    split the dynamic order, pairs a static one)."""
    pm, calls = recorded
    a, b = _operands()
    out = torch.empty(256, 256, dtype=torch.bfloat16)
    assert pm.matmul(a, b, kernel="wgmma_persistent", out=out, cluster_size=cluster_size) is out
    (_, args), = calls
    assert args[3] is out and args[5:7] == (-1, cluster_size)


def test_wgmma_streamk_takes_cluster_size_one(recorded):
    """cluster_size=1 (the stream-K cut without clusters) reaches the op as 1."""
    pm, calls = recorded
    a, b = _operands()
    pm.matmul(a, b, kernel="wgmma_streamk", cluster_size=1)
    (name, args), = calls
    assert name == "matmul_out" and args[4:7] == ("wgmma_streamk", -1, 1)


@pytest.mark.parametrize("order", ["hilbert", "HILBERT"])
def test_persistent_gets_the_tile_order(recorded, order):
    """A name or a member: the op gets the member's int."""
    pm, calls = recorded
    a, b = _operands()
    tile_order = order if order.islower() else pm.TileOrder[order]
    pm.matmul(a, b, kernel="persistent", tile_order=tile_order)
    (name, args), = calls
    assert name == "matmul_out" and args[4] == "persistent"
    assert args[5:7] == (pm.TileOrder.HILBERT, 0) and type(args[5]) is int


def test_auto_takes_both_options(recorded):
    """kernel="auto" may pick a rung that takes either option, so it accepts both."""
    pm, calls = recorded
    a, b = _operands()
    pm.matmul(a, b, tile_order=pm.TileOrder.GROUPED, cluster_size=2)
    (_, args), = calls
    assert args[4:7] == ("auto", 0, 2)


@pytest.mark.parametrize(("kwargs", "error", "message"), [
    (dict(kernel="persistent", tile_order="spiral"), ValueError,
     r"^unknown tile_order 'spiral'; choose one of: grouped, hilbert, dynamic, split_tail$"),
    (dict(kernel="persistent", tile_order=1), TypeError,
     r"^tile_order must be a TileOrder or one of its names \(grouped, hilbert, dynamic, split_tail\), got int$"),
    (dict(kernel="tiled", tile_order="grouped"), ValueError,
     r"^kernel 'tiled' takes no tile_order; the rungs that do: persistent, wgmma_persistent$"),
    (dict(kernel="persistent", cluster_size=2), ValueError,
     r"^kernel 'persistent' takes no cluster_size; the rungs that do: wgmma_persistent, wgmma_streamk$"),
    (dict(kernel="wgmma_streamk", tile_order="split_tail"), ValueError,
     r"^kernel 'wgmma_streamk' takes no tile_order; the rungs that do: persistent, wgmma_persistent$"),
    (dict(kernel="wgmma_streamk", cluster_size=2), ValueError,
     r"^kernel 'wgmma_streamk' takes cluster_size 1 \(or None: the kernel picks\), got 2$"),
    (dict(kernel="wgmma_persistent", cluster_size=3), ValueError,
     r"^cluster_size must be None \(the kernel picks\), 1 or 2, got 3$"),
    (dict(kernel="wgmma_persistent", cluster_size=True), TypeError, r"^cluster_size must be None, 1 or 2, got bool$"),
    (dict(kernel="wgmma_persistent", tile_order="dynamic", cluster_size=2), ValueError,
     r"^the dynamic tile order runs without clusters"),
    (dict(kernel="fastest", tile_order="grouped"), ValueError, r"^unknown kernel 'fastest'"),
])
def test_bad_options_are_named_before_the_op(recorded, kwargs, error, message):
    pm, calls = recorded
    a, b = _operands()
    with pytest.raises(error, match=message):
        pm.matmul(a, b, **kwargs)
    assert calls == []


def test_options_path_explains_what_the_op_rejects(pm):
    """The op itself rejects these CPU tensors; the exception then names the problem as
    the call without options does."""
    a, b = _operands()
    with pytest.raises(Exception) as plain:
        pm.matmul(a, b, kernel="persistent")
    with pytest.raises(type(plain.value), match=re.escape(str(plain.value))):
        pm.matmul(a, b, kernel="persistent", tile_order="hilbert")
    with pytest.raises(ValueError, match=r"^bias has 3 elements but the product has 256 columns"):
        pm.matmul(a, b, bias=torch.zeros(3, dtype=torch.bfloat16))


def test_tile_order_names(pm):
    """str() is the lower-case name the functions take, and looks the member up again."""
    assert [str(o) for o in pm.TileOrder] == ["grouped", "hilbert", "dynamic", "split_tail"]
    assert all(pm.TileOrder(str(o)) is o for o in pm.TileOrder)
    with pytest.raises(ValueError):
        pm.TileOrder("SPLIT_TAIL")  # the member's name, not the lower-case one


def test_tile_order_matches_the_cpp_sources(pm, repo_root):
    """The device code's TileOrder enum (kGrouped = 0, ...) has the same members and
    ints as the package's, and the op entry's range check and its error message (the
    ints it takes, each with its order's name) agree with them."""
    sources = {p: p.read_text() for p in sorted((repo_root / "csrc").glob("*.cuh")) + sorted(
        (repo_root / "csrc").glob("*.h"))}
    enums = [m.group(1) for text in sources.values()
             for m in re.finditer(r"enum class TileOrder\s*:\s*int32_t\s*\{(.*?)\}", text, re.S)]
    assert len(enums) == 1, f"expected one TileOrder enum in csrc/, found {len(enums)}"
    cpp = {re.sub(r"(?<!^)(?=[A-Z])", "_", name).upper(): int(value)
           for name, value in re.findall(r"k(\w+)\s*=\s*(\d+)", enums[0])}
    assert cpp == {o.name: int(o) for o in pm.TileOrder}

    binding = (repo_root / "torch-ext" / "torch_binding.cpp").read_text()
    check = re.search(r"opt\.tile_order >= -1 && opt\.tile_order <= (\d+),\s*\"persistent_matmul: tile_order "
                      r"must be (.*?), got \"", binding, re.S)
    assert check, "the op entry's tile_order check was not found"
    assert int(check.group(1)) == max(pm.TileOrder)
    message = re.sub(r'"\s*"', "", check.group(2))  # adjacent C++ string literals
    named = {int(i): name.lower().replace(" ", "_") for i, name in re.findall(r"(-?\d+) \(([^)]+)\)", message)}
    assert named.pop(-1) == "the_default"
    assert named == {int(o): str(o) for o in pm.TileOrder}
    default = re.search(r"constexpr int32_t kSplitTail = (\d+);", binding)
    assert default and int(default.group(1)) == pm.TileOrder.SPLIT_TAIL
    assert "opt.tile_order < 0 ? kSplitTail" in binding, "the op's default order is no longer split tail"
