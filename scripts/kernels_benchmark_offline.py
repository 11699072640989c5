"""`kernels benchmark ./` on a machine without sigstore (the offline GPU machine).

kernels 0.17.2's CLI imports kernels.verify, which needs sigstore; the benchmark
path never calls it. This stands in an empty kernels.verify and runs the real CLI:

    python3 scripts/kernels_benchmark_offline.py ./ --iterations 100 --warmup 10 --output OUT.json

Where `pip install 'kernels[benchmark]==0.17.2'` works, run `kernels benchmark ./` instead.
Needs torch and tabulate.
"""

from __future__ import annotations

import sys
import types


def _stub_verify() -> None:
    def unused(name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return type(name, (), {})

    module = types.ModuleType("kernels.verify")
    module.__file__ = "kernels_benchmark_offline.py (stub)"
    module.__getattr__ = unused
    sys.modules["kernels.verify"] = module


def main() -> int:
    _stub_verify()
    from kernels.cli import main as kernels_main

    sys.argv = ["kernels", "benchmark", *sys.argv[1:]]
    return kernels_main() or 0


if __name__ == "__main__":
    sys.exit(main())
