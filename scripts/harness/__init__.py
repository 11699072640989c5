"""What the device scripts share, one concept per module.

* ``harness.checks``: the correctness protocol (operands, fp64 references,
  error measures, tolerances), also behind the GPU tests;
* ``harness.kernel``: loading the package as users do, and running a rung or a
  variant of one by its column name;
* ``harness.provenance``: the GPU, clocks, versions and commit a result carries;
* ``harness.timing``: the timing loop (batches between CUDA events, interleaved
  rounds, inputs rotated past the L2 cache);
* ``harness.results``: the ``YYYY-MM-DD-<kind>.<ext>`` files of benchmarks/results/;
* ``harness.tensor_parallel``: torchrun's process group and transformers'
  tensor-parallel plan on a model built from its config.

A script run as ``python scripts/<name>.py`` has scripts/ on its path, so
``from harness.timing import ...`` needs no set-up; the tests get scripts/ on
their path from pyproject.toml's pytest settings.
"""
