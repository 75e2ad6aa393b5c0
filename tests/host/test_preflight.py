"""The one preflight (``launcher.host.preflight.check``): typed problems, each fatal or
transient, from a real nvidia-smi executable, a real path test and a real bound port."""

from __future__ import annotations

import socket
from pathlib import Path

from launcher.host.preflight import Problem, ProblemKind, Target, check
from launcher.host.transport.local import LocalTransport
from launcher.supervise.lifecycle import State
from tests.host.test_gpus import fake_nvidia_smi
from tests.simhost import free_port
from tests.supervise import SimSetup, supervise

BUSY_GPU_1 = ("GPU 1: 30012 MiB of 81559 MiB in use (limit 1024 MiB); "
              "held by pid 4242 (30000 MiB)")


def test_only_busy_gpus_a_dist_port_and_an_unavailable_host_may_pass_with_time() -> None:
    """Transient kinds are exactly busy GPUs, the dist-init port and a host not answering."""
    transient = {kind.value for kind in ProblemKind if kind.transient}
    assert {"gpu_busy", "dist_port_busy", "host_unavailable"} == transient


def test_a_problem_prints_its_remedy_and_takes_a_host_prefix() -> None:
    """``str()`` is the message then the remedy; ``on(host)`` prefixes the message only."""
    problem = Problem(ProblemKind.GPU_MISSING, "GPU 7: not present", remedy="fix it")
    assert "gpu2: GPU 7: not present\n  fix: fix it" == str(problem.on("gpu2"))


async def test_check_returns_fatal_problems_first_then_busy_gpus(tmp_path: Path) -> None:
    """A missing model path and a taken port are fatal and come first; a busy GPU is
    transient and comes last."""
    transport = LocalTransport("gpu1")
    port = free_port()
    with socket.socket() as held:
        held.bind(("127.0.0.1", port))
        held.listen()
        problems = await check(transport, Target(
            "gpu1", fake_nvidia_smi(tmp_path), "srv", [0, 1], str(tmp_path / "nowhere"), port))

    assert [ProblemKind.MODEL_MISSING, ProblemKind.PORT_TAKEN, ProblemKind.GPU_BUSY] == [
        p.kind for p in problems]
    assert [False, False, True] == [p.transient for p in problems]
    assert f"model path {tmp_path / 'nowhere'} does not exist on gpu1" == problems[0].message
    assert problems[1].message.startswith(f"port {port} is already in use on gpu1 (uid ")
    assert BUSY_GPU_1 == problems[2].message


async def test_a_missing_gpu_ends_the_check_with_one_fatal_problem(tmp_path: Path) -> None:
    """GPUs the host does not have are one fatal problem naming each, with the remedy; the
    model path and the port are not asked."""
    problems = await check(LocalTransport("gpu1"), Target(
        "gpu1", fake_nvidia_smi(tmp_path), "srv", [1, 7, 8], str(tmp_path / "nowhere"), 1))

    assert [Problem(ProblemKind.GPU_MISSING,
                    "GPU 7: not present on the host (GPUs: 0, 1, 2); "
                    "GPU 8: not present on the host (GPUs: 0, 1, 2)",
                    remedy="fix the gpus of server srv")] == problems


async def test_nothing_asked_is_no_problem(tmp_path: Path) -> None:
    """A target with no GPUs, no model path and no port has nothing to find."""
    assert [] == await check(LocalTransport("gpu1"), Target("gpu1", ["false"]))


async def test_the_supervisor_gives_up_at_once_on_a_missing_gpu(sim: SimSetup) -> None:
    """A GPU the host lacks is fatal (by its kind): the server gives up before any launch,
    the reason naming the GPU and the remedy."""
    config = sim.config(server={"gpus": [7]})
    result = await supervise(config)

    assert State.GAVE_UP == result.state, result.events.summary()
    assert not result.events.has("attempt.started")
    assert not result.events.has("gpu.waiting")
    reason = result.events.of("server.gave_up")[0]["reason"]
    assert reason.startswith("preflight: GPU 7: not present on the host"), reason
    assert reason.endswith(f"fix: fix the gpus of server {config.servers[0].name}"), reason
