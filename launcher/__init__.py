"""launcher: brings SGLang servers up on remote GPU hosts and keeps them up."""

__version__ = "0.1.0"
