"""The compilers and libraries a build uses: nvcc, the host C++ compiler, torch, Python headers."""

from __future__ import annotations

import os
import platform
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
    torch_lib: Path  # libtorch of the target machine
    python_include: Path
    cudart: Path  # the libcudart the extension links, of the target machine
    machine: str  # the target machine, as platform.machine() names it
    cross: bool  # host code compiled for another machine than this one

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


def _cudart_in(lib_dirs: list[Path]) -> Path:
    for directory in lib_dirs:
        found = sorted(directory.glob("libcudart.so*"))
        if found:
            return found[0]
    raise ToolchainError(f"libcudart not found in {', '.join(str(d) for d in lib_dirs)}")


def detect(variant=None) -> Toolchain:
    """Find every tool a build of ``variant`` (a variants.Variant; default: this
    machine with the CUDA toolkit on PATH) needs, or raise ToolchainError naming
    the missing one and how to install it."""
    from . import variants

    try:
        import torch
    except ImportError as e:
        raise ToolchainError("torch is not installed: the build compiles against its headers") from e
    if variant is not None:
        try:
            variants.require(variant)  # the folders, the cross compiler, the CUDA on PATH's release
        except variants.ToolchainMissing as e:
            raise ToolchainError(str(e)) from None
    folder = variant.cuda_folder.path() if variant is not None and variant.cuda_folder else None
    nvcc = folder / "bin" / "nvcc" if folder else find_nvcc()
    version = nvcc_version(nvcc)
    # No variant named: this machine's, with whatever CUDA is on PATH.
    variant = variant or variants.Variant(version, platform.machine(), None)
    cuda_home = folder or cuda_home_of(nvcc)
    torch_dir = Path(torch.__file__).parent
    major, minor = (int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
    python_include = Path(sysconfig.get_paths()["include"])
    if not (python_include / "Python.h").is_file():
        raise ToolchainError(f"Python headers not found in {python_include}")
    if variant.cross:
        target_libs = [target.path() / "lib" for target in variant.target_folders]
        torch_lib = next(d for d in target_libs if (d / "libtorch.so").is_file())
        cudart = _cudart_in(target_libs)
    else:
        lib_dirs = [cuda_home / "lib64", cuda_home / "targets" / "x86_64-linux" / "lib"]
        torch_lib, cudart = torch_dir / "lib", _cudart_in(lib_dirs)
    return Toolchain(
        nvcc=nvcc,
        cuda_version=version,
        cuda_home=cuda_home,
        cxx=variant.host_cxx,
        cc=variant.host_cc,
        ninja=find_ninja(),
        torch_version=(major, minor),
        torch_cxx11_abi=bool(torch.compiled_with_cxx11_abi()),
        torch_include=(torch_dir / "include", torch_dir / "include" / "torch" / "csrc" / "api" / "include"),
        torch_lib=torch_lib,
        python_include=python_include,
        cudart=cudart,
        machine=variant.machine,
        cross=variant.cross,
    )
