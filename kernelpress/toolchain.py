"""The compilers and libraries a build uses: nvcc, the host C++ compiler, torch, Python headers."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sysconfig
from dataclasses import dataclass
from pathlib import Path


class ToolchainError(RuntimeError):
    """A tool the build needs is missing or unusable."""


@dataclass(frozen=True)
class Toolchain:
    nvcc: Path
    cuda_version: tuple[int, int]
    cuda_home: Path
    cxx: str
    cc: str
    ninja: Path
    torch_version: tuple[int, int]
    torch_cxx11_abi: bool
    torch_include: tuple[Path, ...]
    torch_lib: Path
    python_include: Path

    @property
    def cuda_tag(self) -> str:
        return f"cu{self.cuda_version[0]}{self.cuda_version[1]}"


def find_nvcc() -> Path:
    candidates = [os.environ.get("NVCC"), shutil.which("nvcc")]
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if cuda_home:
        candidates.insert(0, str(Path(cuda_home) / "bin" / "nvcc"))
    candidates.append("/usr/local/cuda/bin/nvcc")
    for c in candidates:
        if c and Path(c).is_file() and os.access(c, os.X_OK):
            return Path(c)
    raise ToolchainError("nvcc not found: put it on PATH or set CUDA_HOME")


def nvcc_version(nvcc: Path) -> tuple[int, int]:
    out = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, check=True).stdout
    m = re.search(r"release (\d+)\.(\d+)", out)
    if m is None:
        raise ToolchainError(f"cannot read the CUDA version from `{nvcc} --version`:\n{out}")
    return int(m.group(1)), int(m.group(2))


def cuda_home_of(nvcc: Path) -> Path:
    """The toolkit root: nvcc may be a wrapper script outside it, so ask nvcc itself."""
    out = subprocess.run(
        [str(nvcc), "-dryrun", "-E", "-x", "cu", "/dev/null"], capture_output=True, text=True
    ).stderr
    m = re.search(r"TOP=(\S+)", out)
    if m:
        return Path(m.group(1)).resolve()
    return nvcc.resolve().parent.parent


def find_ninja() -> Path:
    try:
        import ninja

        path = Path(ninja.BIN_DIR) / "ninja"
        if path.is_file():
            return path
    except ImportError:
        pass
    found = shutil.which("ninja")
    if found is None:
        raise ToolchainError("ninja not found: pip install ninja")
    return Path(found)


def detect() -> Toolchain:
    """Find every tool a build needs, or raise ToolchainError naming the missing one."""
    try:
        import torch
    except ImportError as e:
        raise ToolchainError("torch is not installed: the build compiles against its headers") from e
    nvcc = find_nvcc()
    torch_dir = Path(torch.__file__).parent
    major, minor = (int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
    python_include = Path(sysconfig.get_paths()["include"])
    if not (python_include / "Python.h").is_file():
        raise ToolchainError(f"Python headers not found in {python_include}")
    return Toolchain(
        nvcc=nvcc,
        cuda_version=nvcc_version(nvcc),
        cuda_home=cuda_home_of(nvcc),
        cxx=os.environ.get("CXX", "g++"),
        cc=os.environ.get("CC", "gcc"),
        ninja=find_ninja(),
        torch_version=(major, minor),
        torch_cxx11_abi=bool(torch.compiled_with_cxx11_abi()),
        torch_include=(torch_dir / "include", torch_dir / "include" / "torch" / "csrc" / "api" / "include"),
        torch_lib=torch_dir / "lib",
        python_include=python_include,
    )
