# make demo / make test / make bench: each sets up what it needs first.
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed
BIN := $(VENV)/bin

.PHONY: demo test bench system-deps emu-deps clean

# A C compiler for the native virtual board; installed from Debian when missing.
system-deps:
	@command -v cc >/dev/null 2>&1 || { apt-get update && apt-get install -y build-essential; }

# The emulated RP2040 (boards/rp2040-emu.toml): Debian's arm-none-eabi-gcc + newlib for the
# firmware, Node.js for rp2040js, pinned by host/emu/package-lock.json (npm ci, once per lock).
EMU := host/emu
EMU_STAMP := $(EMU)/node_modules/.installed

emu-deps: $(EMU_STAMP)

$(EMU_STAMP): $(EMU)/package.json $(EMU)/package-lock.json
	@command -v arm-none-eabi-gcc >/dev/null 2>&1 && test -d /usr/lib/arm-none-eabi/newlib \
		|| { apt-get update && apt-get install -y gcc-arm-none-eabi libnewlib-arm-none-eabi; }
	@command -v npm >/dev/null 2>&1 || { apt-get update && apt-get install -y nodejs npm; }
	cd $(EMU) && npm ci --no-audit --no-fund
	touch $@

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install torch==2.13.0
	$(BIN)/pip install -e '.[dev]'
	touch $@

demo: system-deps $(STAMP) $(EMU_STAMP)
	$(BIN)/flashlm demo

test: system-deps $(STAMP) $(EMU_STAMP)
	$(BIN)/python -m pytest -q

bench: system-deps $(STAMP) $(EMU_STAMP)
	$(BIN)/python -m bench

clean:
	rm -rf build out $(VENV) $(EMU)/node_modules
