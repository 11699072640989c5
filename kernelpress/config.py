"""Reading ``build.toml``.

The file is validated by the ``kernels`` package's own parser (the one
kernel-builder uses), then read into small dataclasses that the builder needs.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path


class ConfigError(ValueError):
    """build.toml is missing, invalid, or asks for something kernelpress cannot build."""


@dataclass(frozen=True)
class KernelSection:
    """One ``[kernel.<name>]`` section: sources that share an arch list."""

    name: str
    backend: str
    src: tuple[str, ...]
    cuda_capabilities: tuple[str, ...]
    include: tuple[str, ...] = ()
    cuda_flags: tuple[str, ...] = ()

    @property
    def compiled_sources(self) -> tuple[str, ...]:
        return tuple(s for s in self.src if s.endswith((".cu", ".cpp", ".cc", ".c")))

    def archs_for(self, cuda: tuple[int, int]) -> list[str]:
        """This section's capabilities that CUDA ``cuda`` compiles (archs.archs_for_cuda)."""
        from .archs import archs_for_cuda

        return archs_for_cuda(self.cuda_capabilities, cuda)


@dataclass(frozen=True)
class TorchSection:
    """The ``[torch]`` section: the binding sources and the stable-ABI target."""

    src: tuple[str, ...]
    include: tuple[str, ...] = ()
    pyext: tuple[str, ...] = ("py", "json")
    stable_abi: str | None = None  # "2.10" or None for a versioned build

    @property
    def compiled_sources(self) -> tuple[str, ...]:
        return tuple(s for s in self.src if s.endswith((".cpp", ".cc", ".cu")))

    @property
    def stable_abi_version(self) -> tuple[int, int] | None:
        if self.stable_abi is None:
            return None
        major, minor = self.stable_abi.split(".")[:2]
        return int(major), int(minor)


@dataclass(frozen=True)
class BuildConfig:
    """What kernelpress needs from a repository's build.toml."""

    repo: Path
    name: str
    version: int
    license: str
    backends: tuple[str, ...]
    torch: TorchSection
    kernels: tuple[KernelSection, ...]
    hub_repo_id: str | None = None
    python_depends: tuple[str, ...] = field(default_factory=tuple)

    @property
    def python_name(self) -> str:
        return self.name.replace("-", "_")

    @property
    def package_dir(self) -> Path:
        return self.repo / "torch-ext" / self.python_name

    @property
    def cuda_archs(self) -> list[str]:
        """Every declared CUDA capability, in order of first appearance."""
        archs: list[str] = []
        for section in self.kernels:
            for arch in section.cuda_capabilities:
                if arch not in archs:
                    archs.append(arch)
        return archs

    def cuda_archs_for(self, cuda: tuple[int, int]) -> list[str]:
        """The capabilities a build with CUDA ``cuda`` (major, minor) has, in
        order of first appearance: each section's that this CUDA compiles
        (archs.archs_for_cuda)."""
        archs: list[str] = []
        for section in self.kernels:
            for arch in section.archs_for(cuda):
                if arch not in archs:
                    archs.append(arch)
        return archs


def _stable_abi(torch_table: dict) -> str | None:
    value = torch_table.get("stable-abi")
    if value is None:
        return None
    if isinstance(value, dict):  # [torch.stable-abi] cuda = "2.10"
        value = value.get("cuda")
        if value is None:
            return None
    return str(value)


def load_config(repo: Path | str) -> BuildConfig:
    """Validate ``<repo>/build.toml`` with kernels' parser and read it.

    Raises ConfigError naming the problem when the file is missing or invalid.
    """
    repo = Path(repo).resolve()
    path = repo / "build.toml"
    if not path.is_file():
        raise ConfigError(f"no build.toml in {repo}")
    try:
        from kernels._rust import Build

        Build.open(repo)
    except ValueError as e:
        raise ConfigError(f"{path} is not a valid build.toml: {e}") from e
    raw = tomllib.loads(path.read_text())

    general = raw["general"]
    torch_table = raw.get("torch")
    if torch_table is None:
        raise ConfigError(f"{path}: kernelpress builds torch extensions and needs a [torch] section")
    torch = TorchSection(
        src=tuple(torch_table.get("src", ())),
        include=tuple(torch_table.get("include", ())),
        pyext=tuple(torch_table.get("pyext", ("py", "json"))),
        stable_abi=_stable_abi(torch_table),
    )
    sections = []
    for name, table in raw.get("kernel", {}).items():
        backend = table.get("backend", "cuda")
        if backend != "cuda":
            raise ConfigError(f"{path}: [kernel.{name}] has backend {backend!r}; kernelpress builds only cuda")
        caps = table.get("cuda-capabilities")
        if not caps:
            raise ConfigError(f"{path}: [kernel.{name}] needs cuda-capabilities")
        sections.append(
            KernelSection(
                name=name,
                backend=backend,
                src=tuple(table.get("src", ())),
                cuda_capabilities=tuple(caps),
                include=tuple(table.get("include", ())),
                cuda_flags=tuple(table.get("cuda-flags", ())),
            )
        )
    backends = tuple(general.get("backends", ()))
    if "cuda" not in backends:
        raise ConfigError(f"{path}: kernelpress builds the cuda backend, but backends = {list(backends)}")
    missing = [
        src
        for src in (*torch.src, *(s for k in sections for s in k.src))
        if not (repo / src).is_file()
    ]
    if missing:
        raise ConfigError(f"{path}: source files not found: {', '.join(missing)}")
    return BuildConfig(
        repo=repo,
        name=general["name"],
        version=int(general["version"]),
        license=general.get("license", ""),
        backends=backends,
        torch=torch,
        kernels=tuple(sections),
        hub_repo_id=general.get("hub", {}).get("repo-id"),
        python_depends=tuple(general.get("python-depends", ())),
    )
