"""echoline: exact n-gram speculative decoding for code edits, in an editor sidecar.

The repository keeps ``engine/``, ``kernels/`` and ``sidecar/`` as top-level folders (the
layout is part of the design: data flows editor → sidecar → engine → kernels). They are
installed under this one name — ``echoline.engine``, ``echoline.kernels``,
``echoline.sidecar`` — so that nothing generic like ``kernels`` lands in site-packages.

An installed wheel has them inside this package. A source tree that was never installed
(the GPU machine runs one with only ``PYTHONPATH``) has them beside it; there the
package's search path is widened to the repository root so the same imports work.
"""

from __future__ import annotations

from pathlib import Path

_here = Path(__file__).resolve().parent
if not (_here / "engine").is_dir() and (_here.parent / "engine" / "__init__.py").is_file():
    __path__.append(str(_here.parent))  # noqa: F821 - a package's __path__ is defined


def __getattr__(name: str) -> str:
    """``echoline.__version__``, read from the package metadata on first use."""
    if name == "__version__":
        from echoline.version import package_version

        return package_version()
    raise AttributeError(name)
