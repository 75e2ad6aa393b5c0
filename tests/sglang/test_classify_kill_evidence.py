"""The evidence of a kill the log does not record (the mutation run's survivors of
``_kill_evidence``).

Input is a real log, verbatim: tests/fixtures/real_logs/sgldocs_send_request_ready_tp1.log
(provenance in its ``.toml``), a server that came up and served its first requests.
"""

from __future__ import annotations

from pathlib import Path

from launcher.sglang.classify import diagnose_text
from launcher.sglang.outcome import Outcome

LOG = Path(__file__).parents[1] / "fixtures" / "real_logs" / "sgldocs_send_request_ready_tp1.log"


def test_a_kill_while_serving_shows_the_last_two_telling_lines_then_the_signal() -> None:
    """Exit 137 with no error in the log: the evidence is the last two lines that are not
    routine traffic (the access lines and the prefill statistics after uvicorn's start are
    skipped), then what killed it."""
    with open(LOG, encoding="utf-8", newline="") as f:
        text = f.read()
    lines = text.split("\n")
    uvicorn = next(line for line in lines if "Uvicorn running on" in line)
    ready = next(line for line in lines if "fired up and ready" in line)
    assert lines.index(uvicorn) < lines.index(ready) - 3  # routine lines lie between them
    d = diagnose_text(text, 137)
    assert (Outcome.KILLED, [uvicorn, ready, "killed by signal 9 (SIGKILL); no error in the log"]
            ) == (d.outcome, d.evidence)
