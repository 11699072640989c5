"""kernelpress build and check, on a tiny fixture repo (one op, sm_80 only) so builds take seconds."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kernelpress import archs
from kernelpress.build import BuildError, build
from kernelpress.check import check_path, check_variant
from kernelpress.config import ConfigError, load_config

FIXTURE = Path(__file__).parent / "fixtures" / "tiny-kernel"
STABLE_VARIANT = "torch-stable-abi210-cu130-x86_64-linux"
TORCH_XY = "".join(torch.__version__.split("+")[0].split(".")[:2])
VERSIONED_VARIANT = f"torch{TORCH_XY}-cxx11-cu130-x86_64-linux"


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


def make_repo(dest: Path, *, use_git: bool = True) -> Path:
    shutil.copytree(FIXTURE, dest)
    if use_git:
        git(dest, "init", "-q")
        git(dest, "add", "-A")
        git(dest, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "fixture")
    return dest


def quiet_build(repo: Path):
    log = io.StringIO()
    result = build(repo, jobs=2, out=log)
    return result, log.getvalue()


@pytest.fixture(scope="module")
def built_repo(tmp_path_factory):
    repo = make_repo(tmp_path_factory.mktemp("stable") / "tiny-kernel")
    result, _ = quiet_build(repo)
    return repo, result


def test_gencode_flags_per_capability():
    assert archs.gencode_flags(["8.0"]) == ["-gencode=arch=compute_80,code=sm_80"]
    assert archs.gencode_flags(["9.0a"]) == ["-gencode=arch=compute_90a,code=sm_90a"]
    assert archs.gencode_flags(["12.0+PTX"]) == [
        "-gencode=arch=compute_120,code=sm_120", "-gencode=arch=compute_120,code=compute_120"]
    with pytest.raises(ValueError, match="not a CUDA capability"):
        archs.CudaArch.parse("sm_90")


def test_stable_build_writes_a_checked_variant(built_repo):
    repo, result = built_repo
    assert result.variant == STABLE_VARIANT
    tree = git(repo, "rev-parse", "HEAD^{tree}")
    assert result.op_id == f"_tiny_add_cuda_{tree[:7]}"
    names = sorted(p.name for p in result.variant_dir.iterdir())
    assert names == sorted(["__init__.py", "_ops.py", "metadata.json", f"{result.op_id}.abi3.so"])
    metadata = json.loads((result.variant_dir / "metadata.json").read_text())
    assert (metadata["name"], metadata["version"], metadata["license"]) == ("tiny-add", 3, "MIT")
    assert metadata["backend"] == {"type": "cuda", "archs": ["8.0"]}
    assert metadata["provenance"]["kernel"] == {"commit": git(repo, "rev-parse", "HEAD"), "dirty": False}
    results = check_path(repo)
    assert [r for r in results if not r.ok] == []
    assert {r.name for r in results} >= {"layout", "metadata", "digest", "op namespace", "SASS"}


def test_built_variant_loads_and_registers_its_op(built_repo, subprocess_env):
    repo, result = built_repo
    code = f"""
import torch
from pathlib import Path
from kernels import get_local_kernel
mod = get_local_kernel(Path({str(repo / 'build')!r}))
print("op", hasattr(torch.ops.{result.op_id}, "add_one_"))
try:
    mod.add_one_(torch.zeros(3))
except Exception as e:
    print("error", type(e).__name__)
"""
    out = subprocess.run([sys.executable, "-c", code], env=subprocess_env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "op True" in out.stdout
    assert "error NotImplementedError" in out.stdout  # no CPU implementation: a clean error, no crash


def test_rebuild_recompiles_only_what_changed(tmp_path):
    repo = make_repo(tmp_path / "tiny-kernel")
    quiet_build(repo)
    result, log = quiet_build(repo)
    assert result.steps_run == 0, log
    os.utime(repo / "csrc" / "add_one.cu")  # touched, same content: same id
    result, log = quiet_build(repo)
    assert result.steps_run == 2, log  # that source, then the link
    assert "nvcc csrc/add_one.cu" in log and "torch_binding" not in log
    header = repo / "csrc" / "add_one.h"
    os.utime(header)
    result, log = quiet_build(repo)
    assert "nvcc csrc/add_one.cu" in log and "torch_binding" in log  # both include it


def nvcc_that_loses_its_depfile(tmp_path: Path, monkeypatch, times: int) -> None:
    """Builds from here on compile with an nvcc that deletes the dependency file it
    wrote, the first ``times`` calls: ninja then records the object as including nothing."""
    import dataclasses

    import kernelpress.build as kbuild

    counter = tmp_path / "nvcc-calls"
    counter.write_text("0")
    real_detect = kbuild.detect
    wrapper = tmp_path / "nvcc"

    def detect(variant):
        tc = real_detect(variant)
        wrapper.write_text(
            "#!/bin/sh\n"
            f'"{tc.nvcc}" "$@" || exit $?\n'
            f"n=$(cat {counter}); echo $((n + 1)) > {counter}\n"
            f'[ "$n" -lt {times} ] || exit 0\n'
            'while [ $# -gt 0 ]; do [ "$1" = -MF ] && rm -f "$2"; shift; done\n')
        wrapper.chmod(0o755)
        return dataclasses.replace(tc, nvcc=wrapper)

    monkeypatch.setattr(kbuild, "detect", detect)


def test_an_object_built_without_its_header_list_is_compiled_again(tmp_path, monkeypatch):
    repo = make_repo(tmp_path / "tiny-kernel")
    nvcc_that_loses_its_depfile(tmp_path, monkeypatch, times=1)
    result, log = quiet_build(repo)
    assert "obj/add/csrc__add_one.cu.o was compiled without a list of the headers" in log, log
    assert log.count("nvcc csrc/add_one.cu") == 2, log
    os.utime(repo / "csrc" / "add_one.h")  # now in its header list: the next build recompiles it
    result, log = quiet_build(repo)
    assert "nvcc csrc/add_one.cu" in log, log


def test_a_compiler_that_writes_no_header_list_fails_the_build(tmp_path, monkeypatch):
    repo = make_repo(tmp_path / "tiny-kernel")
    nvcc_that_loses_its_depfile(tmp_path, monkeypatch, times=99)
    with pytest.raises(BuildError, match="no dependency file for obj/add/csrc__add_one.cu.o"):
        quiet_build(repo)


def test_a_stopped_build_stops_ninja_and_its_compilers(tmp_path, repo_root, subprocess_env):
    """SIGTERM to a build while ninja runs: kernelpress exits non-zero, having sent ninja
    SIGTERM and waited for it (ninja passes it on to the compilers it runs). A stand-in
    for ninja runs one long command and records the signal it gets."""
    import signal
    import time

    fake_ninja = tmp_path / "ninja"
    fake_ninja.write_text(
        "#!/bin/bash\n"
        f"trap 'kill $compiler; echo stopped > {tmp_path}/stopped; exit 1' TERM\n"
        "sleep 300 & compiler=$!\n"
        f"echo $$ > {tmp_path}/ninja.pid\n"
        "echo '[1/2 0.1s] nvcc csrc/kernel.cu'\n"
        "wait $compiler\n")
    fake_ninja.chmod(0o755)
    script = ("import sys, types; from pathlib import Path; from kernelpress.build import run_ninja; "
              f"run_ninja(types.SimpleNamespace(ninja=Path({str(fake_ninja)!r})), Path({str(tmp_path)!r}), 1)")
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=repo_root, env=subprocess_env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout.readline().startswith("[1/2 "), "the build did not start its step"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        proc.kill()
    assert (tmp_path / "stopped").read_text() == "stopped\n", "ninja was not sent SIGTERM"
    ninja_pid = int((tmp_path / "ninja.pid").read_text())
    for _ in range(50):  # reaped by the build before it exited; the wait is for a slow /proc
        if not Path(f"/proc/{ninja_pid}").exists():
            break
        time.sleep(0.1)
    assert not Path(f"/proc/{ninja_pid}").exists(), "ninja outlived the build"


def test_editing_a_tracked_source_marks_the_build_dirty(tmp_path):
    repo = make_repo(tmp_path / "tiny-kernel")
    clean, _ = quiet_build(repo)
    source = repo / "csrc" / "add_one.cu"
    source.write_text(source.read_text() + "\n// edited\n")
    dirty, log = quiet_build(repo)
    assert dirty.op_id == clean.op_id + "_dirty"
    libraries = [p.name for p in dirty.variant_dir.glob("*.so")]
    assert libraries == [f"{dirty.op_id}.abi3.so"]  # the clean build's library is gone
    metadata = json.loads((dirty.variant_dir / "metadata.json").read_text())
    assert metadata["provenance"]["kernel"]["dirty"] is True
    assert all(r.ok for r in check_path(repo))


def test_without_git_the_id_follows_the_sources(tmp_path):
    repo = make_repo(tmp_path / "tiny-kernel", use_git=False)
    first, _ = quiet_build(repo)
    source = repo / "csrc" / "add_one.cu"
    source.write_text(source.read_text() + "\n// edited\n")
    second, _ = quiet_build(repo)
    assert first.op_id != second.op_id
    assert not second.op_id.endswith("_dirty")
    assert "provenance" in json.loads((second.variant_dir / "metadata.json").read_text())


def test_versioned_variant_without_stable_abi(tmp_path, subprocess_env):
    repo = make_repo(tmp_path / "tiny-kernel", use_git=False)
    toml = repo / "build.toml"
    toml.write_text("\n".join(l for l in toml.read_text().splitlines() if not l.startswith("stable-abi")))
    result, _ = quiet_build(repo)
    assert result.variant == VERSIONED_VARIANT
    assert [r for r in check_path(repo) if not r.ok] == []
    code = f"""
import torch
from pathlib import Path
from kernels import get_local_kernel
get_local_kernel(Path({str(repo / 'build')!r}))
print("op", hasattr(torch.ops.{result.op_id}, "add_one_"))
"""
    out = subprocess.run([sys.executable, "-c", code], env=subprocess_env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "op True" in out.stdout


@pytest.fixture
def variant_copy(built_repo, tmp_path) -> Path:
    _, result = built_repo
    dest = tmp_path / result.variant
    shutil.copytree(result.variant_dir, dest)
    return dest


def failures(variant: Path) -> dict[str, str]:
    return {r.name: r.detail for r in check_variant(variant) if not r.ok}


def test_check_names_a_tampered_file(variant_copy):
    with open(variant_copy / "__init__.py", "a") as f:
        f.write("# tampered\n")
    failed = failures(variant_copy)
    assert list(failed) == ["digest"]
    assert "__init__.py" in failed["digest"]


def test_check_finds_a_declared_arch_without_sass(variant_copy):
    path = variant_copy / "metadata.json"
    metadata = json.loads(path.read_text())
    metadata["backend"]["archs"] = ["8.0", "9.0a", "12.0+PTX"]
    path.write_text(json.dumps(metadata))
    failed = failures(variant_copy)
    assert list(failed) == ["SASS"]
    assert "no sm_90a SASS for 9.0a" in failed["SASS"]
    assert "no compute_120 PTX for 12.0+PTX" in failed["SASS"]


def test_check_finds_a_library_for_another_machine(variant_copy):
    """A variant named for aarch64 whose library is x86-64: read from the ELF
    header (a foreign library is never loaded)."""
    foreign = variant_copy.parent / variant_copy.name.replace("cu130-x86_64", "cu130-aarch64")
    variant_copy.rename(foreign)
    failed = {r.name.split(" (")[0]: r.detail for r in check_variant(foreign) if not r.ok}
    assert failed == {"machine": "x86_64, the variant name says aarch64"}


def test_check_finds_an_inconsistent_op_namespace(variant_copy):
    so = next(variant_copy.glob("*.so"))
    so.rename(variant_copy / "_tiny_add_cuda_0000000.abi3.so")
    failed = failures(variant_copy)
    assert "op namespace" in failed
    assert "expected" in failed["op namespace"]


def test_check_finds_missing_files(variant_copy):
    (variant_copy / "_ops.py").unlink()
    failed = failures(variant_copy)
    assert "missing _ops.py" in failed["layout"]


def test_check_reports_manylinux_violations(variant_copy, tmp_path):
    # A library calling dlsym without kernelpress's compat shim binds to GLIBC_2.34 on this toolchain.
    src = tmp_path / "leak.c"
    src.write_text('#include <dlfcn.h>\nvoid* f(void) { return dlsym(RTLD_DEFAULT, "x"); }\n')
    so = next(variant_copy.glob("*.so"))
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(so), str(src), "-ldl"], check=True)
    failed = failures(variant_copy)
    manylinux = [detail for name, detail in failed.items() if name.startswith("manylinux_2_28")]
    assert manylinux and "dlsym" in manylinux[0]


def test_check_cli_exit_code_and_report(variant_copy):
    (variant_copy / "_ops.py").write_text("tampered = True\n")
    out = subprocess.run([sys.executable, "-m", "kernelpress", "check", str(variant_copy)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1
    assert "FAIL  digest" in out.stdout and "FAIL  op namespace" in out.stdout


def test_config_errors_name_the_problem(tmp_path):
    repo = make_repo(tmp_path / "tiny-kernel", use_git=False)
    toml = repo / "build.toml"
    original = toml.read_text()
    toml.write_text(original.replace('license = "MIT"', 'license = "MIT"\nflavour = "x"'))
    with pytest.raises(ConfigError, match="flavour"):
        load_config(repo)
    toml.write_text(original.replace("csrc/add_one.cu", "csrc/missing.cu"))
    with pytest.raises(ConfigError, match="csrc/missing.cu"):
        load_config(repo)
    toml.write_text(original.replace('stable-abi = "2.10"', 'stable-abi = "2.99"'))
    with pytest.raises(ConfigError, match="2.99"):
        build(repo, out=io.StringIO())
    with pytest.raises(ConfigError, match="no build.toml"):
        load_config(tmp_path)


def test_compile_error_is_reported(tmp_path):
    repo = make_repo(tmp_path / "tiny-kernel", use_git=False)
    source = repo / "csrc" / "add_one.cu"
    source.write_text(source.read_text() + "\nthis is not C++;\n")
    with pytest.raises(BuildError, match="add_one.cu"):
        quiet_build(repo)
    out = subprocess.run([sys.executable, "-m", "kernelpress", "build", str(repo), "--variant", "cu130-x86_64"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 1 and "kernelpress: error:" in out.stderr and "add_one.cu" in out.stderr


def _plain_sm90a_object(folder: Path, name: str, body: str) -> Path:
    """An object file of one plain (no wgmma, no TMA) kernel built for sm_90a."""
    from kernelpress.toolchain import find_nvcc

    source = folder / f"{name}.cu"
    source.write_text(f"__global__ void {name}(float* x) {{ {body} }}\n")
    obj = folder / f"{name}.o"
    subprocess.run([str(find_nvcc()), "-gencode=arch=compute_90a,code=sm_90a", "-c", str(source), "-o", str(obj)],
                   check=True)
    return obj


def test_hopper_instruction_check_tells_wgmma_code_from_plain_code(tmp_path):
    """kernelpress check counts HGMMA and UTMALDG in sm_90a SASS: zero for a plain
    kernel built for sm_90a, many for this repo's Hopper rungs (when built), whose
    wgmmas ptxas must not have serialized in any function ("wgmma pipelining")."""
    from kernelpress.check import count_hopper_instructions, find_cuobjdump, sm90a_sass, sm90a_summary

    cuobjdump = find_cuobjdump()
    assert cuobjdump is not None, "nvidia-cuda-cuobjdump is a kernelpress dependency"
    obj = _plain_sm90a_object(tmp_path, "add_one", "x[threadIdx.x] += 1.0f;")
    plain, error = sm90a_sass(obj, cuobjdump)
    assert error is None, error
    assert count_hopper_instructions(plain) == {"HGMMA": 0, "UTMALDG": 0}
    built = sorted((Path(__file__).resolve().parent.parent / "build").glob("torch-*/*.so"))
    if built:  # through the cache, which the later checks of this build (publish's) then read
        summary, error = sm90a_summary(built[0], cuobjdump)
        assert error is None, error
        assert summary.counts["HGMMA"] > 0 and summary.counts["UTMALDG"] > 0, summary.counts
        assert summary.serialized == {}


def test_sm90a_summary_is_cached_by_library_content(tmp_path, monkeypatch):
    """The second summary of the same bytes comes from the cache (cuobjdump is not
    run again) and equals the first; other bytes, or a corrupt entry, are read anew."""
    from kernelpress import check

    monkeypatch.setenv("KERNELPRESS_CACHE", str(tmp_path / "cache"))
    cuobjdump = check.find_cuobjdump()
    objects = [_plain_sm90a_object(tmp_path, "add_one", "x[threadIdx.x] += 1.0f;"),
               _plain_sm90a_object(tmp_path, "double_it", "x[threadIdx.x] *= 2.0f;")]
    calls = []
    real = check.sm90a_sass
    monkeypatch.setattr(check, "sm90a_sass", lambda so, tool: calls.append(so) or real(so, tool))
    first, error = check.sm90a_summary(objects[0], cuobjdump)
    assert error is None and first.counts == {"HGMMA": 0, "UTMALDG": 0} and first.serialized == {}
    assert check.sm90a_summary(objects[0], cuobjdump) == (first, None)
    assert calls == [objects[0]]
    check.sm90a_summary(objects[1], cuobjdump)
    assert calls == [objects[0], objects[1]]
    entries = sorted((tmp_path / "cache").glob("sm90a-summary-*.json"))
    assert len(entries) == 2
    for entry in entries:
        entry.write_text("{not json")
    assert check.sm90a_summary(objects[0], cuobjdump) == (first, None)
    assert calls == [objects[0], objects[1], objects[0]]


def _sass_function(name: str, groups: list[int]) -> str:
    """A cuobjdump-style SASS listing of one function whose wgmma groups hold
    these numbers of HGMMAs, each group closed by gsb0 and awaited."""
    lines = [f"\t\tFunction : {name}", "\t.headerflags\t@\"EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)\""]
    address = 0
    for size in groups:
        for i in range(size):
            mark = ", gsb0" if i == size - 1 else ""
            lines.append(f"        /*{address:04x}*/                   HGMMA.64x256x16.F32.BF16 R24, gdesc[UR20].tnspB, "
                         f"R24{mark} ;  /* 0x43e00000141879f0 */")
            address += 16
        lines.append(f"        /*{address:04x}*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;  /* 0x00008000000079c5 */")
        address += 16
    return "\n".join(lines) + "\n"


def test_serialized_wgmma_check_finds_functions_whose_wgmmas_ptxas_serialized():
    """The check flags a function whose HGMMAs each close their own group (what
    ptxas emits when it serializes wgmmas), and passes pipelined groups of four,
    as the Hopper rungs issue them, in the same listing."""
    from kernelpress.check import serialized_wgmma_functions

    listing = (_sass_function("pipelined_kernel", [4, 4, 4, 4]) + _sass_function("serialized_kernel", [1] * 12)
               + _sass_function("plain_kernel", []))
    assert serialized_wgmma_functions(listing) == {"serialized_kernel": (12, 12)}
    assert serialized_wgmma_functions(_sass_function("mostly_pipelined", [4, 4, 1])) == {}

