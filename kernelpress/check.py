"""``kernelpress check``: verify a build before anyone loads or publishes it.

Checks, per variant: the directory layout; metadata.json against the kernels
package's own parser (and build.toml, when the repo is at hand, with the
capabilities that the variant's CUDA release builds); the digest; that the
library is for the machine the variant names (read from its ELF header: a
library for another machine is never loaded);
that the op namespace id agrees across metadata, ``_ops.py``, the extension's
file name and its ``PyInit_`` symbol; ``kernel-abi-check`` (manylinux_2_28 and
Python limited API 3.9) on every ``.so``; and that every declared CUDA arch has
machine code (and PTX where ``+PTX`` is declared), read with cuobjdump; and
that sm_90a code holds wgmma and TMA instructions, its wgmmas not serialized
(read from its SASS once per library content: sm90a_summary).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from .archs import CudaArch

MANYLINUX = "manylinux_2_28"
PYTHON_ABI = "3.9"
REQUIRED_FILES = ("__init__.py", "_ops.py", "metadata.json")


@dataclass(frozen=True)
class CheckResult:
    variant: str
    name: str
    ok: bool
    detail: str


def find_cuobjdump() -> Path | None:
    """cuobjdump from PyPI's nvidia-cuda-cuobjdump, else from PATH or the CUDA toolkit."""
    for entry in sys.path:
        for candidate in Path(entry).glob("nvidia/cu*/bin/cuobjdump"):
            if candidate.is_file():
                return candidate
    found = shutil.which("cuobjdump")
    if found:
        return Path(found)
    toolkit = Path("/usr/local/cuda/bin/cuobjdump")
    return toolkit if toolkit.is_file() else None


def embedded_cuda_code(so: Path, cuobjdump: Path) -> tuple[set[str], set[str]]:
    """The SASS targets (``sm_90a``) and PTX targets (``compute_120``) in a library."""
    def listing(flag: str) -> str:
        out = subprocess.run([str(cuobjdump), flag, str(so)], capture_output=True, text=True)
        return out.stdout + out.stderr

    sass = set(re.findall(r"\.(sm_\d+[af]?)\.cubin", listing("--list-elf")))
    ptx = {"compute_" + m for m in re.findall(r"\.sm_(\d+[af]?)\.ptx", listing("--list-ptx"))}
    return sass, ptx


# Instructions an sm_90a build must contain: Hopper's warpgroup MMA (wgmma)
# and tensor-memory-accelerator loads. A build without them fell back to
# mma.sync or cp.async and is not using the Hopper path.
HOPPER_INSTRUCTIONS = {"HGMMA": "wgmma", "UTMALDG": "TMA load"}


def sm90a_sass(so: Path, cuobjdump: Path) -> tuple[str, str | None]:
    """The library's sm_90a SASS as cuobjdump prints it, and None; or "" and why it
    could not be read (cuobjdump disassembles with nvdisasm, from PyPI's
    nvidia-cuda-nvdisasm, looked up beside cuobjdump)."""
    env = {**os.environ, "PATH": f"{cuobjdump.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    out = subprocess.run([str(cuobjdump), "--dump-sass", "--gpu-architecture", "sm_90a", str(so)],
                         capture_output=True, text=True, env=env)
    if out.returncode != 0:
        message = (out.stderr or out.stdout).strip()
        return "", message.splitlines()[-1] if message else f"cuobjdump exited {out.returncode}"
    return out.stdout, None


def count_hopper_instructions(sass: str) -> dict[str, int]:
    """How often each of HOPPER_INSTRUCTIONS occurs in a SASS listing."""
    return {name: len(re.findall(rf"\b{name}\b", sass)) for name in HOPPER_INSTRUCTIONS}


def serialized_wgmma_functions(sass: str) -> dict[str, tuple[int, int]]:
    """Functions of a SASS listing whose wgmmas ptxas serialized: {name: (groups
    of one HGMMA, groups)}. A group is the run of HGMMAs up to the one that
    closes it (marked gsb0, then awaited with WARPGROUP.DEPBAR). The Hopper
    rungs issue four per group (a 64-deep k-block in k16 steps); when ptxas
    cannot pipeline them (its C75xx advisories, "wgmma.mma_async instructions are
    serialized" advisories, shown only with -Xptxas -v) every HGMMA closes its
    own group and is awaited at once, and the kernel runs several per cent
    slower with nothing else to show for it. A function counts as serialized
    when most of its groups hold one HGMMA."""
    found: dict[str, tuple[int, int]] = {}
    for chunk in re.split(r"^\s*Function : ", sass, flags=re.M)[1:]:
        name = chunk.split(None, 1)[0]
        sizes, current = [], 0
        for line in re.findall(r"HGMMA\.[^;]*;", chunk):
            current += 1
            if "gsb0" in line:
                sizes.append(current)
                current = 0
        singles = sizes.count(1)
        if sizes and singles * 2 > len(sizes):
            found[name] = (singles, len(sizes))
    return found


@dataclass(frozen=True)
class Sm90aSummary:
    """What the checks read from a library's sm_90a SASS."""
    counts: dict[str, int]  # HOPPER_INSTRUCTIONS found
    serialized: dict[str, tuple[int, int]]  # serialized_wgmma_functions


# Bumped whenever what a summary holds, or how it is read from SASS, changes:
# older cache entries are then never read.
SUMMARY_FORMAT = 1


def cache_dir() -> Path:
    """Where kernelpress keeps results that depend only on file contents:
    $KERNELPRESS_CACHE, else $XDG_CACHE_HOME/kernelpress, else ~/.cache/kernelpress."""
    if os.environ.get("KERNELPRESS_CACHE"):
        return Path(os.environ["KERNELPRESS_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kernelpress"


def _summary_cache_file(so: Path, cuobjdump: Path) -> Path:
    """The cache entry of a library's summary: named by the library's bytes, the
    cuobjdump that read it and SUMMARY_FORMAT."""
    digest = hashlib.sha256()
    with open(so, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    tool = cuobjdump.resolve()
    digest.update(f"|{tool}|{tool.stat().st_size}|{SUMMARY_FORMAT}".encode())
    return cache_dir() / f"sm90a-summary-{digest.hexdigest()}.json"


def sm90a_summary(so: Path, cuobjdump: Path) -> tuple[Sm90aSummary | None, str | None]:
    """The Hopper instruction counts and serialized-wgmma functions of a library's
    sm_90a SASS, and None; or None and why the SASS could not be read.

    Disassembling a build's sm_90a code takes ~30 s, and `kernelpress publish`
    checks the same build again on every run, so summaries are cached by the
    library's content (cache_dir(); an unreadable or unwritable cache is
    ignored, failures are never cached)."""
    entry = _summary_cache_file(so, cuobjdump)
    try:
        data = json.loads(entry.read_text())
        counts = {name: int(data["counts"][name]) for name in HOPPER_INSTRUCTIONS}
        serialized = {name: (int(singles), int(groups)) for name, (singles, groups) in data["serialized"].items()}
        return Sm90aSummary(counts, serialized), None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    listing, error = sm90a_sass(so, cuobjdump)
    if error is not None:
        return None, error
    summary = Sm90aSummary(count_hopper_instructions(listing), serialized_wgmma_functions(listing))
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        partial = entry.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(json.dumps({"counts": summary.counts, "serialized": summary.serialized}))
        os.replace(partial, entry)
    except OSError:
        pass
    return summary, None


_ELF_MACHINES = {0x3E: "x86_64", 0xB7: "aarch64"}


def elf_machine(path: Path) -> str | None:
    """The machine an ELF file is for ("x86_64", "aarch64", or "e_machine 0x..."),
    read from its header: a library built for another machine is checked
    without ever being loaded. None if the file is not ELF."""
    with open(path, "rb") as f:
        header = f.read(20)
    if len(header) < 20 or header[:4] != b"\x7fELF":
        return None
    order = "little" if header[5] == 1 else "big"
    code = int.from_bytes(header[18:20], order)
    return _ELF_MACHINES.get(code, f"e_machine {code:#x}")


def variant_machine(name: str) -> str | None:
    """The machine a variant directory's name is for (``...-cu130-aarch64-linux``), as
    the kernels package parses it; None for a name it does not parse."""
    from kernels.variants import parse_variant

    try:
        return parse_variant(name).arch.platform
    except (ValueError, AttributeError):
        return None


def variant_cuda(name: str) -> tuple[int, int] | None:
    """The CUDA release of a variant directory's name (``cu124``: (12, 4)), as the
    kernels package parses it; None for a name without one."""
    from kernels.variants import parse_variant

    try:
        version = parse_variant(name).arch.backend.version
        return version.major, version.minor
    except (ValueError, AttributeError):
        return None


def _exported_symbols(so: Path) -> set[str]:
    out = subprocess.run(["nm", "-D", "--defined-only", str(so)], capture_output=True, text=True)
    return {line.split()[-1] for line in out.stdout.splitlines() if line.strip()}


def check_variant(variant_dir: Path, config=None, cuobjdump: Path | None = None) -> list[CheckResult]:
    """Every check on one variant directory; ``config`` (a BuildConfig) adds build.toml checks."""
    from kernel_abi_check import ObjectFile
    from kernels._rust import Digest, DigestValidationError, Metadata
    from kernels.variants import parse_variant

    name = variant_dir.name
    results: list[CheckResult] = []

    def add(check: str, ok: bool, detail: str) -> None:
        results.append(CheckResult(name, check, ok, detail))

    try:
        parse_variant(name)
        add("variant name", True, "parsed by kernels")
    except ValueError as e:
        add("variant name", False, str(e))

    missing = [f for f in REQUIRED_FILES if not (variant_dir / f).is_file()]
    libraries = sorted(variant_dir.glob("*.so"))
    problems = [f"missing {f}" for f in missing]
    if len(libraries) != 1:
        problems.append(f"expected one .so, found {len(libraries)}: {[p.name for p in libraries]}")
    add("layout", not problems, "; ".join(problems) or "__init__.py, _ops.py, metadata.json, one .so")
    if missing and "metadata.json" in missing:
        return results

    try:
        metadata = Metadata.read_from_file(variant_dir / "metadata.json")
    except ValueError as e:
        add("metadata", False, f"kernels cannot parse metadata.json: {e}")
        return results
    problems = []
    cuda = variant_cuda(name)
    if config is not None:
        if str(metadata.name) != config.name:
            problems.append(f"name {metadata.name} != build.toml {config.name}")
        if metadata.version != config.version:
            problems.append(f"version {metadata.version} != build.toml {config.version}")
        if metadata.license != config.license:
            problems.append(f"license {metadata.license} != build.toml {config.license}")
        expected = config.cuda_archs_for(cuda) if cuda is not None else config.cuda_archs
        if list(metadata.backend.archs or []) != expected:
            problems.append(f"archs {metadata.backend.archs} != build.toml's for this CUDA {expected}")
    if metadata.version is None:
        problems.append("no version")
    add("metadata", not problems, "; ".join(problems) or f"{metadata.name} v{metadata.version}, archs {metadata.backend.archs}")

    if metadata.digest is None:
        add("digest", False, "metadata.json has no digest")
    else:
        try:
            metadata.digest.validate(Digest.hash_variant(metadata.digest.algorithm, variant_dir))
            add("digest", True, f"{len(metadata.digest.files)} files match")
        except DigestValidationError as e:
            add("digest", False, "; ".join(str(v) for v in e.violations))

    op_id = metadata.id
    problems = []
    if not re.fullmatch(rf"_{metadata.name.python_name}_cuda_[0-9a-f]{{7}}(_dirty)?", op_id):
        problems.append(f"id {op_id!r} is not _<python_name>_cuda_<7 hex>[_dirty]")
    ops_text = (variant_dir / "_ops.py").read_text() if (variant_dir / "_ops.py").is_file() else ""
    for needle in (f"from . import {op_id}", f"torch.ops.{op_id}", f"{op_id}::"):
        if needle not in ops_text:
            problems.append(f"_ops.py lacks {needle!r}")
    if libraries:
        so = libraries[0]
        if so.name != f"{op_id}.abi3.so":
            problems.append(f"extension is {so.name}, expected {op_id}.abi3.so")
        if f"PyInit_{op_id}" not in _exported_symbols(so):
            problems.append(f"{so.name} does not export PyInit_{op_id}")
        if op_id.encode() not in so.read_bytes():
            problems.append(f"{so.name} does not register ops under {op_id}")
    add("op namespace", not problems, "; ".join(problems) or f"{op_id} in metadata, _ops.py and the .so")

    for so in libraries:
        machine, expected_machine = elf_machine(so), variant_machine(name)
        add(f"machine ({so.name})", machine is not None and machine == expected_machine,
            f"{machine or 'not an ELF shared object'}" + ("" if machine == expected_machine
                                                         else f", the variant name says {expected_machine}"))
        obj = ObjectFile(so)
        manylinux = obj.check_manylinux(MANYLINUX)
        abi3 = obj.check_python_abi(PYTHON_ABI)
        add(f"{MANYLINUX} ({so.name})", not manylinux,
            "; ".join(f"{v.name}@{v.version} from {v.dep}" for v in manylinux) or "0 violations")
        add(f"abi3 {PYTHON_ABI} ({so.name})", not abi3,
            "; ".join(repr(v) for v in abi3) or "0 violations")

    archs = list(metadata.backend.archs or [])
    if str(metadata.backend.backend_type).lower() == "cuda" and libraries:
        tool = cuobjdump or find_cuobjdump()
        if tool is None:
            add("SASS", False, "cuobjdump not found (pip install nvidia-cuda-cuobjdump)")
        else:
            sass, ptx = embedded_cuda_code(libraries[0], tool)
            problems = []
            for text in archs:
                arch = CudaArch.parse(text)
                if arch.sm not in sass:
                    problems.append(f"no {arch.sm} SASS for {text}")
                if arch.ptx and arch.compute not in ptx:
                    problems.append(f"no {arch.compute} PTX for {text}")
            add("SASS", not problems, "; ".join(problems)
                or f"SASS {' '.join(sorted(sass))}" + (f", PTX {' '.join(sorted(ptx))}" if ptx else ""))
            if "sm_90a" in sass:
                summary, error = sm90a_summary(libraries[0], tool)
                if error is not None:
                    add("sm_90a instructions", False, f"could not disassemble: {error}")
                else:
                    counts = summary.counts
                    missing = [f"no {name} ({what})" for name, what in HOPPER_INSTRUCTIONS.items() if not counts[name]]
                    add("sm_90a instructions", not missing, "; ".join(missing)
                        or ", ".join(f"{counts[name]} {name}" for name in HOPPER_INSTRUCTIONS))
                    serialized = summary.serialized
                    add("wgmma pipelining", not serialized,
                        "; ".join(f"{name}: {singles} of {groups} wgmma groups hold one HGMMA (serialized by ptxas)"
                                  for name, (singles, groups) in serialized.items())
                        or "no function with serialized wgmmas")
    return results


def check_path(path: Path) -> list[CheckResult]:
    """Check a repo root (its build/ against its build.toml), a build/ dir, or one variant dir."""
    from .config import load_config

    path = path.resolve()
    config = None
    if (path / "build.toml").is_file():
        config = load_config(path)
        path = path / "build"
    elif (path.parent / "build.toml").is_file() and path.name == "build":
        config = load_config(path.parent)
    if (path / "metadata.json").is_file():
        variants = [path]
    else:
        variants = sorted(p for p in path.iterdir() if p.is_dir()) if path.is_dir() else []
    if not variants:
        return [CheckResult(path.name, "layout", False, f"no variant directories in {path}")]
    cuobjdump = find_cuobjdump()
    return [r for v in variants for r in check_variant(v, config, cuobjdump)]


def print_report(results: list[CheckResult], out=sys.stdout) -> None:
    width = max(len(r.name) for r in results)
    current = None
    for r in results:
        if r.variant != current:
            current = r.variant
            print(current, file=out)
        print(f"  {'ok  ' if r.ok else 'FAIL'}  {r.name:<{width}}  {r.detail}", file=out)
    failed = [r for r in results if not r.ok]
    verdict = "all checks passed" if not failed else "FAILED: " + ", ".join(sorted({r.name for r in failed}))
    print(f"{len(results) - len(failed)} of {len(results)} checks ok; {verdict}", file=out)
