"""``python -m echoline …``: the same command as ``echoline …`` (serve, rewrite, models, …)."""

from echoline.sidecar.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
