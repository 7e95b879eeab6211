"""Errors the engine raises with messages meant for the person at the keyboard."""


class EcholineError(Exception):
    """Base class: anything the CLI or the sidecar should report as a clear message."""


class ModelFileError(EcholineError):
    """The model file is missing, truncated, corrupt or uses something unsupported."""


class UnsupportedArchitectureError(EcholineError):
    """general.architecture names a model family echoline has no forward pass for."""


class TokenizerError(EcholineError):
    """The tokenizer metadata cannot be turned into a tokenizer (e.g. unknown pre-tokenizer)."""


class ModelNotFoundError(EcholineError):
    """A model name that is neither a known name nor an existing path."""


class CancelledError(EcholineError):
    """Generation stopped because the caller's cancel flag was set."""
