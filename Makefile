# make demo / make test / make bench: each sets up what it needs first.
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed
BIN := $(VENV)/bin

.PHONY: demo test test-fast bench fuzz system-deps test-deps emu-deps qemu-deps bench-deps clean

# Debian packages, installed when missing. system-deps: a C compiler for the native virtual board.
system-deps:
	@command -v cc >/dev/null 2>&1 || { apt-get update && apt-get install -y build-essential; }

# test-deps: clang and its libFuzzer/ASan/UBSan runtimes (32-bit too) for the fuzz targets
# (tests/fuzz/, tests/test_fuzz.py); the RISC-V cross compiler + picolibc for the ESP32-C3
# (rv32imc) engine build check (tests/test_boards_build.py).
test-deps:
	@command -v clang >/dev/null 2>&1 && ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-*.a >/dev/null 2>&1 \
		&& dpkg -s libc6-dev-i386 lib32stdc++-12-dev >/dev/null 2>&1 \
		|| { apt-get update && apt-get install -y clang libclang-rt-14-dev libc6-dev-i386 lib32stdc++-12-dev; }
	@command -v riscv64-unknown-elf-gcc >/dev/null 2>&1 && dpkg -s picolibc-riscv64-unknown-elf >/dev/null 2>&1 \
		|| { apt-get update && apt-get install -y gcc-riscv64-unknown-elf picolibc-riscv64-unknown-elf; }

# The emulated RP2040 (boards/rp2040-emu.toml): Debian's arm-none-eabi-gcc + newlib for the
# firmware, Node.js for rp2040js, pinned by host/emu/package-lock.json (npm ci, once per lock).
# The ESP32 family's instruction sets in QEMU (boards/esp32c3-isa-qemu.toml, esp32s3-isa-qemu.toml):
# QEMU's RISC-V and Xtensa system emulators; the RISC-V cross compiler + picolibc; clang-22 and
# llvm-22 (Debian 12: bookworm-security) for Xtensa with the lx106 binutils' linker.
EMU := host/emu
EMU_STAMP := $(EMU)/node_modules/.installed
QEMU_PACKAGES := qemu-system-misc gcc-riscv64-unknown-elf picolibc-riscv64-unknown-elf clang-22 llvm-22 \
	binutils-xtensa-lx106

emu-deps: $(EMU_STAMP) qemu-deps

qemu-deps:
	@command -v qemu-system-riscv32 >/dev/null 2>&1 && command -v qemu-system-xtensa >/dev/null 2>&1 \
		&& command -v clang-22 >/dev/null 2>&1 && command -v llvm-mc-22 >/dev/null 2>&1 \
		&& command -v xtensa-lx106-elf-ld >/dev/null 2>&1 && command -v riscv64-unknown-elf-gcc >/dev/null 2>&1 \
		&& dpkg -s picolibc-riscv64-unknown-elf >/dev/null 2>&1 \
		|| { apt-get update && apt-get install -y $(QEMU_PACKAGES); }

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

# demo: the native board; 'make emu-deps' adds the emulated RP2040 (flashlm demo --board rp2040-emu)
demo: system-deps $(STAMP)
	$(BIN)/flashlm demo

# test: one pytest worker per core (pytest-xdist); a file's tests stay on one worker, so the images a
# module's fixtures build are built once
test: system-deps test-deps qemu-deps $(STAMP) $(EMU_STAMP)
	$(BIN)/python -m pytest -q -n auto --dist loadfile

# test-fast: the tests that need neither an emulator nor a cross compiler and take seconds each
# (markers in tests/conftest.py), for development; make test runs them all
test-fast: system-deps test-deps $(STAMP)
	$(BIN)/python -m pytest -q -m "not cross and not emulated and not slow"

# bench-deps: valgrind, whose callgrind counts the native engine's instructions per token (bench/callgrind.py).
bench-deps:
	@command -v valgrind >/dev/null 2>&1 || { apt-get update && apt-get install -y valgrind; }

bench: system-deps bench-deps qemu-deps $(STAMP) $(EMU_STAMP)
	$(BIN)/python -m bench

# The long fuzz runs (make test has short ones): libFuzzer on the firmware's command handling (the
# app booted once per process, each input served from the booted state) for FUZZ_SECONDS, the same
# built 32-bit (the boards' size_t) and the blob reader for FUZZ32_SECONDS and FUZZ_BLOB_SECONDS
# (ASan + UBSan), then hypothesis on every file loader for FUZZ_EXAMPLES, then SOAK_RUNS generations
# on the native board through the fault proxy (tests/fuzz/link_soak.py). Figures (executions a
# second among them) in build/fuzz/*.json; a crash leaves its input in build/fuzz/crashes/ (add it
# to tests/fuzz/regressions/ once fixed).
FUZZ_SECONDS ?= 600
FUZZ32_SECONDS ?= 180
FUZZ_BLOB_SECONDS ?= 180
FUZZ_EXAMPLES ?= 20000
SOAK_RUNS ?= 40
fuzz: system-deps test-deps $(STAMP)
	$(BIN)/python tests/fuzz/run.py --targets app --seconds $(FUZZ_SECONDS) --json build/fuzz/app.json
	$(BIN)/python tests/fuzz/run.py --targets app32 --seconds $(FUZZ32_SECONDS) --json build/fuzz/app32.json
	$(BIN)/python tests/fuzz/run.py --targets blob --seconds $(FUZZ_BLOB_SECONDS) --json build/fuzz/blob.json
	$(BIN)/python tests/fuzz/loaders.py --examples $(FUZZ_EXAMPLES) --seed $$(date +%s) --json build/fuzz/loaders.json
	$(BIN)/python tests/fuzz/link_soak.py --runs $(SOAK_RUNS) --seed $$(date +%s) --json build/fuzz/link_soak.json

clean:
	rm -rf build out $(VENV) $(EMU)/node_modules
