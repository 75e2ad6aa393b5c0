"""A fix SGLang's own error prescribes, end to end through the supervisor on the local transport.

The server is the simulator behind a wrapper that behaves as SGLang 0.5.10 does for a hybrid
model with speculative decoding (server_args.py:2207): with ``no_buffer`` and the radix cache
it prints the ValueError word for word (the fixture ``v0510_bad_argument_mamba_spec.log``) and
exits 1; given ``--mamba-scheduler-strategy extra_buffer`` and ``SGLANG_ENABLE_SPEC_V2=1`` it
starts (the simulator, with that flag taken out, since it does not model hybrid models).
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any

import pytest

from launcher.config.load import config_from_dict
from launcher.config.schema import Config
from launcher.supervise.lifecycle import State
from tests.supervise import SERVER, SimSetup, run_cli, supervise

pytestmark = pytest.mark.timeout(60)

LOG = Path(__file__).parents[1] / "data" / "logs" / "v0510_bad_argument_mamba_spec.log"
WRAPPER = """\
import os, sys
from launcher.sim.server import main
args = sys.argv[1:]
flag = "--mamba-scheduler-strategy"
if (flag in args and args[args.index(flag) + 1] == "extra_buffer"
        and os.environ.get("SGLANG_ENABLE_SPEC_V2") == "1"):
    i = args.index(flag)
    del args[i:i + 2]
    sys.exit(main(args))
sys.stderr.write({log!r})
sys.exit(1)
"""


def _data(sim: SimSetup, apply: bool) -> dict[str, Any]:
    wrapper = sim.root / "sglang_0510_hybrid.py"
    wrapper.write_text(WRAPPER.format(log=LOG.read_text()))
    return sim.data(
        policy={"apply_prescribed_fixes": apply},
        server={
            "sglang_version": "0.5.10",
            "command": [sys.executable, str(wrapper)],
            "env": {"SGLANG_SIM_VERSION": "0.5.10"},
        },
    )


def _config(sim: SimSetup, apply: bool) -> Config:
    return config_from_dict(_data(sim, apply), environ={})


async def test_prescribed_fix_is_applied_once_and_recorded(sim: SimSetup) -> None:
    """apply_prescribed_fixes: attempt 2 runs with SGLang's fix in 0.5.10's dialect and is
    ready; the ledger holds the fix in that attempt's params."""
    result = await supervise(_config(sim, True), until=lambda r: r.has("server.ready"))
    rec = result.events
    assert rec.has("server.ready"), rec.summary()
    assert [1, 2] == sim.attempts()
    words = shlex.split(sim.cmd(2))
    i = words.index("--mamba-scheduler-strategy")
    assert "extra_buffer" == words[i + 1]
    assert "--mamba-scheduler-strategy" not in shlex.split(sim.cmd(1))
    started = rec.of("attempt.started")[1]["params"]
    assert ("extra_buffer", {"SGLANG_ENABLE_SPEC_V2": "1"}) == (
        started["mamba_strategy"], started["env"]
    )
    assert "prescribes" in rec.of("attempt.failed")[0]["advice"]


async def test_prescribed_fix_is_only_advised_by_default(sim: SimSetup) -> None:
    """Without the switch: one attempt, given up with the fix as a config snippet."""
    result = await supervise(_config(sim, False))
    assert State.GAVE_UP == result.state, result.events.summary()
    assert [1] == sim.attempts()
    [failed] = result.events.of("attempt.failed")
    assert 'mamba_strategy = "extra_buffer"' in failed["advice"]
    assert 'env = { SGLANG_ENABLE_SPEC_V2 = "1" }' in failed["advice"]
    assert "apply_prescribed_fixes" in result.events.of("server.gave_up")[0]["reason"]


def test_up_prints_the_prescribed_fix_as_a_config_snippet(sim: SimSetup) -> None:
    """`launcher up` (a real subprocess) gives up with exit 4 and prints SGLang's fix in
    0.5.10's dialect as the TOML to paste into the server's entry."""
    config = sim.write_toml(_data(sim, False))
    done = run_cli("up", str(config), "--until-ready", timeout=50)
    assert 4 == done.returncode, done.stderr
    assert f"{SERVER} gave up: " in done.stderr
    assert '[[servers]]\nmamba_strategy = "extra_buffer"\nenv = { SGLANG_ENABLE_SPEC_V2 = "1" }' \
        in done.stderr, done.stderr
