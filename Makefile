# The two quick-start commands are `make space` (the main job: the Space, locally) and
# `make test`. `make demo` prints a correctness-and-timing demo in the terminal.
# Both create .venv with the pinned packages on first use.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
JOBS ?= $(shell nproc)

.PHONY: demo test build check clean space

$(BIN)/.installed: requirements.txt constraints.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements.txt -c constraints.txt
	touch $@

build: $(BIN)/.installed
	$(BIN)/kernelpress build -j $(JOBS)

check: build
	$(BIN)/kernelpress check .

demo: build
	$(BIN)/python scripts/demo.py

test: check
	command -v chromium || (apt-get update && apt-get install -y chromium)
	$(BIN)/python -m pytest -ra

# The Gradio Space on http://localhost:7860 (GRADIO_SERVER_PORT to change), with this build.
space: build
	LOCAL_KERNELS=persistent-matmul/persistent-matmul=$(CURDIR) $(BIN)/python space/app.py

clean:
	rm -rf build .kernelpress
