#!/usr/bin/env bash
# Idempotent set-up on a fresh machine: a venv in .venv with launcher and its dev tools. With
# --test (scripts/test) also what only the tests need: (when run as root on Debian and missing)
# OpenSSH's sshd, systemd-analyze, iproute2, util-linux, promtool (Debian's prometheus) and
# PostgreSQL's server, the SGLang contract environment and the sglang-router environment. The
# demo runs without --test, so it never builds the 2.6 GB contract environment or the router's,
# nor installs Debian packages.
set -euo pipefail
cd "$(dirname "$0")/.."
for_tests=false
[ "${1:-}" = --test ] && for_tests=true
# Debian packages the tests need: sshd (SSH tests on loopback), systemd-analyze (unit check).
need=()
if $for_tests; then
  [ -x /usr/sbin/sshd ] || need+=(openssh-server)
  command -v systemd-analyze >/dev/null || need+=(systemd)
  # ip netns + veth (network faults), unshare/taskset/mount (PID namespaces, CPU hog, tmpfs).
  command -v ip >/dev/null || need+=(iproute2)
  command -v unshare >/dev/null && command -v taskset >/dev/null || need+=(util-linux)
  # promtool (check/test the alert rules in configs/prometheus): Debian ships it with the server.
  command -v promtool >/dev/null || need+=(prometheus)
  # PostgreSQL's server (tests/test_standby.py: the coordination lease, docs/ha.md); the tests
  # start their own throw-away server with initdb and pg_ctl, never the package's cluster.
  compgen -G "/usr/lib/postgresql/*/bin/pg_ctl" >/dev/null || need+=(postgresql)
  if [ ${#need[@]} -gt 0 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "setup: installing ${need[*]} (for the tests)" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
    # The package's unit starts a Prometheus server on :9090 where systemd runs; the tests
    # need only promtool, so the service it just installed is stopped and disabled again.
    if [[ " ${need[*]} " == *" prometheus "* ]] && [ -d /run/systemd/system ]; then
      systemctl disable --now prometheus.service >/dev/null 2>&1 || true
    fi
    # Likewise the cluster Debian's postgresql package creates and starts.
    if [[ " ${need[*]} " == *" postgresql "* ]]; then
      if [ -d /run/systemd/system ]; then
        systemctl disable --now postgresql.service >/dev/null 2>&1 || true
      else
        service postgresql stop >/dev/null 2>&1 || true
      fi
    fi
  fi
fi
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
# Pinned to scripts/constraints.txt: an upstream release (a new warning, a new lint rule) cannot
# turn CI red on code that did not change.
stamp=.venv/.installed-$(cat pyproject.toml scripts/constraints.txt | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ]; then
  .venv/bin/pip install -q --disable-pip-version-check -c scripts/constraints.txt -e '.[dev]'
  touch "$stamp"
fi
# SGLang's own argument parser (CPU torch + the sglang wheels, cached outside the tree) for the
# contract tests that parse launcher's command lines with it.
if $for_tests; then
  scripts/sglang-contract-env.sh
  # The real SGLang router (sglang-router 0.3.2 from PyPI) for tests/supervision/test_router_e2e.py: a
  # test dependency only, in a venv of its own outside the tree (never for the demo).
  scripts/sglang-router-env.sh
fi
