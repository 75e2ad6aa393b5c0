"""The `launcher` console script: each command is a function in its own module; this module
registers them on ``launcher.cli.app.app``, in the order `launcher --help` lists them."""

from __future__ import annotations

from launcher.cli import check, diagnose, down, history, logs, plan, status, up
from launcher.cli.app import EXIT_CODES_HELP, ConventionalHelp, app

for command in (diagnose.diagnose, plan.plan, up.up, history.history, down.down, status.status,
                status.describe, logs.logs, check.check):
    app.command(cls=ConventionalHelp, epilog=EXIT_CODES_HELP)(command)


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
