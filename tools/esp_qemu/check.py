"""``python -m tools.esp_qemu.check``: prove the QEMU boards bit-exact with the NumPy reference and
the native board, on real models, and show the negative controls fail as they must.

For each model (the shipped default model as int8 and int4, stories260K as int8 and int4; convert's
defaults otherwise: row scales, int8 KV cache, batch 4; stories260K at a context of 128) and each board (native, the ESP32-C3's ISA,
the ESP32-S3's ISA):

- the boot golden check (HELLO: "bit-exact with the reference: yes (2 of 4 golden steps)") and
  SELFTEST (all steps);
- the same generations on every board, compared frame for frame (every TOKEN's step, position,
  ids, head rows, logits CRC-32 and pass): greedy with every step's whole head (so every step has
  a CRC, checked against converter.reference.generate too), seeded sampling, the prompt in
  passes of 4 (batched prefill) and greedy speculation from prompt lookup;
- and each QEMU board's emulated instructions per decode token (from its TOKEN frames).

Negative controls (``--controls``): the Xtensa image with every multiply-add the C allows fused into
the FPU's MADD.S, which rounds once (xtensa.py fuse_multiply_adds: what GCC's default
-ffp-contract=fast does on the S3; LLVM 22 itself fuses nothing even with -ffp-contract=fast) and the RISC-V image with FLM_FAULT_FTZ (the
soft-float flushes subnormals to zero, as a ROM's might) must each report "no" with the first step
that differs, on the default model with subnormal embedding rows for the FTZ one (as
tests/test_golden.py does for the RP2040).

Prints a table and a JSON summary (``--json F``); exits 1 when anything differs that should not.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import serial

from converter.blob import kv_format, read_blob, read_golden, read_header
from converter.reference import FLAG_ALL_LOGITS, NO_TOKEN, generate
from firmware.build import build_firmware
from host.protocol import Done, Error, Generate, Hello, Link, Log, Ping, SelfTest, Token
from host.virtual import start_native_board

from . import board as qemu_board
from .build import ISAS, build

ROOT = Path(__file__).resolve().parents[2]
STORIES = ROOT.parent.parent / "shared" / "models" / "stories260K"   # /work/shared from a worktree
if not STORIES.is_dir():
    STORIES = ROOT.parent / "shared" / "models" / "stories260K"

MODELS = {
    "default-q8": (ROOT / "models" / "default" / "model.pt", ["--format", "q8"], "ROMEO:\nWhat"),
    "default-q4": (ROOT / "models" / "default" / "model.pt", ["--format", "q4"], "ROMEO:\nWhat"),
    # the f32 KV cache: float attention (the negative control's model: with the int8 cache the few
    # float multiply-adds sit before an int8 quantization, which absorbs a fused one's rounding)
    "default-q8-kvf32": (ROOT / "models" / "default" / "model.pt", ["--format", "q8", "--kv", "f32"], "ROMEO:\nWhat"),
    "ple-q8": (ROOT / "models" / "ple" / "model.pt", ["--format", "q8"], "ROMEO:\nWhat"),
    # a context of 128 (of the model's 512): with 512 the KV cache and buffers do not fit the C3's SRAM
    # budget (the planner: 171 positions fit)
    "stories260K-q8": (STORIES / "stories260K.bin", ["--format", "q8", "--ctx", "128", "--tokenizer",
                                                     str(STORIES / "tok512.bin")], "Once upon a time"),
    "stories260K-q4": (STORIES / "stories260K.bin", ["--format", "q4", "--ctx", "128", "--tokenizer",
                                                     str(STORIES / "tok512.bin")], "Once upon a time"),
}
BOARDS = ("native", "rv32", "xtensa")
TIMEOUT = 300.0


def convert(name: str, work: Path) -> Path:
    """flashlm convert the named model into work/name; returns the model dir (cached)."""
    src, args, _ = MODELS[name]
    out = work / name
    if not (out / "model.flmb").is_file():
        r = subprocess.run([sys.executable, "-m", "host.cli", "convert", str(src), "-o", str(out), *args],
                           cwd=ROOT, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"convert {name}: {(r.stderr or r.stdout).strip().splitlines()[-1:]}")
    return out


def prompt_ids(model_dir: Path, text: str) -> list[int]:
    from converter.tokenizer import encode
    from host.model_dir import load_manifest, load_model_tokenizer
    _, manifest = load_manifest(model_dir)
    return list(encode(load_model_tokenizer(model_dir, manifest, required=True), text, bos=True))


def recv_until(link, done, timeout: float = TIMEOUT) -> list:
    out, t0 = [], time.monotonic()
    while time.monotonic() - t0 < timeout:
        f = link.recv(0.5)
        if f is not None:
            out.append(f.msg)
            if done(f.msg):
                return out
    raise TimeoutError(f"no answer within {timeout:g} s; last frames {out[-3:]}")


@contextlib.contextmanager
def session(kind: str, blob: Path, work: Path, defines=(), fused=False):
    """Yields (link, boot HELLO, board) for ``kind`` ("native", "rv32", "xtensa") running blob."""
    tag = "-".join([kind, *(d.split()[0] for d in defines), *(["fused"] if fused else [])])
    out = work / f"build-{blob.parent.name}-{tag}"
    if kind == "native":
        start = lambda: start_native_board(build_firmware("native", out, blob).binary, blob)  # noqa: E731
    else:
        elf = build(kind, blob, out, defines, fused=fused)
        start = lambda: qemu_board.start(kind, elf, blob)  # noqa: E731
    with start() as b:
        port = serial.Serial(b.port, 115200, timeout=0.05)
        try:
            link = Link(port)
            link.send(Ping())
            hello = recv_until(link, lambda m: isinstance(m, Hello))[-1]
            yield link, hello, b
        finally:
            port.close()


def selftest(link) -> Hello:
    seen: list = []
    link.send(SelfTest())
    return recv_until(link, lambda m: (seen.append(m) or True) and isinstance(m, Hello)
                      and any(isinstance(x, Log) and "golden" in x.text for x in seen))[-1]


def run(link, gen: Generate) -> tuple[list[Token], Done | Error]:
    link.send(gen)
    msgs = recv_until(link, lambda m: isinstance(m, (Done, Error)))
    return [m for m in msgs if isinstance(m, Token)], msgs[-1]


def key(t: Token) -> tuple:
    """What must be equal on every board: everything of a TOKEN but its times and byte counts."""
    return (t.step, t.pos, t.in_id, t.out_id, t.head_rows, t.logits_crc, t.piece, t.chunk, t.chunk_len,
            t.chunk_used, t.kind)


def generations(ids: list[int]) -> dict[str, Generate]:
    return {
        "greedy, every step's whole head": Generate(ids, 24, all_logits=True, batch=1),
        "greedy (the head index), one token a pass": Generate(ids, 32, batch=1),
        "sampled (T 0.8, top-p 0.9, seed 11)": Generate(ids, 24, temperature=0.8, top_p=0.9, seed=11, batch=1),
        "prefill in passes of 4, greedy": Generate(ids * 3, 8, batch=4),
        "speculative (prompt lookup, 3 drafts)": Generate(ids * 2, 24, speculate="lookup", draft_k=3),
    }


def decode_steps(toks: list[Token]) -> list[Token]:
    """The steps of one-token passes after the prompt (decoding)."""
    first = next((t.step for t in toks if t.out_id is not None), len(toks))
    return [t for t in toks if t.kind == "one" and t.chunk_len == 1 and t.step > first]


def instructions_per_decode_token(toks: list[Token]) -> float | None:
    """Mean of the clock's count over the decode steps of a generation (the phases' sum)."""
    dec = [sum(t.us) for t in decode_steps(toks)]
    return float(np.mean(dec)) if dec else None


def per_phase(toks: list[Token]) -> dict:
    """Mean count per phase over the decode steps, and the mean head rows they computed."""
    from host.protocol import PHASES
    dec = decode_steps(toks)
    out = {ph: float(np.mean([t.us[i] for t in dec])) for i, ph in enumerate(PHASES)} if dec else {}
    out["head_rows"] = float(np.mean([t.head_rows for t in dec])) if dec else 0.0
    out["steps"] = len(dec)
    return out


def check_model(name: str, work: Path, boards=BOARDS) -> dict:
    model_dir = convert(name, work)
    blob = model_dir / "model.flmb"
    qm = read_blob(blob)
    ids = prompt_ids(model_dir, MODELS[name][2])
    gens = generations(ids)
    kv = kv_format(read_header(blob).state_tiers)
    ref = generate(qm, ids, 24, flags=FLAG_ALL_LOGITS, kv=kv)
    res: dict = {"model": name, "prompt_ids": ids, "boards": {}}
    streams: dict = {}
    for kind in boards:
        t0 = time.monotonic()
        with session(kind, blob, work) as (link, hello, b):
            st = selftest(link)
            r = {"board": hello.board, "clock": hello.clock_name, "boot": hello.bit_exact, "selftest": st.bit_exact,
                 "generations": {}}
            for gname, gen in gens.items():
                toks, done = run(link, gen)
                streams.setdefault(gname, {})[kind] = [key(t) for t in toks]
                g = {"steps": len(toks), "end": getattr(done, "reason", f"error {done}")}
                if gname.startswith("greedy (the head index)"):
                    g["per_phase"] = per_phase(toks)
                    g["per_decode_token"] = instructions_per_decode_token(toks)
                if gname.startswith("greedy, every"):
                    g["reference"] = ([(t.in_id, NO_TOKEN if t.out_id is None else t.out_id, t.logits_crc) for t in toks]
                                      == [(x["in_id"], x["out_id"], x["logits_crc"]) for x in ref])
                    g["instructions_per_decode_token" if kind != "native" else "host_us_per_decode_token"] = \
                        instructions_per_decode_token(toks)
                r["generations"][gname] = g
            r["wall_s"] = round(time.monotonic() - t0, 1)
        res["boards"][kind] = r
    res["equal_to_native"] = {g: {k: s[k] == s["native"] for k in s if k != "native"} for g, s in streams.items()}
    res["ok"] = (all(r["boot"].startswith("yes") and r["selftest"].startswith("yes") for r in res["boards"].values())
                 and all(all(v.values()) for v in res["equal_to_native"].values())
                 and all(r["generations"]["greedy, every step's whole head"]["reference"] for r in res["boards"].values()))
    return res


def first_differing_step(link, qm, prompt, kv: str) -> int | None:
    """The golden prompt with every step's whole head: the first step whose CRC or token is not the
    reference's (None: none)."""
    from converter import golden
    n = golden.STEPS - len(prompt) + 1
    toks, _ = run(link, Generate(list(prompt), n, all_logits=True, batch=1))
    for t, r in zip(toks, generate(qm, list(prompt), n, flags=FLAG_ALL_LOGITS, kv=kv)):
        if t.logits_crc != r["logits_crc"] or (NO_TOKEN if t.out_id is None else t.out_id) != r["out_id"]:
            return t.step
    return None


def subnormal_model(work: Path) -> Path:
    """The default model q8 with its embedding scaled by 2^-140: the residual stream starts subnormal."""
    from converter.blob import write_blob
    from converter.load import load_model
    from converter.quantize import quantize
    out = work / "default-subnormal"
    if not (out / "model.flmb").is_file():
        out.mkdir(parents=True, exist_ok=True)
        ir = load_model(ROOT / "models" / "default" / "model.pt")
        ir.tensors["tok_embeddings"] = (ir.tensors["tok_embeddings"] * np.float32(2.0 ** -140)).astype(np.float32)
        write_blob(quantize(ir, "q8", 32), out / "model.flmb")
    return out / "model.flmb"


def controls(work: Path) -> dict:
    out = {}
    blob = convert("default-q8-kvf32", work) / "model.flmb"
    for what, kind, b, defines, fused in (("xtensa, multiply-adds fused (MADD.S)", "xtensa", blob, (), True),
                                          ("rv32, soft-float flushing subnormals (FLM_FAULT_FTZ)", "rv32",
                                           subnormal_model(work), ("FLM_FAULT_FTZ=1",), False)):
        qm = read_blob(b)
        with session(kind, b, work, defines, fused) as (link, hello, _):
            st = selftest(link)
            first = first_differing_step(link, qm, read_golden(b.read_bytes()).prompt,
                                         kv_format(read_header(b).state_tiers))
        out[what] = {"boot": hello.bit_exact, "selftest": st.bit_exact, "first_differing_step": first,
                     "ok": st.golden == "differs" and first is not None and st.golden_first_diff == first}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.esp_qemu.check", description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated (empty: none): " + ", ".join(MODELS))
    ap.add_argument("--boards", default=",".join(BOARDS))
    ap.add_argument("--controls", action="store_true", help="also the negative controls")
    ap.add_argument("--work", default="out/esp-qemu", help="where models and builds go (reused)")
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args(argv)
    work = Path(a.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    results = {"models": [], "controls": {}}
    ok = True
    for name in filter(None, a.models.split(",")):
        r = check_model(name, work, tuple(a.boards.split(",")))
        results["models"].append(r)
        ok &= r["ok"]
        print(f"{name}: prompt {len(r['prompt_ids'])} tokens -- {'all equal' if r['ok'] else 'DIFFERS'}")
        for kind, br in r["boards"].items():
            g = br["generations"]["greedy, every step's whole head"]
            d = br["generations"]["greedy (the head index), one token a pass"]
            unit = "emulated instructions" if kind != "native" else "host µs"
            print(f"  {br['board']:18s} boot: {br['boot']}; selftest: {br['selftest']}; greedy = reference: "
                  f"{g['reference']} (wall {br['wall_s']} s)")
            print(f"    a decode token: {d['per_decode_token']:,.0f} {unit} ("
                  + ", ".join(f"{k} {v:,.0f}" for k, v in d["per_phase"].items() if k not in ("steps", "head_rows") and v)
                  + f"; head rows {d['per_phase']['head_rows']:.0f}; {d['per_phase']['steps']} steps); every step's "
                  f"whole head: {g.get('instructions_per_decode_token') or g.get('host_us_per_decode_token'):,.0f}")
        for gname, eq in r["equal_to_native"].items():
            print(f"  {gname:40s} frames equal to native: " + ", ".join(f"{k} {v}" for k, v in eq.items()))
    if a.controls:
        results["controls"] = controls(work)
        for what, c in results["controls"].items():
            ok &= c["ok"]
            print(f"control {what}: boot {c['boot']}; selftest {c['selftest']}; first differing step of the golden "
                  f"prompt {c['first_differing_step']} -- {'as it must' if c['ok'] else 'NOT DETECTED'}")
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1, default=str) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
