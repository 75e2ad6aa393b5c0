#!/usr/bin/env bash
# Builds the environment of the router tests (tests/supervision/test_router_e2e.py): a venv holding the real
# `sglang-router` 0.3.2 wheel from PyPI (the Rust router as an abi3 extension, about 31 MB; it
# runs without a GPU) and what `python -m sglang_router.launch_router` imports. A TEST
# dependency only: scripts/setup.sh runs this with --test, never for the demo, and launcher
# itself does not import it (it starts the router on a host as a command).
#
#   scripts/sglang-router-env.sh              build unless built (silent when built)
#   scripts/sglang-router-env.sh --print-venv print the venv's path (builds nothing)
#
# Where: $SGLANG_ROUTER_VENV if set, else ${XDG_CACHE_HOME:-~/.cache}/launcher/sglang-router/
# <first 16 hex digits of this file's sha256>, outside the work tree like the contract env (CI's
# fresh clone reuses it). A build is finished when <venv>/.ready-<same digits> exists; an
# unfinished one is wiped and rebuilt. The dependencies are pinned (the list is `pip freeze`
# after `pip install sglang-router==0.3.2`; pip check proves it closed), so a new release on
# PyPI cannot change what the tests run. A build downloads about 45 MB and takes 1 to 2 minutes
# (77 s and 123 s measured on a loaded 2-core machine).
set -euo pipefail
cd "$(dirname "$0")/.."

digest=$(sha256sum scripts/sglang-router-env.sh | cut -c1-16)
cache_root=${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/launcher/sglang-router
venv=${SGLANG_ROUTER_VENV:-$cache_root/$digest}
python=${PYTHON:-python3}

if [ "${1:-}" = --print-venv ]; then
  echo "$venv"
  exit 0
fi
stamp="$venv/.ready-$digest"
if [ -f "$stamp" ]; then
  exit 0
fi

mkdir -p "$(dirname "$venv")"
exec 9>"$(dirname "$venv")/.lock-$(basename "$venv")"
flock 9
if [ -f "$stamp" ]; then
  exit 0
fi

start=$SECONDS
echo "sglang-router-env: building $venv (sglang-router 0.3.2)" >&2
if [ -z "${SGLANG_ROUTER_VENV:-}" ]; then
  find "$cache_root" -mindepth 1 -maxdepth 1 -type d -regextype posix-extended \
    -regex '.*/[0-9a-f]{16}' ! -name "$digest" -exec rm -rf {} +
fi
rm -rf "$venv"
"$python" -m venv "$venv"
printf '*\n' >"$venv/.gitignore"
quiet() { "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2); }
quiet "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps -r /dev/stdin <<'PINS'
aiohappyeyeballs==2.7.1
aiohttp==3.14.5
aiosignal==1.4.0
annotated-doc==0.0.7
annotated-types==0.8.0
anyio==4.16.0
attrs==26.1.0
click==8.5.1
fastapi==0.165.0
frozenlist==1.8.0
h11==0.16.0
idna==3.20
multidict==7.2.1
opentelemetry-api==1.45.2
orjson==3.13.0
propcache==0.5.4
pydantic==2.14.4
pydantic_core==2.50.5
setproctitle==1.3.8
sglang-router==0.3.2
starlette==1.10.0
typing-inspection==0.4.5
typing_extensions==4.16.0
uvicorn==0.54.0
yarl==1.25.1
PINS
"$venv/bin/python" -m pip check >&2
"$venv/bin/python" -c 'import sglang_router.launch_router, sglang_router.sglang_router_rs'
touch "$stamp"
echo "sglang-router-env: built in $((SECONDS - start)) s" >&2
