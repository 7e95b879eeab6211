"""The benchmarks that need the sidecar (its prompts, jobs or server), and their cases.

Kept apart from the product so the language server never loads them: they sit above the
sidecar modules they measure, and only the CLI's ``bench`` command imports them, when it
runs. The cases are data files in ``data/`` (installed with the package), read at run time.
"""
