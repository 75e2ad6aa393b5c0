"""Shared fixtures. Keep this file to small, generic fixtures; test helpers live in modules."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests.sshd import Sshd


@pytest.fixture
def make_sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[], Sshd]]:
    """Factory that starts a fresh real sshd on 127.0.0.1 per call; all are stopped at teardown.

    Fails (never skips) when OpenSSH's sshd is not installed.
    """
    started: list[Sshd] = []

    def make() -> Sshd:
        daemon = Sshd(tmp_path_factory.mktemp("sshd"))
        started.append(daemon)
        daemon.start()
        return daemon

    yield make
    for daemon in started:
        daemon.stop()


@pytest.fixture
def sshd_host(make_sshd: Callable[[], Sshd]) -> Sshd:
    """One running real sshd that the test's generated client key may log in to."""
    return make_sshd()
