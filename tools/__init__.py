"""Developer tools: reference data and side-by-side measurements. Not installed with echoline."""
