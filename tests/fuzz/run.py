"""Build and run the libFuzzer targets (clang, ASan + UBSan) on the firmware's own C sources.

    python tests/fuzz/run.py                      # both targets, 60 s each
    python tests/fuzz/run.py --seconds 600 --targets app --json build/fuzz/app.json
    python tests/fuzz/run.py --replay             # every committed seed and regression input once

Targets: ``app`` (tests/fuzz/fuzz_app.c: frame receiver + command handling of firmware/app/, on a
fake HAL) and ``blob`` (tests/fuzz/fuzz_blob.c: the blob reader, then the engine on
what it accepts); ``app32`` and ``blob32`` are the same built with -m32, so size_t is 32 bits as on
the boards (length arithmetic that wraps there but not on x86-64 is caught). Inputs: tests/fuzz/corpus/<target>/ (seeds, committed), tests/fuzz/regressions/
<target>/ (inputs that once crashed, committed), build/fuzz/work/<target>/ (what the fuzzer finds,
not committed). A crash leaves its input in build/fuzz/crashes/: copy it into tests/fuzz/
regressions/<target>/ once fixed. Exit status: 0 clean, 1 a crash or sanitizer report, 2 no
toolchain. Prints one JSON line per target: executions, executions a second (libFuzzer's average),
crashes, coverage, seconds. fuzz_app boots the app once per process and restores the booted state
before each input; --replay boots it for every input, as a board does."""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))   # run as a script: the repository's packages
from firmware.build_meta import APP_DIR, APP_SOURCES, ENGINE_DIR, ENGINE_SOURCES  # noqa: E402

BUILD = ROOT / "build" / "fuzz"
TARGETS = ("app", "blob", "app32", "blob32")   # *32: built with -m32, the MCUs' 32-bit size_t
CFLAGS = ["-std=c99", "-g", "-O1", "-fno-omit-frame-pointer", "-ffp-contract=off",
          "-fsanitize=fuzzer,address,undefined", "-fno-sanitize-recover=all",
          "-Wall", "-Wextra", "-Werror", "-Wno-unused-parameter"]


class NoToolchain(RuntimeError):
    pass


def clang() -> str:
    for cc in ("clang", "clang-14", "clang-15", "clang-16"):
        if shutil.which(cc):
            return cc
    raise NoToolchain("clang not found: apt-get install -y clang libclang-rt-14-dev")


def blob_path(build: Path = BUILD) -> Path:
    """The model fuzz_app boots (written by make_blob.py, with its siblings)."""
    p = build / "app_q8.flmb"
    writers = [HERE / "make_blob.py", *sorted((ROOT / "converter").glob("*.py"))]   # a blob of an older writer is stale
    if not p.is_file() or p.stat().st_mtime < max(w.stat().st_mtime for w in writers):
        subprocess.run([sys.executable, str(HERE / "make_blob.py"), str(build)], check=True,
                       stdout=subprocess.DEVNULL)
    return p


def base(target: str) -> str:
    return target[:-2] if target.endswith("32") else target


def build(target: str, build: Path = BUILD) -> Path:
    """Compile a target (cached on the sources' mtimes); returns the binary."""
    cc = clang()
    build.mkdir(parents=True, exist_ok=True)
    app = base(target) == "app"     # blob: the reader and the engine only, no app, protocol or HAL
    srcs = [HERE / f"fuzz_{base(target)}.c", *ENGINE_SOURCES, *(APP_SOURCES if app else ())]
    exe = build / f"fuzz_{target}"
    deps = srcs + sorted(ENGINE_DIR.glob("*.h")) + sorted(APP_DIR.glob("*.h")) + [Path(__file__)]
    if exe.is_file() and exe.stat().st_mtime >= max(p.stat().st_mtime for p in deps):
        return exe
    m32 = ["-m32"] if target.endswith("32") else []
    cmd = [cc, *CFLAGS, *m32, f"-I{ENGINE_DIR}", f"-I{APP_DIR}", "-DFLM_MAX_LAYERS=4", *map(str, srcs), "-o", str(exe)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        if "cannot find" in r.stderr and "fuzzer" in r.stderr:
            raise NoToolchain("libFuzzer runtime missing: apt-get install -y libclang-rt-14-dev")
        if m32 and ("libc-header-start" in r.stderr or "-lstdc++" in r.stderr or "crtbegin" in r.stderr):
            raise NoToolchain("no 32-bit C/C++ libraries: apt-get install -y libc6-dev-i386 lib32stdc++-12-dev")
        raise RuntimeError(f"building fuzz_{target} failed:\n{r.stderr[-3000:]}")
    return exe


def corpus_dirs(target: str) -> list[Path]:
    t = base(target)       # the 32-bit builds share the inputs
    return [d for d in (HERE / "corpus" / t, HERE / "regressions" / t) if d.is_dir()]


def _env() -> dict:
    env = dict(os.environ)
    env["FLM_FUZZ_BLOB"] = str(blob_path())
    env["ASAN_OPTIONS"] = "abort_on_error=0:detect_leaks=1:allocator_may_return_null=0"
    env["UBSAN_OPTIONS"] = "print_stacktrace=1:halt_on_error=1"
    return env


def _parse(out: str) -> dict:
    def last(pattern, default=0):
        m = re.findall(pattern, out)
        return int(m[-1]) if m else default
    return {"executions": last(r"stat::number_of_executed_units:\s*(\d+)", last(r"Done (\d+) runs")),
            "exec_per_s": last(r"stat::average_exec_per_sec:\s*(\d+)"),
            "coverage": last(r"cov: (\d+)"), "features": last(r"ft: (\d+)"),
            "corpus": last(r"corp: (\d+)"),
            "sanitizer_reports": len(re.findall(r"ERROR: (?:AddressSanitizer|LeakSanitizer)|runtime error:", out)),
            "crashes": len(re.findall(r"(?:Test unit written to|artifact_prefix.*?; Test unit)", out))}


MAX_LEN = {"app": 4096, "blob": 16384, "app32": 4096, "blob32": 16384}   # blob: room for the seed images


def fuzz(target: str, seconds: float, seed: int = 1, max_len: int | None = None, quiet: bool = True,
         work: Path | None = None) -> dict:
    """Fuzz ``target`` for ``seconds`` from its committed inputs (what it finds goes to ``work``,
    build/fuzz/work/<target> by default); returns the figures."""
    exe = build(target)
    max_len = max_len or MAX_LEN[target]
    work = Path(work) if work is not None else BUILD / "work" / target
    work.mkdir(parents=True, exist_ok=True)
    crashes = BUILD / "crashes"
    crashes.mkdir(parents=True, exist_ok=True)
    before = set(crashes.iterdir())
    cmd = [str(exe), f"-max_total_time={int(seconds)}", f"-seed={seed}", f"-max_len={max_len}",
           "-timeout=20", "-rss_limit_mb=2048", "-print_final_stats=1", "-use_value_profile=1",
           f"-artifact_prefix={crashes}/{target}-", str(work), *map(str, corpus_dirs(target))]
    t0 = time.monotonic()
    r = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=seconds + 120)
    out = r.stdout + r.stderr
    res = {"target": target, "seconds": round(time.monotonic() - t0, 1), **_parse(out)}
    new = sorted(set(crashes.iterdir()) - before)
    res["crashes"] = max(res["crashes"], len(new))
    res["crash_inputs"] = [str(p) for p in new]
    res["returncode"] = r.returncode
    if r.returncode != 0 and not new:
        res["crashes"] = max(res["crashes"], 1)
    if res["crashes"] or res["sanitizer_reports"]:
        res["log_tail"] = out[-4000:]
    if not quiet:
        print(out[-2000:], file=sys.stderr)
    return res


def replay(target: str) -> dict:
    """Every committed seed and regression input once (no mutation)."""
    exe = build(target)
    files = [p for d in corpus_dirs(target) for p in sorted(d.iterdir()) if p.is_file()]
    r = subprocess.run([str(exe), "-runs=1", *map(str, files)], env=dict(_env(), FLM_FUZZ_BOOT_EACH="1"),
                       capture_output=True, text=True, timeout=300)
    out = r.stdout + r.stderr
    return {"target": target, "inputs": len(files), "returncode": r.returncode,
            "sanitizer_reports": _parse(out)["sanitizer_reports"], "log_tail": out[-3000:] if r.returncode else ""}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", default="app,blob", help=f"comma-separated, from {', '.join(TARGETS)}")
    ap.add_argument("--seconds", type=float, default=60.0, help="per target")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--replay", action="store_true", help="run the committed inputs once and stop")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args(argv)
    targets = [t for t in args.targets.split(",") if t]
    for t in targets:
        if t not in TARGETS:
            ap.error(f"unknown target {t!r} (choose from {', '.join(TARGETS)})")
    try:
        results = [replay(t) if args.replay else fuzz(t, args.seconds, args.seed) for t in targets]
    except NoToolchain as e:
        print(f"fuzz: {e}", file=sys.stderr)
        return 2
    bad = False
    for r in results:
        tail = r.pop("log_tail", "")
        print(json.dumps(r))
        if r["returncode"] != 0 or r.get("crashes") or r.get("sanitizer_reports"):
            bad = True
            print(tail, file=sys.stderr)
            for p in r.get("crash_inputs", []):
                print(f"fuzz: crashing input {p}: reproduce with {BUILD}/fuzz_{r['target']} {p}; "
                      f"once fixed, copy it to tests/fuzz/regressions/{r['target']}/", file=sys.stderr)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
