# The two quick-start commands are `make demo` (the main job) and `make test`.
# Both create .venv with the pinned packages on first use.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
JOBS ?= $(shell nproc)

.PHONY: demo test build check clean

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
	$(BIN)/python -m pytest -ra

clean:
	rm -rf build .kernelpress
