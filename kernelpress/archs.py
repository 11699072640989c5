"""CUDA capabilities as written in build.toml, and the nvcc flags and SASS they imply.

``"8.0"`` is machine code for sm_80; ``"9.0a"`` the arch-specific sm_90a
(needed for wgmma and setmaxnreg); ``"10.0f"`` the family target;
``"12.0+PTX"`` machine code for sm_120 plus PTX the driver can compile for
newer GPUs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_ARCH = re.compile(r"^(\d+)\.(\d)([af]?)(\+PTX)?$")


@dataclass(frozen=True)
class CudaArch:
    major: int
    minor: int
    suffix: str  # "", "a" or "f"
    ptx: bool

    @classmethod
    def parse(cls, text: str) -> "CudaArch":
        m = _ARCH.match(text)
        if m is None:
            raise ValueError(f"not a CUDA capability: {text!r} (expected e.g. '8.0', '9.0a', '12.0+PTX')")
        return cls(int(m.group(1)), int(m.group(2)), m.group(3), m.group(4) is not None)

    @property
    def sm(self) -> str:
        """The SASS target, e.g. ``sm_90a``."""
        return f"sm_{self.major}{self.minor}{self.suffix}"

    @property
    def compute(self) -> str:
        """The virtual (PTX) target, e.g. ``compute_90a``."""
        return f"compute_{self.major}{self.minor}{self.suffix}"

    def gencode_flags(self) -> list[str]:
        flags = [f"-gencode=arch={self.compute},code={self.sm}"]
        if self.ptx:
            flags.append(f"-gencode=arch={self.compute},code={self.compute}")
        return flags

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}{self.suffix}{'+PTX' if self.ptx else ''}"


# The first CUDA release whose nvcc compiles for each compute capability we
# use (and for the family suffix "f"); capabilities not listed build with any
# CUDA 12 or 13. A variant built with an older CUDA leaves the newer ones
# out, as kernel-builder does per toolkit.
_FIRST_CUDA = {(10, 0): (12, 8), (10, 1): (12, 8), (10, 3): (12, 9), (12, 0): (12, 8), (12, 1): (12, 9)}
_FIRST_CUDA_FAMILY = (12, 9)


def builds_with(arch: CudaArch, cuda: tuple[int, int]) -> bool:
    """Whether nvcc of CUDA ``cuda`` (major, minor) compiles for ``arch``."""
    if arch.suffix == "f" and cuda < _FIRST_CUDA_FAMILY:
        return False
    return cuda >= _FIRST_CUDA.get((arch.major, arch.minor), (0, 0))


def archs_for_cuda(archs: list[str] | tuple[str, ...], cuda: tuple[int, int]) -> list[str]:
    """The capabilities of a build.toml list that CUDA ``cuda`` builds, in order.

    Where the list's ``+PTX`` capability is too new for that CUDA, the newest
    plain capability left carries the PTX instead, so GPUs newer than the
    variant's machine code still get a kernel (compiled by their driver).
    ``["8.0", "9.0", "10.0", "12.0+PTX"]`` with CUDA 12.4 gives ``["8.0", "9.0+PTX"]``.
    """
    parsed = [CudaArch.parse(a) for a in archs]
    kept = [a for a in parsed if builds_with(a, cuda)]
    if any(a.ptx for a in parsed) and not any(a.ptx for a in kept):
        plain = [a for a in kept if not a.suffix]
        if plain:
            newest = max(plain, key=lambda a: (a.major, a.minor))
            kept = [CudaArch(a.major, a.minor, a.suffix, True) if a is newest else a for a in kept]
    return [str(a) for a in kept]


def gencode_flags(archs: list[str] | tuple[str, ...]) -> list[str]:
    return [flag for arch in archs for flag in CudaArch.parse(arch).gencode_flags()]


def describe(archs: list[str] | tuple[str, ...]) -> str:
    """A short list for progress lines, e.g. ``sm_80 sm_90 sm_120+PTX``."""
    parsed = [CudaArch.parse(a) for a in archs]
    return " ".join(a.sm + ("+PTX" if a.ptx else "") for a in parsed)
