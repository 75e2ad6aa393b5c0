"""One endpoint for a server, whoever shows it: `status` names the address Slack and metrics
name (``127.0.0.1:30123`` for a local server, not ``localhost:30123``)."""

from __future__ import annotations

import pytest

from launcher.cli import inspection
from launcher.config.load import config_from_dict
from launcher.hooks.identity import ServerFacts


@pytest.mark.parametrize(
    ("host", "listen", "expected"),
    [
        ({"name": "box", "transport": "local"}, "127.0.0.1", "127.0.0.1:30123"),
        ({"name": "box", "transport": "local"}, "0.0.0.0", "127.0.0.1:30123"),
        ({"name": "box", "transport": "local"}, "::", "[::1]:30123"),
        ({"name": "box", "address": "10.0.0.5"}, "0.0.0.0", "10.0.0.5:30123"),
        ({"name": "box", "address": "fd00::5"}, "0.0.0.0", "[fd00::5]:30123"),
    ],
)
def test_status_slack_and_metrics_name_one_endpoint(
    host: dict[str, str], listen: str, expected: str
) -> None:
    config = config_from_dict({
        "hosts": [host],
        "servers": [{"name": "s", "host": "box", "model_path": "/m", "gpus": [0],
                     "port": 30123, "listen": listen}],
    }, environ={})
    server = config.servers[0]
    shown = (inspection.endpoint(config, server),
             ServerFacts.of(server, config.host("box")).endpoint)
    assert (expected, expected) == shown
