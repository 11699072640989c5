#!/usr/bin/env bash
# Fill .whl/ with the wheels the GPU machine lacks, at the versions constraints.txt pins,
# for its Python (3.12 by default: DEVICE_PYTHON=3.11 etc.). scripts/device_run.sh installs
# them: kernels and tomlkit load the build; diffusers, transformers, tokenizers, safetensors
# and regex run the integration tests and the `integration` step; nvidia-cuda-runtime-cu12
# (libcudart.so.12) lets the `cu124` step load the CUDA 12.4 variant beside a CUDA 13 torch.
#
#   bash scripts/fetch_device_wheels.sh        then carry `build` and `.whl` to the device
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
mkdir -p .whl
pin() { grep -i "^$1==" constraints.txt; }
for package in kernels tomlkit diffusers transformers tokenizers safetensors regex; do
  "$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version "${DEVICE_PYTHON:-3.12}" \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
    -d .whl "$(pin "$package")"
done
# The version the cu124 variant is built against (kernelpress/variants.py).
"$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version "${DEVICE_PYTHON:-3.12}" \
  --platform manylinux2014_x86_64 -d .whl nvidia-cuda-runtime-cu12==12.4.127
ls .whl
