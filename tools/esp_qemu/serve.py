"""``python -m tools.esp_qemu.serve --isa rv32|xtensa --model OUTDIR``: build the image for the model
``flashlm convert`` wrote to OUTDIR, start it in QEMU and print its port, like ``flashlm serve``;
then ``flashlm run --port PORT --model OUTDIR --prompt ...`` talks to it as to any board. Ctrl-C stops it.
(Phase A's stand-in for ``--board``: NOTES-phaseA.md.)"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from . import board
from .build import ISAS, build


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.esp_qemu.serve", description=__doc__.split("\n\n")[0])
    ap.add_argument("--isa", choices=sorted(ISAS), required=True)
    ap.add_argument("--model", required=True, help="a flashlm convert output folder (its model.flmb)")
    ap.add_argument("-o", "--out", help="build folder (default: MODEL/build/<board>)")
    a = ap.parse_args(argv)
    blob = Path(a.model) / "model.flmb"
    if not blob.is_file():
        print(f"serve: error: {blob} does not exist (run flashlm convert first)", file=sys.stderr)
        return 2
    import signal
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt))   # stop QEMU too
    isa = ISAS[a.isa]
    elf = build(isa, blob, Path(a.out) if a.out else Path(a.model) / "build" / isa.board)
    with board.start(isa, elf, blob) as b:
        print(f"{isa.board} ({isa.what}): port {b.port}", flush=True)
        try:
            while b.alive:
                time.sleep(0.5)
        except KeyboardInterrupt:
            return 0
        print(f"serve: {b.describe_exit()}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
