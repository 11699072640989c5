"""Where the built library's portable images record timelines, read from their SASS.

The sm_80 and sm_90 images have an instrumented kernel of ``tiled`` and ``persistent`` beside
each plain one, which carries no recording code; the images for compute capability 10.0 and
newer record in the plain kernel when a timeline is asked for, and their instrumented kernels
are empty (csrc/tensor_core_tile.cuh, kPlainKernelRecords). launch_tiled and
launch_persistent pick the kernel by that rule (tc::records_in_plain_kernel), so an image
that broke it would record nothing, or fault."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from kernelpress.check import find_cuobjdump

REPO = Path(__file__).resolve().parent.parent
BUILT = sorted(REPO.glob("build/torch-*-cu13*-linux/*.so"))

# A kernel's symbol: the rung, then its template's bool arguments (B_KMAJOR, TIMELINE and,
# for persistent, SPLIT) at the end of the argument list.
KERNEL = re.compile(r"(tiled|persistent)_kernelI13__nv_bfloat16NS_2tc9TileShapeILi64ELi64E.*?((?:Lb[01]E)+)EEv")
TIMER = "SR_GLOBALTIMER"


def cuobjdump(*args: str) -> str:
    tool = find_cuobjdump()
    assert tool is not None, "nvidia-cuda-cuobjdump is a kernelpress dependency"
    env = {**os.environ, "PATH": f"{tool.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    out = subprocess.run([str(tool), *args], capture_output=True, text=True, env=env, check=True)
    return out.stdout


def small_tile_kernels(so: Path, arch: str) -> dict[tuple[str, bool], str]:
    """{(rung, instrumented): symbol} of the bf16, 64x64-tile, K-major B kernels (not split)."""
    found = {}
    for symbol in re.findall(r"\S*_kernelI\S+", cuobjdump("--dump-elf-symbols", "--gpu-architecture", arch, str(so))):
        match = KERNEL.search(symbol)
        if match is None:
            continue
        flags = re.findall(r"Lb([01])E", match[2])
        if flags[0] == "1" and (len(flags) == 2 or flags[2] == "0"):
            found[(match[1], flags[1] == "1")] = symbol
    return found


def sass_by_function(so: Path, arch: str, symbols: list[str]) -> dict[str, str]:
    listing = cuobjdump("--dump-sass", "--gpu-architecture", arch, "--function", ",".join(symbols), str(so))
    return {chunk.split(None, 1)[0]: chunk for chunk in re.split(r"^\s*Function : ", listing, flags=re.M)[1:]}


@pytest.mark.skipif(not BUILT, reason="no CUDA 13 build in build/ (make build)")
@pytest.mark.parametrize("arch, plain_records", [("sm_90", False), ("sm_100", True), ("sm_120", True)])
def test_timelines_recorded_where_the_launch_expects(arch, plain_records):
    kernels = small_tile_kernels(BUILT[0], arch)
    assert sorted(kernels) == [("persistent", False), ("persistent", True), ("tiled", False), ("tiled", True)], kernels
    sass = sass_by_function(BUILT[0], arch, list(kernels.values()))
    for (rung, instrumented), symbol in kernels.items():
        code = sass[symbol]
        instructions = len(re.findall(r"/\*[0-9a-f]{4,}\*/", code))
        if instrumented and plain_records:
            assert "BPT.TRAP" in code and TIMER not in code and instructions < 32, f"{rung} {arch}: not a stub"
        else:
            assert instructions > 1000, f"{rung} {arch} instrumented={instrumented}: {instructions} instructions"
            reads_timer = TIMER in code
            assert reads_timer == (instrumented or plain_records), \
                f"{rung} {arch} instrumented={instrumented}: reads the global timer: {reads_timer}"
