"""The ``kernelpress`` command line: build, check and publish kernel repos."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import __version__


def _cmd_build(args) -> int:
    from .build import build_variants

    build_variants(args.repo, args.variant, jobs=args.jobs, only=tuple(args.only) if args.only else None)
    return 0


def _cmd_toolchains(args) -> int:
    from .variants import VARIANTS, by_name, install, missing, toolchain_root

    chosen = [by_name(n) for n in args.variant] if args.variant else list(VARIANTS)
    if args.install:
        for folder in dict.fromkeys(f for v in chosen for f in v.folders):
            install(folder)
    print(f"toolchains in {toolchain_root()}")
    ok = True
    for v in chosen:
        problems = missing(v)
        ok = ok and not problems
        print(f"  {v.name:<14} {'ready' if not problems else 'missing: ' + '; '.join(problems)}")
    return 0 if ok else 1


def _cmd_check(args) -> int:
    from .check import check_path, print_report

    results = check_path(Path(args.path))
    print_report(results)
    return 0 if all(r.ok for r in results) else 1


def _cmd_publish(args) -> int:
    from .publish import run_publish

    return run_publish(args.repo, repo_id=args.repo_id, space_id=args.space_id, dry_run=args.dry_run,
                       force=args.force, partial=args.partial, endpoint=args.endpoint)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kernelpress", description=__doc__)
    parser.add_argument("--version", action="version", version=f"kernelpress {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("build", help="compile the repo into build/<variant>/")
    p.add_argument("repo", nargs="?", default=".", help="kernel repo root (holds build.toml)")
    p.add_argument("-j", "--jobs", type=int, default=None, help="parallel compile jobs (default: CPU count)")
    p.add_argument("--variant", action="append", metavar="NAME",
                   help="build this variant (e.g. cu130-x86_64; repeatable; default: every variant, "
                        "see `kernelpress toolchains`)")
    p.add_argument("--only", nargs="+", metavar="SRC",
                   help="smoke build: the binding and these kernel sources, linked in .kernelpress/; "
                        "build/ is left alone")
    p.set_defaults(func=_cmd_build)

    p = sub.add_parser("toolchains", help="list the variants' toolchains; --install fetches the missing ones")
    p.add_argument("--variant", action="append", metavar="NAME", help="only this variant's (repeatable)")
    p.add_argument("--install", action="store_true",
                   help="download and unpack the toolchain folders (the cross compiler comes from apt-get)")
    p.set_defaults(func=_cmd_toolchains)

    p = sub.add_parser("check", help="check a build: layout, metadata, digest, ABI, SASS")
    p.add_argument("path", nargs="?", default="build", help="a build/ dir, a variant dir, or a repo root")
    p.set_defaults(func=_cmd_check)

    p = sub.add_parser("publish", help="upload the build, its card and the Space to the Hub")
    p.add_argument("repo", nargs="?", default=".", help="kernel repo root (holds build.toml and build/)")
    p.add_argument("--repo-id", help="kernel repo ORG/NAME (default: build.toml's [general.hub] repo-id)")
    p.add_argument("--space-id", help="also create/update this Gradio Space ORG/NAME from space/")
    p.add_argument("--dry-run", action="store_true",
                   help="print what would be created and uploaded; send nothing (default without a token)")
    p.add_argument("--force", action="store_true", help="publish a build made from a dirty source tree")
    p.add_argument("--partial", action="store_true",
                   help="publish the variants in build/ though some of kernelpress's are missing")
    p.add_argument("--endpoint", help="Hub endpoint URL (default: $HF_ENDPOINT or huggingface.co)")
    p.set_defaults(func=_cmd_publish)

    args = parser.parse_args(argv)
    from .build import BuildError
    from .config import ConfigError
    from .toolchain import ToolchainError
    from .variants import ToolchainMissing

    try:
        return args.func(args)
    except (BuildError, ConfigError, ToolchainError, ToolchainMissing, ValueError) as e:
        print(f"kernelpress: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
