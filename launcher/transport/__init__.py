"""How launcher runs things on a host: locally (``local``) or over SSH (``ssh``)."""
