"""launcher: brings SGLang servers up on remote GPU hosts and keeps them up.

The map of the package (layers, one attempt's data flow, the events, where SGLang knowledge
lives) is docs/architecture.md; the SGLang behaviour it relies on, with source paths, is
docs/sglang.md.
"""

__version__ = "0.1.0"
