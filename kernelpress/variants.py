"""The variants kernelpress builds and the toolchain each one needs, in one place.

A variant is a CUDA release and a CPU architecture; the ``kernels`` loader
picks the one that matches the user's torch (its CUDA version, its machine).
Two CUDA releases cover every torch >= 2.10: cu130 serves torch built with
CUDA 13.x; cu124 torch built with CUDA 12.6, 12.8 or 12.9 (the loader takes
an older CUDA 12 variant for a newer CUDA 12 torch). Each comes for x86-64
and for aarch64 (Grace Hopper, Grace Blackwell).

=============  =======================================  =====================  ==========================
variant        nvcc (device code)                       host compiler          aarch64 libraries (folders)
=============  =======================================  =====================  ==========================
cu130-x86_64   the CUDA 13.0 toolkit (PATH, CUDA_HOME)  g++                    -
cu124-x86_64   toolchain folder ``cuda-12.4``           g++                    -
cu130-aarch64  the CUDA 13.0 toolkit (PATH, CUDA_HOME)  aarch64-linux-gnu-g++  libtorch, cudart 13.0
cu124-aarch64  toolchain folder ``cuda-12.4``           aarch64-linux-gnu-g++  libtorch, cudart 12.4
=============  =======================================  =====================  ==========================

No package index has a CUDA 12 nvcc driver, so the ``cuda-12.4`` folder is
assembled from Debian's non-free nvidia-cuda-toolkit 12.4 (nvcc, cicc,
cudafe++, fatbinary, nvlink) and PyPI's CUDA 12 wheels (headers, libcudart,
CCCL). Its ptxas is CUDA 12.6's: ptxas 12.4 serialises the wgmmas of most
Hopper kernels (several times slower), 12.6 of none (see wgmma_streamk.cu,
wgmma_persistent.cu), and 12.8 and 12.9 crash on them. The ``aarch64-*``
folders hold what an aarch64 link needs: libtorch and libcudart from the
aarch64 wheels. Headers are the same for both machines; device code is too.

Every download is pinned by version and SHA-256 and unpacked under
toolchain_root() by ``kernelpress toolchains --install``. The cross
compiler is a Debian package, installed with apt-get (``make toolchains``
does both).
"""

from __future__ import annotations

import hashlib
import io
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path

DEBIAN_MIRROR = "https://deb.debian.org/debian/"
CROSS_PACKAGE = "g++-aarch64-linux-gnu"  # Debian's aarch64 cross compiler (gcc 12 in bookworm)


class ToolchainMissing(RuntimeError):
    """A variant's toolchain is not installed; the message says how to install it."""


@dataclass(frozen=True)
class Wheel:
    """A wheel from the package index, fetched with ``pip download``."""

    requirement: str  # "nvidia-cuda-nvcc-cu12==12.6.85"
    platform: str  # a platform tag of the wheel, for pip's --platform
    sha256: str


@dataclass(frozen=True)
class DebianPackage:
    """A .deb from the Debian mirror's pool, unpacked (never installed)."""

    pool_path: str
    sha256: str


@dataclass(frozen=True)
class Copy:
    """Files of a download to put in a toolchain folder: every file under
    ``source`` (a path inside the wheel or the .deb's data) goes to ``target``
    (a path in the folder), keeping the layout below ``source``."""

    download: Wheel | DebianPackage
    source: str
    target: str


@dataclass(frozen=True)
class Folder:
    """A toolchain folder under toolchain_root(), assembled from downloads."""

    name: str
    provides: str  # for messages
    copies: tuple[Copy, ...]
    files: tuple[tuple[str, str], ...] = ()  # extra files written into the folder: (path, text)

    def path(self, root: Path | None = None) -> Path:
        return (root or toolchain_root()) / self.name

    def stamp(self) -> str:
        """What the folder was assembled from; a folder with another stamp is rebuilt."""
        return "\n".join(sorted({c.download.sha256 for c in self.copies})) + "\n"

    def installed(self, root: Path | None = None) -> bool:
        marker = self.path(root) / ".kernelpress-toolchain"
        return marker.is_file() and marker.read_text() == self.stamp()


_NVCC_DEB = DebianPackage("pool/non-free/n/nvidia-cuda-toolkit/nvidia-cuda-toolkit_12.4.131~12.4.1-2_amd64.deb",
                          "cd5fe85aee38d108b315f408a688641478f2402622a10c677478eb7a6c4e5319")
_NVCC_WHEEL = Wheel("nvidia-cuda-nvcc-cu12==12.4.131", "manylinux2014_x86_64",
                    "e4c9a35435c3b0e36c6397c5696334c9ea6650e524736cbd1c5d345ea099bb04")
_PTXAS_WHEEL = Wheel("nvidia-cuda-nvcc-cu12==12.6.85", "manylinux1_x86_64",
                     "d75d9d74599f4d7c0865df19ed21b739e6cb77a6497a3f73d6f61e8038a765e4")
_CUDART12_X86 = Wheel("nvidia-cuda-runtime-cu12==12.4.127", "manylinux2014_x86_64",
                      "64403288fa2136ee8e467cdc9c9427e0434110899d07c779f25b5c068934faa5")
_CCCL12 = Wheel("nvidia-cuda-cccl-cu12==12.4.127.post1", "manylinux2014_x86_64",
                "2027fa5fc75fbee703bf24e8275a40a605cf94a3e8fef8a7187897d49b34facb")
_CUDART12_ARM = Wheel("nvidia-cuda-runtime-cu12==12.4.127", "manylinux2014_aarch64",
                      "961fe0e2e716a2a1d967aab7caee97512f71767f852f67432d572e36cb3a11f3")
_CUDART13_ARM = Wheel("nvidia-cuda-runtime==13.0.96", "manylinux2014_aarch64",
                      "ef9bcbe90493a2b9d810e43d249adb3d02e98dd30200d86607d8d02687c43f55")
# The torch the project builds against (requirements.txt), for its aarch64 libraries.
_TORCH_ARM = Wheel("torch==2.14.1", "manylinux_2_28_aarch64",
                   "ef1276fd07adb8d463ac402a24ea7482e45c9a42df8ebdac211aa757779200ba")

# nvcc reads nvcc.profile beside itself: where cicc, libdevice, the headers and
# libcudart of this folder are.
_NVCC_PROFILE = """\
TOP                = $(_HERE_)/..
NVVMIR_LIBRARY_DIR = $(TOP)/nvvm/libdevice
PATH              += $(TOP)/nvvm/bin:$(_HERE_):
INCLUDES          += "-I$(TOP)/include" $(_SPACE_)
LIBRARIES          =+ $(_SPACE_) "-L$(TOP)/lib64"
CUDAFE_FLAGS      +=
PTXAS_FLAGS       +=
"""

CUDA_12_4 = Folder(
    name="cuda-12.4",
    provides="nvcc 12.4 with ptxas 12.6, CUDA 12.4 headers and libcudart (x86-64)",
    copies=(
        Copy(_NVCC_DEB, "usr/lib/nvidia-cuda-toolkit/bin/nvcc", "bin/nvcc"),
        *(Copy(_NVCC_DEB, f"usr/bin/{tool}", f"bin/{tool}") for tool in ("cudafe++", "fatbinary", "nvlink", "bin2c")),
        Copy(_NVCC_DEB, "usr/lib/nvidia-cuda-toolkit/bin/crt", "bin/crt"),
        Copy(_NVCC_DEB, "usr/lib/nvidia-cuda-toolkit/bin/cicc", "nvvm/bin/cicc"),
        Copy(_NVCC_DEB, "usr/lib/nvidia-cuda-toolkit/libdevice", "nvvm/libdevice"),
        Copy(_PTXAS_WHEEL, "nvidia/cuda_nvcc/bin/ptxas", "bin/ptxas"),
        Copy(_NVCC_WHEEL, "nvidia/cuda_nvcc/include", "include"),
        Copy(_CUDART12_X86, "nvidia/cuda_runtime/include", "include"),
        Copy(_CCCL12, "nvidia/cuda_cccl/include", "include"),
        Copy(_CUDART12_X86, "nvidia/cuda_runtime/lib/libcudart.so.12", "lib64/libcudart.so.12"),
    ),
    files=(("bin/nvcc.profile", _NVCC_PROFILE),),
)
AARCH64_LIBTORCH = Folder(
    name="aarch64-libtorch-2.14.1",
    provides="aarch64 libtorch 2.14.1, for the link",
    copies=tuple(Copy(_TORCH_ARM, f"torch/lib/{lib}", f"lib/{lib}")
                 for lib in ("libtorch.so", "libtorch_cpu.so", "libc10.so")),
)
AARCH64_CUDART_12 = Folder(
    name="aarch64-cudart-12.4",
    provides="aarch64 libcudart 12.4",
    copies=(Copy(_CUDART12_ARM, "nvidia/cuda_runtime/lib/libcudart.so.12", "lib/libcudart.so.12"),),
)
AARCH64_CUDART_13 = Folder(
    name="aarch64-cudart-13.0",
    provides="aarch64 libcudart 13.0",
    copies=(Copy(_CUDART13_ARM, "nvidia/cu13/lib/libcudart.so.13", "lib/libcudart.so.13"),),
)


@dataclass(frozen=True)
class Variant:
    """A build variant: a CUDA release (major, minor) and a target machine."""

    cuda: tuple[int, int]
    machine: str  # "x86_64" or "aarch64", as platform.machine() says
    cuda_folder: Folder | None  # None: the CUDA toolkit on PATH / CUDA_HOME
    # A cross build's libraries of the target machine: libtorch, libcudart.
    target_folders: tuple[Folder, ...] = ()

    @property
    def name(self) -> str:
        """The short name the command line takes, e.g. ``cu124-aarch64``."""
        return f"cu{self.cuda[0]}{self.cuda[1]}-{self.machine}"

    @property
    def cross(self) -> bool:
        return self.machine != platform.machine()

    @property
    def host_cxx(self) -> str:
        return f"{self.machine}-linux-gnu-g++" if self.cross else os.environ.get("CXX", "g++")

    @property
    def host_cc(self) -> str:
        return f"{self.machine}-linux-gnu-gcc" if self.cross else os.environ.get("CC", "gcc")

    @property
    def folders(self) -> tuple[Folder, ...]:
        return (self.cuda_folder, *self.target_folders) if self.cuda_folder else self.target_folders


VARIANTS = (
    Variant((13, 0), "x86_64", None),
    Variant((12, 4), "x86_64", CUDA_12_4),
    Variant((13, 0), "aarch64", None, (AARCH64_LIBTORCH, AARCH64_CUDART_13)),
    Variant((12, 4), "aarch64", CUDA_12_4, (AARCH64_LIBTORCH, AARCH64_CUDART_12)),
)


def by_name(name: str) -> Variant:
    """The variant of a short name (``cu124-x86_64``) or a full variant
    directory name (``torch-stable-abi210-cu124-x86_64-linux``)."""
    for v in VARIANTS:
        if name == v.name or name.endswith(f"-{v.name}-linux"):
            return v
    known = ", ".join(v.name for v in VARIANTS)
    raise ValueError(f"unknown variant {name!r}: kernelpress builds {known}")


def serves(cuda: tuple[int, int], machine: str, stable_abi: tuple[int, int]) -> str:
    """Which torch builds the kernels loader gives a variant to: torch at or past
    the stable ABI's version, built with CUDA of the same major release and a
    minor release at or past the variant's, on the same machine."""
    newer = f" or a newer {cuda[0]}.x" if cuda[1] < 9 else ""
    return (f"torch >= {stable_abi[0]}.{stable_abi[1]} built with CUDA {cuda[0]}.{cuda[1]}{newer}, "
            f"on {MACHINE_NAMES.get(machine, machine)} Linux")


MACHINE_NAMES = {"x86_64": "x86-64", "aarch64": "aarch64 (Grace)"}


def toolchain_root() -> Path:
    """Where toolchain folders live: $KERNELPRESS_TOOLCHAINS, else
    ``$XDG_CACHE_HOME/kernelpress/toolchains`` (``~/.cache``): shared by every
    checkout and kept by ``make clean``."""
    if os.environ.get("KERNELPRESS_TOOLCHAINS"):
        return Path(os.environ["KERNELPRESS_TOOLCHAINS"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kernelpress" / "toolchains"


def missing(variant: Variant) -> list[str]:
    """What of the variant's toolchain is not installed, each with how to install it."""
    from .toolchain import ToolchainError, find_nvcc, nvcc_version

    problems = []
    if variant.cuda_folder is None:
        try:
            nvcc = find_nvcc()
            version = nvcc_version(nvcc)
        except ToolchainError as e:
            problems.append(f"{e} (CUDA {variant.cuda[0]}.{variant.cuda[1]})")
        else:
            if version != variant.cuda:
                problems.append(f"{nvcc} is CUDA {version[0]}.{version[1]}, this variant needs "
                                f"{variant.cuda[0]}.{variant.cuda[1]}: put its nvcc on PATH or set CUDA_HOME")
    for folder in variant.folders:
        if not folder.installed():
            problems.append(f"toolchain folder {folder.name} ({folder.provides}) is not in {toolchain_root()}: "
                            "run `kernelpress toolchains --install` (or `make toolchains`)")
    if variant.cross and shutil.which(variant.host_cxx) is None:
        problems.append(f"{variant.host_cxx} not found: it is Debian's {CROSS_PACKAGE}, "
                        f"`apt-get install {CROSS_PACKAGE}` (or `make toolchains`)")
    return problems


def require(variant: Variant) -> None:
    """Raise ToolchainMissing naming what to install unless the variant's toolchain is complete."""
    problems = missing(variant)
    if problems:
        raise ToolchainMissing(f"variant {variant.name} cannot be built: " + "; ".join(problems))


# ----------------------------------------------------------------------------- installing


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _fetch(download: Wheel | DebianPackage, into: Path, out) -> Path:
    """Download into ``into`` (once) and verify its SHA-256; return the file."""
    into.mkdir(parents=True, exist_ok=True)
    if isinstance(download, DebianPackage):
        path = into / download.pool_path.rsplit("/", 1)[1]
        if not path.is_file() or _sha256(path) != download.sha256:
            print(f"kernelpress: downloading {DEBIAN_MIRROR}{download.pool_path}", file=out, flush=True)
            partial = path.with_suffix(".part")
            try:
                with urllib.request.urlopen(DEBIAN_MIRROR + download.pool_path) as response, open(partial, "wb") as f:
                    shutil.copyfileobj(response, f, 1 << 20)
            except OSError as e:  # URLError and HTTPError are OSErrors
                raise ToolchainMissing(f"cannot download {DEBIAN_MIRROR}{download.pool_path}: {e}") from None
            os.replace(partial, path)
    else:
        name, version = download.requirement.split("==")
        stem = f"{name.replace('-', '_')}-{version}-"
        found = [p for p in into.glob(f"{stem}*{download.platform}*.whl") if _sha256(p) == download.sha256]
        if found:
            return found[0]
        print(f"kernelpress: downloading {download.requirement} ({download.platform})", file=out, flush=True)
        # No constraints file: the machine's pip configuration may pin packages for
        # its own Python, and these wheels are for another platform.
        env = dict(os.environ, PIP_CONSTRAINT="")
        pip = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                              "--platform", download.platform, "--python-version", "3.11", "--dest", str(into),
                              download.requirement], env=env)
        if pip.returncode != 0:
            raise ToolchainMissing(f"pip could not download {download.requirement} for {download.platform} "
                                   f"(exit {pip.returncode}; its message is above)")
        found = sorted(into.glob(f"{stem}*{download.platform}*.whl"))
        if not found:
            raise ToolchainMissing(f"pip downloaded no {download.platform} wheel of {download.requirement}")
        path = found[0]
    actual = _sha256(path)
    if actual != download.sha256:
        raise ToolchainMissing(f"{path.name}: SHA-256 {actual}, expected {download.sha256}")
    return path


def _deb_data(deb: Path) -> tarfile.TarFile:
    """The data archive of a .deb (an ar archive of control and data tarballs)."""
    raw = deb.read_bytes()
    if not raw.startswith(b"!<arch>\n"):
        raise ToolchainMissing(f"{deb.name} is not a Debian package")
    offset = 8
    while offset + 60 <= len(raw):
        header = raw[offset:offset + 60]
        name, size = header[:16].decode().strip().rstrip("/"), int(header[48:58])
        body = raw[offset + 60:offset + 60 + size]
        if name.startswith("data.tar"):
            return tarfile.open(fileobj=io.BytesIO(body))
        offset += 60 + size + (size % 2)
    raise ToolchainMissing(f"{deb.name} has no data archive")


def _copy_members(names_and_readers, copy: Copy, folder: Path) -> int:
    """Write the members under copy.source into folder/copy.target; return how many."""
    source = copy.source.strip("/")
    count = 0
    for name, read, executable in names_and_readers:
        name = name.lstrip("./")
        if name != source and not name.startswith(source + "/"):
            continue
        if name.endswith("__init__.py"):
            continue
        target = folder / copy.target / name[len(source):].lstrip("/") if name != source else folder / copy.target
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(read())
        if executable:
            target.chmod(0o755)
        count += 1
    return count


def install(folder: Folder, root: Path | None = None, out=sys.stdout) -> None:
    """Download and assemble a toolchain folder (a no-op when it is already there)."""
    root = root or toolchain_root()
    if folder.installed(root):
        print(f"kernelpress: toolchain {folder.name}: installed", file=out, flush=True)
        return
    downloads = root / "downloads"
    final = folder.path(root)
    root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=root))
    try:
        for download in dict.fromkeys(c.download for c in folder.copies):
            path = _fetch(download, downloads, out)
            copies = [c for c in folder.copies if c.download == download]
            if isinstance(download, DebianPackage):
                with _deb_data(path) as tar:
                    members = [m for m in tar.getmembers() if m.isfile()]
                    entries = [(m.name, (lambda m=m: tar.extractfile(m).read()), bool(m.mode & 0o111))
                               for m in members]
                    counts = [_copy_members(entries, c, work) for c in copies]
            else:
                with zipfile.ZipFile(path) as whl:
                    entries = [(i.filename, (lambda i=i: whl.read(i)), (i.external_attr >> 16) & 0o111 != 0
                                or "/bin/" in i.filename) for i in whl.infolist() if not i.is_dir()]
                    counts = [_copy_members(entries, c, work) for c in copies]
            for c, n in zip(copies, counts):
                if n == 0:
                    raise ToolchainMissing(f"{path.name} has nothing under {c.source}")
        for rel, text in folder.files:
            (work / rel).parent.mkdir(parents=True, exist_ok=True)
            (work / rel).write_text(text)
        (work / ".kernelpress-toolchain").write_text(folder.stamp())
        if final.exists():
            shutil.rmtree(final)
        os.replace(work, final)
        print(f"kernelpress: toolchain {folder.name}: installed in {final}", file=out, flush=True)
    finally:
        if work.exists():
            shutil.rmtree(work)
