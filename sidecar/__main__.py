"""``python -m sidecar serve [--tcp HOST:PORT]`` and ``python -m sidecar rewrite …``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from sidecar.cli import parse_hostport


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "rewrite":
        from sidecar.rewrite_cli import main as rewrite_main

        return rewrite_main(argv[1:])
    p = argparse.ArgumentParser(prog="python -m sidecar")
    sub = p.add_subparsers(dest="cmd", required=True)
    serve = sub.add_parser("serve", help="run the language server (stdio by default)")
    serve.add_argument("--tcp", type=parse_hostport, metavar="HOST:PORT")
    serve.add_argument("--stdio", action="store_true", help="stdio (the default)")
    serve.add_argument("--allow-remote", action="store_true", help="--tcp: allow a non-loopback bind")
    sub.add_parser("rewrite", help="rewrite lines of a file (see: rewrite --help)")
    args = p.parse_args(argv)
    from sidecar import server

    if args.tcp:
        server.run_tcp(*args.tcp, allow_remote=args.allow_remote)
    else:
        server.run_stdio()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
