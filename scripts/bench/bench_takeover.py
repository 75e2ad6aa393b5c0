"""How long a standby takes to become the active launcher after the active one dies.

Starts a throw-away PostgreSQL (Debian's package, as tests/test_standby.py does), the
simulated GPU host with one server, and real `launcher up` processes with `[coordination]`.
Each round: the active launcher is SIGKILLed at a random point of its renewal cycle, and the
standby's JSON log gives when it took the lease (``lease.acquired``) and when it supervised
the server again (``server.adopted``); then a fresh standby is started for the next round.
Prints p50 / p95 / max of both, from the SIGKILL, and checks that the server was never
relaunched (one attempt in the run dir at the end).

    .venv/bin/python scripts/bench/bench_takeover.py --takeovers 20 --ttl 9s

``--faults N`` runs N rounds of two other faults instead: the active cut off from the engine
(a TCP proxy turned into a black hole; prints how long before the standby took the lease
the old active had stopped) and the engine restarted (prints how often the leader changed).
"""

from __future__ import annotations

import argparse
import random
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # tests.* helpers are not installed; run from anywhere
    sys.path.insert(0, str(REPO))

from tests.pg import CutProxy, Postgres  # noqa: E402
from tests.standby import Up, stamp  # noqa: E402
from tests.supervise import SimSetup  # noqa: E402


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def faults(rounds: int, ttl: str) -> int:
    """``rounds`` × (cut-off, engine restart), each with a fresh pair of launchers."""
    pg = Postgres()
    pg.start()
    gaps: list[float] = []
    changes: list[int] = []
    try:
        for i in range(rounds):
            sim = SimSetup.create(Path(tempfile.mkdtemp(prefix="bench-faults-")))
            proxy = CutProxy(pg.port)
            ups: list[Up] = []
            try:
                a = Up(sim, "box-a", Postgres.dsn_at(proxy.port), f"cut{i}", ttl=ttl)
                ups.append(a)
                a.wait("server.ready")
                b = Up(sim, "box-b", pg.dsn, f"cut{i}", ttl=ttl)
                ups.append(b)
                b.wait("lease.standby")
                proxy.cut()
                gap = stamp(b.wait("lease.acquired")) - stamp(a.wait("lease.lost"))
                gaps.append(gap)
                print(f"cut {i + 1}: old active stopped {gap:.2f}s before the standby took "
                      f"over (exit {a.exit_code()})", flush=True)
                for up in ups:
                    up.stop()
                ups = []
                c = Up(sim, "box-c", pg.dsn, f"restart{i}", ttl=ttl)
                ups.append(c)
                c.wait("server.adopted")
                d = Up(sim, "box-d", pg.dsn, f"restart{i}", ttl=ttl)
                ups.append(d)
                d.wait("lease.standby")
                pg.restart()
                time.sleep(3 * float(ttl.rstrip("s")))
                changed = len(c.events("lease.lost")) + len(d.events("lease.acquired"))
                changes.append(changed)
                print(f"restart {i + 1}: leader changed {changed} time(s)", flush=True)
            finally:
                for up in ups:
                    up.stop()
                proxy.close()
                sim.cleanup()
    finally:
        pg.cleanup()
    print(f"\ncut-off: the old active stopped before the standby took over in "
          f"{sum(g > 0 for g in gaps)}/{len(gaps)} rounds; gap min {min(gaps):.2f}s, "
          f"median {statistics.median(gaps):.2f}s")
    print(f"engine restart: leader changes per restart {changes}")
    return 0 if all(g > 0 for g in gaps) and all(c <= 1 for c in changes) else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--takeovers", type=int, default=20)
    parser.add_argument("--ttl", default="9s", help="[coordination] ttl (default 9s)")
    parser.add_argument("--seed", type=int, default=27)
    parser.add_argument("--faults", type=int, default=0,
                        help="run this many cut-off and engine-restart rounds instead")
    args = parser.parse_args()
    if args.faults:
        return faults(args.faults, args.ttl)
    ttl_s = float(args.ttl.rstrip("s"))
    rng = random.Random(args.seed)
    pg = Postgres()
    pg.start()
    sim = SimSetup.create(Path(tempfile.mkdtemp(prefix="bench-takeover-")))
    ups: list[Up] = []
    acquired_s: list[float] = []
    adopted_s: list[float] = []
    try:
        active = Up(sim, "box-0", pg.dsn, "bench", ttl=args.ttl)
        ups.append(active)
        active.wait("lease.acquired")
        active.wait("server.ready")
        for i in range(1, args.takeovers + 1):
            standby = Up(sim, f"box-{i}", pg.dsn, "bench", ttl=args.ttl)
            ups.append(standby)
            standby.wait("lease.standby")
            time.sleep(rng.uniform(0.0, ttl_s / 3))  # anywhere in the renewal cycle
            killed = time.time()
            active.signal(signal.SIGKILL)
            active.exit_code()
            took = stamp(standby.wait("lease.acquired", timeout=120)) - killed
            adopted = stamp(standby.wait("server.adopted", timeout=120)) - killed
            acquired_s.append(took)
            adopted_s.append(adopted)
            print(f"takeover {i:2d}: lease after {took:5.2f}s, supervising after "
                  f"{adopted:5.2f}s", flush=True)
            active.stop()
            active = standby
        attempts = sim.attempts()
    finally:
        for up in ups:
            up.stop()
        sim.cleanup()
        pg.cleanup()
    print(f"\n{len(acquired_s)} takeovers, ttl {args.ttl} (renewed every {ttl_s / 3:.1f}s)")
    for name, values in (("lease acquired", acquired_s), ("server adopted", adopted_s)):
        print(f"{name:15s} p50 {statistics.median(values):5.2f}s  p95 {_pct(values, 0.95):5.2f}s"
              f"  max {max(values):5.2f}s")
    print(f"attempts in the run dir: {attempts} (1 = never relaunched)")
    return 0 if attempts == [1] else 1


if __name__ == "__main__":
    sys.exit(main())
