"""``python -m echoline.sidecar …``: the ``echoline`` command under its package's name."""

from echoline.sidecar.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
