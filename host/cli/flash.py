"""``flashlm flash``'s options: upload a rendered PlatformIO project, then the blob."""
from __future__ import annotations


def add_parser(sub) -> None:
    f = sub.add_parser("flash", help="build and upload a PlatformIO project from 'build', then write the blob")
    f.add_argument("project", metavar="PROJECT", help="the directory 'flashlm build --board B' rendered")
    f.add_argument("--port", metavar="P", help="serial port (default: found by the board's USB VID/PID)")
    f.add_argument("--dry-run", action="store_true", help="print every command, run none")
    f.set_defaults(func=cmd_flash)


def cmd_flash(args, console) -> int:
    from ..boards.flash import flash    # pyserial and the UF2 writer: not for --help
    return flash(args.project, port=args.port, dry_run=args.dry_run,
                 echo=lambda line: console.print(line, markup=False, highlight=False, soft_wrap=True))
