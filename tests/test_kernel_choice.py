"""What kernel="auto" runs, on a machine without a GPU: the op entry's choice
(torch-ext/rungs.h, exposed as the choose_kernel op) against the README's table,
and the rung lists of C++ and Python against each other."""

from __future__ import annotations

import re

import pytest
import torch

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def readme_auto_rows(repo_root):
    """The rows of the README's table under "What kernel="auto" runs"."""
    text = (repo_root / "README.md").read_text()
    section = text.split('### What `kernel="auto"` runs', 1)[1].split("\n#", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 9 and re.fullmatch(r"\d+\.\d+", cells[1]):
            rows.append(cells)
    return rows


def test_readme_table_is_what_the_op_entry_chooses(pm, repo_root):
    rows = readme_auto_rows(repo_root)
    assert len(rows) >= 8, "the README's auto table was not found"
    choose = pm._matmul.ops.choose_kernel
    for gpu, capability, sms, dtype, m, n, k, layout, rung in rows:
        major, minor = (int(x) for x in capability.split("."))
        got = choose(major, minor, int(sms), DTYPES[dtype], int(m), int(n), int(k), layout == "K-major")
        assert got == rung.strip("`").split(":")[0], \
            f"{gpu} {dtype} {m}x{n}x{k} {layout}: the op entry runs {got}, README says {rung}"


@pytest.mark.parametrize("sms", [60, 108, 132, 188])
def test_splitk_from_1024_weight_rows(pm, sms):
    """splitk is chosen up to its token limit and from N = 1024 on (64 CTAs of 16 weight
    rows), for K-major weights only, whatever the SM count (a 60-SM slice, an RTX Pro
    6000's 188), where wgmma_streamk is not (K = 512: too short for a clustered cut)."""
    choose = pm._matmul.ops.choose_kernel
    assert choose(9, 0, sms, torch.bfloat16, 1, 1024, 512, True) == "splitk"
    assert choose(9, 0, sms, torch.bfloat16, 32, 1024, 512, True) == "splitk"
    assert choose(9, 0, sms, torch.bfloat16, 33, 1024, 4096, True) != "splitk"
    assert choose(9, 0, sms, torch.bfloat16, 129, 1024, 4096, True) == "wgmma_persistent"
    assert choose(9, 0, sms, torch.bfloat16, 1, 1023, 512, True) == "wgmma_persistent"
    assert choose(9, 0, sms, torch.bfloat16, 1, 1024, 512, False) == "wgmma_persistent"
    assert choose(8, 0, sms, torch.float16, 1, 1024, 4096, True) == "splitk"
    assert choose(8, 0, sms, torch.float16, 1, 1023, 4096, True) == "persistent"


@pytest.mark.parametrize("sms", [60, 132])
def test_streamk_for_large_weights_on_hopper_only(pm, sms):
    """wgmma_streamk up to 32 tokens from 80 M weight elements on; K-major weights,
    fp16/bf16, compute capability 9.0 only (its sm_90a code); splitk or the tile rungs
    elsewhere, long weight rows included (wgmma_persistent's split past 32 tokens).
    Up to 8 tokens against rows of at most 4096 elements splitk keeps them."""
    choose = pm._matmul.ops.choose_kernel
    assert choose(9, 0, sms, torch.bfloat16, 8, 28672, 4096, True) == "splitk"
    assert choose(9, 0, sms, torch.bfloat16, 1, 1 << 20, 4096, True) == "splitk"
    assert choose(9, 0, sms, torch.bfloat16, 9, 28672, 4096, True) == "wgmma_streamk"
    assert choose(9, 0, sms, torch.bfloat16, 8, 28672, 4104, True) == "wgmma_streamk"
    big = (10000, 8000)  # exactly 80 M elements
    assert choose(9, 0, sms, torch.bfloat16, 32, *big, True) == "wgmma_streamk"
    assert choose(9, 0, sms, torch.float16, 1, *big, True) == "wgmma_streamk"
    assert choose(9, 0, sms, torch.bfloat16, 1, 10000, 7999, True) == "splitk"
    assert choose(9, 0, sms, torch.bfloat16, 33, *big, True) == "wgmma_persistent"
    assert choose(9, 0, sms, torch.bfloat16, 1, *big, False) == "wgmma_persistent"
    assert choose(9, 0, sms, torch.float32, 1, *big, True) == "warptiled"
    assert choose(9, 0, sms, torch.bfloat16, 16, 9000, 8192, True) == "splitk"  # 73.7 M elements, no cluster fits
    assert choose(9, 0, sms, torch.bfloat16, 129, 4096, 14336, True) == "wgmma_persistent"
    assert choose(9, 0, sms, torch.bfloat16, 65, 8192, 28672, True) == "wgmma_persistent"
    assert choose(9, 0, sms, torch.bfloat16, 32, 8192, 28672, True) == "wgmma_streamk"
    for major, minor in ((8, 0), (10, 0), (12, 0)):
        assert choose(major, minor, sms, torch.bfloat16, 1, *big, True) == "splitk"


def test_streamk_where_its_clustered_cut_runs(pm):
    """On 132 SMs, wgmma_streamk also up to 64 tokens where a whole number of CTAs per
    tile of 128 or 64 weight rows, at least two k-blocks (of 128) deep each, fill 2/3 to all
    of the SMs: from one token on 128-row tiles in pairs or whole (44 to 132 tiles) and
    64-row tiles in clusters of 3 to 8, or in pairs against rows longer than 4096; any
    cluster of up to 8 from 33 tokens on, and of 64-row tiles up to 128 tokens; splitk's bulk
    kernel keeps up to 8 tokens against rows of at most 4096 where its CTAs (16 rows each)
    fill 2/3 of the SMs; past that the tile rungs."""
    choose = pm._matmul.ops.choose_kernel
    for m in (1, 9, 32, 64):
        assert choose(9, 0, 132, torch.bfloat16, m, 8192, 8192, True) == "wgmma_streamk"  # 64 tiles, pairs
        assert choose(9, 0, 132, torch.bfloat16, m, 44 * 128, 8192, True) == "wgmma_streamk"  # 88 CTAs in pairs
    assert choose(9, 0, 132, torch.bfloat16, 16, 43 * 128, 8192, True) == "splitk"  # pairs: 86 CTAs
    assert choose(9, 0, 132, torch.bfloat16, 8, 6144, 4096, True) == "splitk"  # its bulk kernel
    assert choose(9, 0, 132, torch.bfloat16, 9, 6144, 4096, True) == "wgmma_streamk"
    assert choose(9, 0, 132, torch.bfloat16, 16, 66 * 128, 512, True) == "wgmma_streamk"  # 132 CTAs in pairs
    assert choose(9, 0, 132, torch.bfloat16, 16, 67 * 128, 512, True) == "splitk"  # pairs overflow, too few tiles
    assert choose(9, 0, 132, torch.bfloat16, 16, 8192, 384, True) == "splitk"  # parts of 1.5 k-blocks
    assert choose(9, 0, 132, torch.bfloat16, 32, 4096, 4096, True) == "splitk"  # 64-row pairs, rows of 4096
    assert choose(9, 0, 132, torch.bfloat16, 33, 4096, 4096, True) == "wgmma_streamk"
    for m in (1, 9, 32):
        assert choose(9, 0, 132, torch.bfloat16, m, 4096, 4104, True) == "wgmma_streamk"  # 64-row pairs
        assert choose(9, 0, 132, torch.bfloat16, m, 4096, 14336, True) == "wgmma_streamk"
    assert choose(9, 0, 132, torch.bfloat16, 16, 4224, 4096, True) == "splitk"  # 66 64-row tiles in pairs
    assert choose(9, 0, 132, torch.bfloat16, 16, 4224, 4104, True) == "wgmma_streamk"
    assert choose(9, 0, 132, torch.bfloat16, 16, 2752, 4096, True) == "wgmma_streamk"  # 43 in clusters of 3
    assert choose(9, 0, 132, torch.bfloat16, 16, 4096, 384, True) == "splitk"  # parts of 1.5 k-blocks
    for m in (9, 32):  # 16 and 24 64-row tiles in clusters of 8 and 5, where splitk runs 64 and 96 CTAs
        assert choose(9, 0, 132, torch.bfloat16, m, 1024, 4096, True) == "wgmma_streamk"
        assert choose(9, 0, 132, torch.bfloat16, m, 1536, 4096, True) == "wgmma_streamk"
    assert choose(9, 0, 132, torch.bfloat16, 8, 1536, 4096, True) == "splitk"  # its bulk kernel: 96 CTAs
    assert choose(9, 0, 132, torch.bfloat16, 8, 1408, 4096, True) == "splitk"  # 88 CTAs: 2/3 of 132
    assert choose(9, 0, 132, torch.bfloat16, 8, 1392, 4096, True) == "wgmma_streamk"  # 87 CTAs
    for m in (1, 8):  # 64 CTAs: 64-row tiles in clusters of 8 instead
        assert choose(9, 0, 132, torch.bfloat16, m, 1024, 4096, True) == "wgmma_streamk"
    assert choose(9, 0, 132, torch.bfloat16, 1, 1024, 14336, True) == "wgmma_streamk"
    assert choose(9, 0, 132, torch.bfloat16, 32, 40 * 128, 1024, True) == "splitk"  # 128-row, clusters of 3
    assert choose(9, 0, 132, torch.bfloat16, 33, 11 * 128, 2048, True) == "wgmma_streamk"  # 22 64-row tiles, 6 each
    assert choose(9, 0, 132, torch.bfloat16, 33, 11 * 64, 2048, True) == "wgmma_streamk"  # clusters of 8
    assert choose(9, 0, 132, torch.bfloat16, 33, 10 * 64, 2048, True) == "wgmma_persistent"  # 80 CTAs
    assert choose(9, 0, 132, torch.bfloat16, 33, 11 * 64, 1920, True) == "wgmma_persistent"  # parts of 1.9
    for m in (65, 128):  # 64-row tiles: pairs, clusters of 8
        assert choose(9, 0, 132, torch.bfloat16, m, 4096, 4096, True) == "wgmma_streamk"
        assert choose(9, 0, 132, torch.bfloat16, m, 1024, 4096, True) == "wgmma_streamk"
    assert choose(9, 0, 132, torch.bfloat16, 129, 4096, 4096, True) == "wgmma_persistent"
    assert choose(9, 0, 132, torch.bfloat16, 65, 8192, 8192, True) == "wgmma_persistent"  # 128-row pairs
    assert choose(9, 0, 132, torch.bfloat16, 65, 6144, 4096, True) == "wgmma_persistent"
    assert choose(9, 0, 132, torch.bfloat16, 64, 8192, 8192, False) == "wgmma_persistent"  # N-major weights
    assert choose(8, 0, 108, torch.bfloat16, 16, 8192, 8192, True) == "splitk"  # no sm_90a


def test_builds_without_the_clustered_cut(pm):
    """A build without wgmma_streamk's clustered cut (CUDA 12) chooses as the rule did
    before it: wgmma_streamk only by its weights' size up to 32 tokens, and the shapes of
    the clustered cut go to splitk (up to 32 tokens) and wgmma_persistent. The same
    shapes with the cut (this CUDA 13 build's own answer, None) run wgmma_streamk."""
    choose = pm._matmul.ops.choose_kernel
    cases = [  # m, n, k, without the clustered cut
        (16, 8192, 8192, "splitk"),  # 64 128-row tiles in pairs
        (9, 6144, 4096, "splitk"),
        (9, 1024, 4096, "splitk"),  # 64-row tiles in clusters of 8
        (1, 1024, 4096, "splitk"),
        (33, 4096, 4096, "wgmma_persistent"),  # 64-row pairs
        (64, 8192, 8192, "wgmma_persistent"),
        (128, 4096, 14336, "wgmma_persistent"),
    ]
    for m, n, k, rung in cases:
        assert choose(9, 0, 132, torch.bfloat16, m, n, k, True, False) == rung, (m, n, k)
        assert choose(9, 0, 132, torch.bfloat16, m, n, k, True, True) == "wgmma_streamk", (m, n, k)
        assert choose(9, 0, 132, torch.bfloat16, m, n, k, True) == "wgmma_streamk", (m, n, k)
    for m in (1, 9, 32):  # 80 M weight elements or more: wgmma_streamk's stream-K cut either way
        assert choose(9, 0, 132, torch.bfloat16, m, 10240, 8192, True, False) == "wgmma_streamk"
    assert choose(9, 0, 132, torch.bfloat16, 8, 28672, 4096, True, False) == "splitk"  # its bulk kernel
    assert choose(9, 0, 132, torch.bfloat16, 33, 10240, 8192, True, False) == "wgmma_persistent"


def test_fp32_and_old_gpus(pm):
    choose = pm._matmul.ops.choose_kernel
    assert choose(9, 0, 132, torch.float32, 1, 1 << 20, 4096, True) == "warptiled"
    assert choose(7, 5, 40, torch.float32, 64, 64, 64, True) == "none"
    assert choose(7, 5, 40, torch.bfloat16, 64, 64, 64, True) == "none"


def test_choose_kernel_rejects_other_dtypes(pm):
    with pytest.raises(RuntimeError, match="choose_kernel takes float32, float16 or bfloat16"):
        pm._matmul.ops.choose_kernel(9, 0, 132, torch.float64, 1, 1, 1, True)


def test_cpp_and_python_list_the_same_rungs(pm, repo_root):
    """rungs.h's kRungNames and _rungs.RUNGS: the same names in the same order (the
    op entry's error message lists them in its order, the package's in its own)."""
    header = (repo_root / "torch-ext" / "rungs.h").read_text()
    names = re.search(r"kRungNames\[\] = \{(.*?)\};", header, re.S).group(1)
    assert re.findall(r'"([a-z_]+)"', names) == list(pm.KERNELS)


def test_hopper_rungs_need_exactly_9_0(pm, monkeypatch):
    """The sm_90a rungs, wgmma_streamk among them, are unavailable on a newer GPU with a
    reason that says why; the portable skinny rung is available there."""
    rungs = pm._rungs
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (12, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "RTX PRO 6000")
    device = torch.device("cuda", 0)
    for name in ("wgmma", "wgmma_persistent", "wgmma_streamk"):
        assert rungs._capability_problem(rungs.RUNGS[name], device) == (
            "needs compute capability exactly 9.0 (arch-specific code); RTX PRO 6000 is 12.0")
    assert rungs._capability_problem(rungs.RUNGS["splitk"], device) is None
