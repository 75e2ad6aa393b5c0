"""What SGLang's multi-node ranks print, and which rank's failure is the cause. Pure.

Sources (0.5.10 and 0.5.23 alike unless noted):

- ``utils/common.py`` ``launch_dummy_health_check_server``: a node >= 1 whose schedulers are
  ready logs ``Dummy health check server started in background thread at HOST:PORT`` and serves
  a ``/health`` that always answers 200. That line is the node's "joined" mark; its probes
  prove nothing.
- ``entrypoints/engine.py`` (0.5.23 only): after that, SIGTERM on a node >= 1 only logs
  ``SIGTERM received on node_rank N; waiting for the rank-0 ShutdownReq broadcast ...``.
- ``managers/scheduler_components/request_receiver.py``: every scheduler iteration broadcasts
  over the gloo CPU group, so when a peer *process* dies the others fail at once with gloo's
  ``Connection closed by peer`` / ``Connection reset by peer`` (wrapped as ``Capture cuda
  graph failed: ...`` during capture, #4205); a vanished *host* is only seen by torch's NCCL
  watchdog (``Watchdog caught collective operation timeout``, 600 s, ``--dist-timeout``) or
  gloo's 120-minute timeout.

- ``distributed/gated_launch.py`` (0.5.23, ``--gated-launch-port P``): every scheduler logs
  ``Gated launch waiting for activation. rank=N`` after distributed init and blocks until
  ``POST /gate/activate`` reaches rank 0's control server on ``--host:P``; then ``Gated launch
  activated. elapsed=X s``. Once every rank waits there, all ranks have joined.

A rank that died of such an error died because a peer did: a consequence. The cause is a
rank that died of its own error (an OOM, a bad argument, SIGKILL from outside...).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from launcher.sglang.outcome import Diagnosis, Outcome

__all__ = [
    "DIST_TIMEOUT_ADVICE",
    "gate_waiting_rank",
    "is_consequence",
    "is_joined_line",
    "pick_cause",
]

# distributed/gated_launch.py (0.5.23): every scheduler, after "Init parallel ends".
_GATE_WAITING = re.compile(r"Gated launch waiting for activation\. rank=(\d+)")
_JOINED = re.compile(r"Dummy health check server started in background thread at \S+")
_PEER_DEATH = re.compile(
    r"Connection (?:closed|reset) by peer"
    r"|Watchdog caught collective operation timeout"
    r"|Timed out waiting \d+ms for (?:send|recv) operation to complete"
)
# Outcomes a peer's death is classified as on the surviving ranks; an OOM or a bad argument
# on a rank is its own, whatever else its log shows.
_CONSEQUENCE_OUTCOMES = frozenset(
    {Outcome.NCCL_ERROR, Outcome.OTHER, Outcome.INCOMPLETE, Outcome.KILLED, Outcome.HANG}
)

DIST_TIMEOUT_ADVICE = (
    "SGLang's own distributed timeouts are long (NCCL 10 min, --dist-timeout; gloo 120 min), "
    "so launcher's stall budgets catch a stuck node first; if a node is legitimately slower "
    "(weights on slow storage), raise the stall budget and pass --dist-timeout (e.g. 3600) "
    "in extra_args"
)


def is_joined_line(line: str) -> bool:
    """Whether ``line`` is a node >= 1's "Dummy health check server started" line."""
    return _JOINED.search(line) is not None


def gate_waiting_rank(line: str) -> int | None:
    """The global rank of a ``Gated launch waiting for activation. rank=N`` line, else None."""
    m = _GATE_WAITING.search(line)
    return int(m.group(1)) if m else None


def is_consequence(diag: Diagnosis, lines: Iterable[str]) -> bool:
    """Whether a rank whose attempt ended with ``diag`` (its log ``lines``) died because a
    peer died: a peer-death error in its log and no failure of its own kind."""
    if diag.outcome not in _CONSEQUENCE_OUTCOMES:
        return False
    return any(_PEER_DEATH.search(line) for line in [*diag.evidence, *lines])


def pick_cause(ended: Sequence[tuple[int, Diagnosis, bool]]) -> int:
    """The index into ``ended`` (rank, diagnosis, consequence) in the order the ranks were
    seen to end, of the one to name as the cause: the first that is not a consequence, else
    the first to end."""
    for i, (_, _, consequence) in enumerate(ended):
        if not consequence:
            return i
    return 0
