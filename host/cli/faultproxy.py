"""``flashlm faultproxy``: serve a pty between the host and a board that damages the bytes
(host/link/faultproxy.py), for testing. It prints ``pty PATH`` (again after each reopen) and runs
until Ctrl-C / SIGTERM, then prints its counters as one JSON line on stderr."""
from __future__ import annotations

import json
import signal
import sys
import threading
from dataclasses import asdict

from ..link.faultproxy import KINDS, FaultProxy, Faults


def add_parser(sub) -> None:
    p = sub.add_parser("faultproxy", help="serve a pty between the host and a board that damages the bytes "
                                          "(drop, dup, flip, insert, boot noise, line close): for testing")
    p.add_argument("upstream", help="the board's serial port (e.g. a native board's pty)")
    for k in KINDS:
        p.add_argument(f"--{k}", type=float, default=0.0, metavar="RATE",
                       help=f"per-byte probability of '{k}' on board→host bytes")
    p.add_argument("--to-device", default="", metavar="SPEC",
                   help="faults on host→board bytes, e.g. 'drop=0.001,flip=0.001'")
    p.add_argument("--boot-noise", action="store_true", help="write a boot log to the host when it connects")
    p.add_argument("--close-after", type=int, default=None, metavar="BYTES",
                   help="close the line after this many bytes reached the host")
    p.add_argument("--reopen-after", type=float, default=None, metavar="S",
                   help="after a close, open a new pty after this many seconds (printed as 'pty PATH')")
    p.add_argument("--baud", type=int, default=None, help="pace board→host bytes at baud/10 bytes/s")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_faultproxy)


def cmd_faultproxy(args, console) -> int:
    """Run the proxy from parsed options until SIGINT/SIGTERM; prints ``pty PATH`` lines on stdout
    (again after each reopen) and the counters as one JSON line on stderr at the end."""
    try:
        faults = Faults(**{k: getattr(args, k) for k in KINDS})
        to_dev = Faults.parse(args.to_device)
    except ValueError as e:
        print(f"faultproxy: error: {e}", file=sys.stderr)
        return 2
    try:
        proxy = FaultProxy(args.upstream, faults, to_dev, seed=args.seed, boot_noise=args.boot_noise,
                           close_after=args.close_after, reopen_after=args.reopen_after,
                           baud=args.baud).start()
    except OSError as e:
        print(f"faultproxy: error: cannot open {args.upstream}: {e.strerror or e}", file=sys.stderr)
        return 2
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    shown = None
    try:
        while not stop.is_set():
            if proxy.port != shown and proxy.line_up.is_set():
                shown = proxy.port
                print(f"pty {shown}", flush=True)
            stop.wait(0.1)
    finally:
        proxy.stop()
        print(json.dumps({"faults": proxy.faults_injected(), "stats": proxy.stats,
                          "config": {"to_host": asdict(faults), "to_device": asdict(to_dev)}}),
              file=sys.stderr)
    return 0
