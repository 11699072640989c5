"""kernelpress: build, check and publish kernel-builder repositories without Nix.

A kernel repository in Hugging Face's kernel-builder layout (``build.toml``,
``torch-ext/``, CUDA sources) is compiled with nvcc and ninja into the exact
``build/<variant>/`` directories that ``kernels.get_kernel`` loads.
"""

__version__ = "0.1.0"
