"""Everything launcher knows about SGLang that needs no I/O.

- :mod:`launcher.sglang.versions`: version parsing, the supported versions, the one default
  version, and the named versions from which a behaviour changes;
- :mod:`launcher.sglang.flags`: the flags launcher owns and how each is spelled per version;
- :mod:`launcher.sglang.autoargs`: SGLang's auto values (``--mem-fraction-static``,
  ``--cuda-graph-max-bs``, ``--chunked-prefill-size``, the captured batch sizes).

The supervisor's side (``command``, ``policy``, ``config``) and the simulator
(``launcher.sim``) both import from here; nothing here imports from either. See
docs/sglang.md for the SGLang source each rule comes from.
"""
