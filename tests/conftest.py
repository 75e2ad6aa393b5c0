"""Shared fixtures. Keep this file to small, generic fixtures; test helpers live in modules."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.sshd import Sshd
from tests.supervise import SimSetup


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[SimSetup]:
    """A fresh simulated host (two 79 GiB GPUs), run dir, state dir and port; every process the
    test started there is killed at teardown."""
    setup = SimSetup.create(tmp_path)
    try:
        yield setup
    finally:
        setup.cleanup()


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
