# make demo / make test / make bench: each sets up what it needs first.
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed
BIN := $(VENV)/bin

.PHONY: demo test bench system-deps clean

# A C compiler for the native virtual board; installed from Debian when missing.
system-deps:
	@command -v cc >/dev/null 2>&1 || { apt-get update && apt-get install -y build-essential; }

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install torch==2.13.0
	$(BIN)/pip install -e '.[dev]'
	touch $@

demo: system-deps $(STAMP)
	$(BIN)/flashlm demo

test: system-deps $(STAMP)
	$(BIN)/python -m pytest -q

bench: system-deps $(STAMP)
	$(BIN)/python -m bench

clean:
	rm -rf build out $(VENV)
