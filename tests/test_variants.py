"""The variants kernelpress builds (kernelpress/variants.py): which torch builds they
serve, through the kernels loader's own resolution; the capabilities each CUDA
release builds; toolchain errors and installation; and smoke builds of the CUDA 12.4
and aarch64 variants (their toolchains are installed by `make toolchains`, which
`make test` runs first)."""

from __future__ import annotations

import hashlib
import io
import tarfile
import zipfile
from pathlib import Path

import pytest
from kernel_abi_check import ObjectFile
from kernels.backends import CUDA
from kernels.variants import VariantAccepted, _resolve_variant_for_system, parse_variant
from packaging.version import Version

from kernelpress import cli, variants
from kernelpress.archs import archs_for_cuda
from kernelpress.build import build, planned_variant_names
from kernelpress.check import elf_machine, embedded_cuda_code, find_cuobjdump, sm90a_summary
from kernelpress.config import load_config
from kernelpress.toolchain import ToolchainError, detect

# torch releases with the 2.10 stable ABI up to the newest on the package index, and
# the CUDA releases torch is built with for them.
TORCH_RELEASES = [f"2.{minor}" for minor in range(10, 16)]
TORCH_CUDA = ["12.6", "12.8", "12.9", "13.0", "13.2"]
MACHINES = ["x86_64", "aarch64"]
HOPPER_SOURCES = ("csrc/wgmma.cu", "csrc/wgmma_persistent.cu", "csrc/wgmma_streamk.cu")


@pytest.mark.parametrize("machine", MACHINES)
@pytest.mark.parametrize("torch_cuda", TORCH_CUDA)
@pytest.mark.parametrize("torch_release", TORCH_RELEASES)
def test_the_variants_serve_every_torch_build(repo_root, torch_release, torch_cuda, machine):
    names = planned_variant_names(load_config(repo_root))
    accepted, trace = _resolve_variant_for_system(
        variants=[parse_variant(n) for n in names], selected_backend=CUDA(version=Version(torch_cuda)),
        cpu=machine, os="linux", torch_version=Version(torch_release), torch_cxx11_abi=True,
        tvm_ffi_version=None)
    assert accepted, f"torch {torch_release} cu{torch_cuda} on {machine}: {trace}"
    chosen = accepted[0].variant_str
    expected = "cu124" if torch_cuda.startswith("12.") else "cu130"
    assert chosen == f"torch-stable-abi210-{expected}-{machine}-linux"


def test_variant_names_parse_and_match_the_builder(repo_root):
    names = planned_variant_names(load_config(repo_root))
    assert len(set(names)) == len(variants.VARIANTS) == 4
    for name, variant in zip(names, variants.VARIANTS):
        assert parse_variant(name).variant_str == name
        assert variants.by_name(name) is variant and variants.by_name(variant.name) is variant
    with pytest.raises(ValueError, match="unknown variant 'cu118-x86_64'.*cu130-x86_64"):
        variants.by_name("cu118-x86_64")


def test_capabilities_each_cuda_release_builds():
    portable = ["8.0", "9.0", "10.0", "12.0+PTX"]
    assert archs_for_cuda(portable, (13, 0)) == portable
    assert archs_for_cuda(portable, (12, 8)) == portable
    # 12.4 has no Blackwell target: the PTX moves to sm_90, which Blackwell's driver compiles.
    assert archs_for_cuda(portable, (12, 4)) == ["8.0", "9.0+PTX"]
    assert archs_for_cuda(["9.0a"], (12, 4)) == ["9.0a"]
    assert archs_for_cuda(["10.0f", "9.0"], (12, 8)) == ["9.0"]
    assert archs_for_cuda(["10.0f", "9.0"], (12, 9)) == ["10.0f", "9.0"]
    config = load_config(Path(__file__).resolve().parent.parent)
    assert config.cuda_archs_for((12, 4)) == ["8.0", "9.0+PTX", "9.0a"]


def test_missing_toolchain_names_what_provides_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KERNELPRESS_TOOLCHAINS", str(tmp_path / "none"))
    monkeypatch.setenv("PATH", str(tmp_path))  # no cross compiler, no nvcc
    cu124_arm = variants.by_name("cu124-aarch64")
    problems = " ".join(variants.missing(cu124_arm))
    assert "cuda-12.4" in problems and "aarch64-libtorch-2.14.1" in problems
    assert "kernelpress toolchains --install" in problems
    assert "aarch64-linux-gnu-g++ not found" in problems and "apt-get install g++-aarch64-linux-gnu" in problems
    with pytest.raises(ToolchainError, match="variant cu124-x86_64 cannot be built: toolchain folder cuda-12.4"):
        detect(variants.by_name("cu124-x86_64"))
    assert cli.main(["build", str(tmp_path), "--variant", "cu124-aarch64"]) == 1
    assert cli.main(["toolchains", "--variant", "cu124-x86_64"]) == 1
    out, err = capsys.readouterr()
    assert "cu124-x86_64   missing: toolchain folder cuda-12.4" in out


def _deb(members: dict[str, bytes]) -> bytes:
    """A minimal .deb: an ar archive whose data.tar.xz holds `members`."""
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:xz") as tar:
        for name, body in members.items():
            info = tarfile.TarInfo(f"./{name}")
            info.size, info.mode = len(body), 0o755
            tar.addfile(info, io.BytesIO(body))
    out = b"!<arch>\n"
    for name, body in (("debian-binary", b"2.0\n"), ("data.tar.xz", data.getvalue())):
        out += f"{name + '/':<16}{0:<12}{0:<6}{0:<6}{100644:<8}{len(body):<10}`\n".encode() + body
        out += b"\n" if len(body) % 2 else b""
    return out


def test_install_assembles_a_folder_from_verified_downloads(tmp_path, monkeypatch):
    mirror = tmp_path / "mirror"
    (mirror / "pool").mkdir(parents=True)
    deb_bytes = _deb({"usr/bin/tool": b"#!/bin/sh\necho tool\n", "usr/lib/x/a.h": b"a", "usr/lib/x/sub/b.h": b"b"})
    (mirror / "pool" / "t.deb").write_bytes(deb_bytes)
    monkeypatch.setattr(variants, "DEBIAN_MIRROR", mirror.as_uri() + "/")
    root = tmp_path / "toolchains"
    wheel = root / "downloads" / "fake_pkg-1.0-py3-none-anyplat.whl"  # already downloaded: pip is not asked
    wheel.parent.mkdir(parents=True)
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("fake/lib/libx.so.1", b"ELF")
        z.writestr("fake/lib/__init__.py", b"")
    deb = variants.DebianPackage("pool/t.deb", hashlib.sha256(deb_bytes).hexdigest())
    whl = variants.Wheel("fake-pkg==1.0", "anyplat", hashlib.sha256(wheel.read_bytes()).hexdigest())
    folder = variants.Folder("demo", "a demo", (
        variants.Copy(deb, "usr/bin/tool", "bin/tool"), variants.Copy(deb, "usr/lib/x", "include"),
        variants.Copy(whl, "fake/lib", "lib")), (("etc/profile", "x = 1\n"),))
    assert not folder.installed(root)
    variants.install(folder, root, out=io.StringIO())
    path = folder.path(root)
    assert (path / "bin" / "tool").read_bytes().startswith(b"#!/bin/sh") and (path / "bin" / "tool").stat().st_mode & 0o111
    assert (path / "include" / "a.h").read_bytes() == b"a" and (path / "include" / "sub" / "b.h").read_bytes() == b"b"
    assert (path / "lib" / "libx.so.1").read_bytes() == b"ELF" and not (path / "lib" / "__init__.py").exists()
    assert (path / "etc" / "profile").read_text() == "x = 1\n" and folder.installed(root)

    bad = variants.DebianPackage("pool/t.deb", "0" * 64)
    broken = variants.Folder("broken", "bad hash", (variants.Copy(bad, "usr/bin/tool", "bin/tool"),))
    with pytest.raises(variants.ToolchainMissing, match="t.deb: SHA-256 .*, expected 0000"):
        variants.install(broken, root, out=io.StringIO())
    assert not broken.path(root).exists()


# --- smoke builds: the toolchains and flags of the variants CI does not build whole ---


def _check_library(library: Path, machine: str, archs: list[str]) -> dict[str, int]:
    """Asserts on a smoke build's library; returns its sm_90a summary counts (or {})."""
    assert elf_machine(library) == machine
    obj = ObjectFile(library)
    assert not obj.check_manylinux("manylinux_2_28") and not obj.check_python_abi("3.9")
    tool = find_cuobjdump()
    sass, ptx = embedded_cuda_code(library, tool)
    wanted = {f"sm_{a.split('+')[0].replace('.', '')}" for a in archs}
    assert wanted <= sass, (wanted, sass)
    if "sm_90a" not in sass:
        return {}
    summary, error = sm90a_summary(library, tool)
    assert error is None
    assert not summary.serialized, f"ptxas serialized wgmmas in {summary.serialized}"
    return summary.counts


@pytest.mark.slow
def test_cu124_hopper_smoke_build_has_pipelined_wgmmas(repo_root):
    result = build(repo_root, variant=variants.by_name("cu124-x86_64"), jobs=2, only=HOPPER_SOURCES,
                   out=io.StringIO())
    counts = _check_library(result.library, "x86_64", ["9.0a"])
    assert counts["HGMMA"] > 0 and counts["UTMALDG"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("name", ["cu130-aarch64", "cu124-aarch64"])
def test_aarch64_smoke_build_links_a_manylinux_aarch64_library(repo_root, name):
    variant = variants.by_name(name)
    result = build(repo_root, variant=variant, jobs=2, only=("csrc/naive.cu",), out=io.StringIO())
    portable = next(s for s in load_config(repo_root).kernels if "csrc/naive.cu" in s.src)
    _check_library(result.library, "aarch64", portable.archs_for(variant.cuda))
    assert f"PyInit_{result.op_id}" in result.library.read_bytes().decode("latin-1")


def test_aarch64_libtorch_is_the_pinned_torch(repo_root):
    """The aarch64 variants link the libtorch of the torch the project builds against."""
    pins = [line.strip() for line in (repo_root / "requirements.txt").read_text().splitlines()]
    torch_pin = next(line for line in pins if line.startswith("torch=="))
    libtorch = variants.AARCH64_LIBTORCH
    assert {c.download.requirement for c in libtorch.copies} == {torch_pin}
    assert libtorch.name == f"aarch64-libtorch-{torch_pin.split('==')[1]}"


def test_smoke_build_of_an_unknown_source_names_it(repo_root):
    from kernelpress.config import ConfigError

    with pytest.raises(ConfigError, match="not a kernel source of build.toml: csrc/nope.cu .*csrc/naive.cu"):
        build(repo_root, variant=variants.by_name("cu130-x86_64"), only=("csrc/nope.cu",), out=io.StringIO())
