"""Soak the serial link: many generations on the real native board through host/link/faultproxy.py,
each with its own seed and mix of faults (both directions), each checked step by step against a
clean run of the same generation. Prints (and with --json writes) the totals: faults injected per
kind, steps delivered, reported missing, lost silently (must be 0), delivered wrong (must be 0).

    python tests/fuzz/link_soak.py --runs 40 --json build/fuzz/link_soak.json      # make fuzz
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from converter.blob import write_blob  # noqa: E402
from converter.quantize import quantize  # noqa: E402
from host.link.faultproxy import KINDS, FaultProxy, Faults  # noqa: E402
from host.session.recovery import Policy  # noqa: E402
from host.link.messages import Generate  # noqa: E402
from host.link.port import Link, open_port  # noqa: E402
from host.session.session import Session  # noqa: E402
from host.boards.native import start_native_board  # noqa: E402
from modelzoo import random_model  # noqa: E402
from nativeboard import binary_for  # noqa: E402

PROMPT = [1, 2, 3]


def key(t):
    return (t.step, t.pos, t.in_id, t.out_id, tuple(t.bytes_read), t.logits_crc, bytes(t.piece))


def soak(runs: int, seed: int, workdir: Path) -> dict:
    _, ir = random_model(seed=1, dim=32, n_heads=2, n_kv_heads=1, hidden_dim=40, vocab_size=30, max_seq_len=64,
                         n_layers=1)
    blob = workdir / "m.flmb"
    write_blob(quantize(ir, "q8", 32), blob)
    binary = binary_for(blob, workdir / "build")
    rng = random.Random(seed)
    tot = {"runs": 0, "steps": 0, "delivered": 0, "reported_missing": 0, "lost_silently": 0, "wrong": 0,
           "resent": 0, "regenerations": 0, "faults": {k: 0 for k in KINDS}, "boot_noise": 0,
           "bytes_to_host": 0, "bytes_to_device": 0, "slowest_run_s": 0.0}
    with start_native_board(binary, blob) as vb:
        ser = open_port(vb.port)
        s = Session(Link(ser))
        s.handshake()
        truth = {}
        for n, temp in ((24, 0.0), (60, 0.0), (24, 0.8)):
            truth[(n, temp)] = {t.step: t for t in s.generate(Generate(PROMPT, n, temperature=temp, seed=5)).tokens}
        ser.close()
        for i in range(runs):
            n, temp = rng.choice(list(truth))
            scale = rng.choice([1e-3, 3e-3, 6e-3])
            to_host = Faults(**{k: scale * rng.random() / (3 if k == "noise" else 1) for k in KINDS})
            to_dev = Faults(**{k: scale * rng.random() / 3 for k in ("drop", "flip", "insert")})
            with FaultProxy(vb.port, to_host, to_dev, seed=rng.randrange(1 << 30), boot_noise=True) as fp:
                ser = open_port(fp.port)
                try:
                    s = Session(Link(ser))
                    s.handshake(timeout=10, interval=0.2)
                    t0 = time.monotonic()
                    res = s.generate_with_recovery(Generate(PROMPT, n, temperature=temp, seed=5), Policy(frame_timeout=5, retries=6))
                    tot["slowest_run_s"] = max(tot["slowest_run_s"], round(time.monotonic() - t0, 2))
                finally:
                    ser.close()
                for k in KINDS:
                    tot["faults"][k] += fp.stats["to_host"][k] + fp.stats["to_device"][k]
                tot["boot_noise"] += fp.stats["boot_noise"]
                tot["bytes_to_host"] += fp.stats["to_host"]["bytes"]
                tot["bytes_to_device"] += fp.stats["to_device"]["bytes"]
            want = truth[(n, temp)]
            got = {t.step: t for t in res.tokens}
            tot["runs"] += 1
            tot["steps"] += len(want)
            tot["delivered"] += len(got)
            tot["wrong"] += sum(1 for st, t in got.items() if st not in want or key(t) != key(want[st]))
            tot["reported_missing"] += len(res.missing_steps)
            tot["lost_silently"] += len(set(want) - set(got) - set(res.missing_steps))
            tot["resent"] += len(res.resent_steps)
            tot["regenerations"] += len(res.recoveries)
    return tot


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="flashlm-soak-") as d:
        tot = soak(args.runs, args.seed, Path(d))
    print(json.dumps(tot))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(tot, indent=1) + "\n")
    return 0 if tot["lost_silently"] == 0 and tot["wrong"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
