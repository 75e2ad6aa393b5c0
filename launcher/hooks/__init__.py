"""Hooks: what the supervisor's events feed (Slack, metrics, systemd, logs, the ledger recorder)."""
