# The two quick-start commands are `make space` (the main job: the Space, locally) and
# `make test`. `make demo` prints a correctness-and-timing demo in the terminal.
# Both create .venv with the pinned packages on first use.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
JOBS ?= $(shell nproc)

# The variant this machine builds and the tests load (kernelpress/variants.py lists them all).
NATIVE_VARIANT := cu130-$(shell uname -m)

.PHONY: demo test build check clean space toolchains variants

$(BIN)/.installed: requirements.txt constraints.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements.txt -c constraints.txt
	touch $@

build: $(BIN)/.installed
	$(BIN)/kernelpress build --variant $(NATIVE_VARIANT) -j $(JOBS)

# What the other variants need: the aarch64 cross compiler (a Debian package) and the
# toolchain folders kernelpress downloads (CUDA 12.4, aarch64 libraries; pinned, ~600 MB).
toolchains: $(BIN)/.installed
	command -v aarch64-linux-gnu-g++ >/dev/null || (apt-get update && apt-get install -y g++-aarch64-linux-gnu)
	$(BIN)/kernelpress toolchains --install

# Every variant (cu130 and cu124, x86-64 and aarch64): what `kernelpress publish` wants.
variants: toolchains
	$(BIN)/kernelpress build -j $(JOBS)
	$(BIN)/kernelpress check .

check: build
	$(BIN)/kernelpress check .

demo: build
	$(BIN)/python scripts/demo.py

# The tests smoke-build the other variants (tests/test_variants.py), hence the toolchains.
test: check toolchains
	command -v chromium || (apt-get update && apt-get install -y chromium)
	$(BIN)/python -m pytest -ra

# The Gradio Space on http://localhost:7860 (GRADIO_SERVER_PORT to change), with this build.
space: build
	LOCAL_KERNELS=persistent-matmul/persistent-matmul=$(CURDIR) $(BIN)/python space/app.py

clean:
	rm -rf build .kernelpress
