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


def gencode_flags(archs: list[str] | tuple[str, ...]) -> list[str]:
    return [flag for arch in archs for flag in CudaArch.parse(arch).gencode_flags()]


def describe(archs: list[str] | tuple[str, ...]) -> str:
    """A short list for progress lines, e.g. ``sm_80 sm_90 sm_120+PTX``."""
    parsed = [CudaArch.parse(a) for a in archs]
    return " ".join(a.sm + ("+PTX" if a.ptx else "") for a in parsed)
