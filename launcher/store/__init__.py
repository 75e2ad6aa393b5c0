"""Local state: the state-directory lock (``lock``) and the attempt ledger (``ledger``)."""
