"""`plan` shows what the next `up` will really use; an empty config is an error everywhere."""

from __future__ import annotations

import json
import shlex

import pytest

from tests.cli.test_live_view import capture_oom
from tests.supervise import SERVER, SimSetup, run_cli

pytestmark = pytest.mark.timeout(120)


def test_plan_shows_the_remembered_params_the_next_up_uses(sim: SimSetup) -> None:
    """Before any run: the configured params. After a capture OOM and a relaunch to ready:
    the last good params (fraction 0.95) in the command line, and where they come from;
    `up --fresh` would ignore them. Env values are shell-quoted."""
    data = capture_oom(sim)
    data["servers"][0]["env"]["NOTE"] = "two words"
    config = sim.write_toml(data)

    [before] = json.loads(run_cli("plan", str(config), "--json").stdout)
    assert {"mem_fraction_static": 0.99, "cuda_graph_max_bs": 256} == before["params"]
    assert before["params_source"].startswith("configured")
    assert 0 == run_cli("up", str(config), "--until-ready", "--log-format", "json").returncode
    run_cli("down", str(config))

    [after] = json.loads(run_cli("plan", str(config), "--json").stdout)
    text = run_cli("plan", str(config)).stdout

    assert {"mem_fraction_static": 0.95, "cuda_graph_max_bs": 256} == after["params"]
    assert after["params_source"].startswith("last good, 20")
    assert "--mem-fraction-static 0.95 " in after["command"]
    assert "  params   mfs=0.95 bs=256  (last good, " in text
    assert "  env      NOTE='two words'" in text
    assert "NOTE=two words" == f"NOTE={shlex.split(text.split('NOTE=')[1].splitlines()[0])[0]}"
    assert after["run_dir"] == f"{sim.run_dir}/{SERVER}/<attempt>"
    # The next up starts attempt 3, not 1: plan must not show LAUNCHER_ATTEMPT=1.
    assert "<attempt>" == after["env"]["LAUNCHER_ATTEMPT"]
    assert "  env      LAUNCHER_ATTEMPT=<attempt>  (set at launch: the attempt's number)" in text
    # The estimate is drawn for those params too: no "first attempt 0.990 (configured)"
    # under a "params 0.95 (last good)" line.
    assert {"mem_fraction_static": 0.95, "cuda_graph_max_bs": 256} == (
        after["first_attempt"]["params"]), after["first_attempt"]
    assert ("ledger", after["params_source"]) == (
        after["first_attempt"]["source"], after["first_attempt"]["reason"])
    assert "  first attempt  mem_fraction_static=0.950 cuda_graph_max_bs=256  (ledger)" in text
    assert "mem_fraction_static 0.950: static budget" in text, text
    assert "0.990" not in text.split("first attempt", 1)[1], text


@pytest.mark.parametrize("args", [
    ["up"], ["plan"], ["status"], ["down"], ["check"], ["history"], ["logs", SERVER],
    ["describe", SERVER],
])
def test_an_empty_config_is_an_error_for_every_command(sim: SimSetup, args: list[str]) -> None:
    config = sim.root / "empty.toml"
    config.write_text("# nothing yet\n")

    result = run_cli(args[0], str(config), *args[1:])

    assert 2 == result.returncode, (result.stdout, result.stderr)
    assert "no servers configured" in result.stderr and str(config) in result.stderr
