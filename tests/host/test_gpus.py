"""nvidia-smi CSV parsing, the GPU availability check, and the queries via a fake nvidia-smi."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.errors import LogFormatError, RemoteCommandError
from launcher.host.gpus import (
    ComputeApp,
    GpuCheck,
    GpuInfo,
    check_gpus,
    parse_apps_csv,
    parse_gpu_csv,
    query_compute_apps,
    query_gpus,
)
from launcher.host.transport.local import LocalTransport

GPUS = "0, 4, 81559\n1, 30012, 81559\n2, [N/A], [N/A]\n"
UUIDS = "0, GPU-aaa\n1, GPU-bbb\n2, GPU-ccc\n"
APPS = "GPU-bbb, 4242, 30000\nGPU-ccc, 777, [N/A]\n"


def fake_nvidia_smi(tmp_path: Path, *, apps: str = APPS, status: int = 0) -> list[str]:
    """A real executable answering the three queries launcher makes, like nvidia-smi does."""
    script = tmp_path / "nvidia-smi"
    script.write_text(
        "#!/bin/sh\n"
        f"[ {status} -eq 0 ] || {{ echo 'NVIDIA-SMI has failed' >&2; exit {status}; }}\n"
        'case "$1" in\n'
        f"  --query-gpu=index,memory.used,memory.total) printf '{GPUS}' ;;\n"
        f"  --query-gpu=index,uuid) printf '{UUIDS}' ;;\n"
        f"  --query-compute-apps=*) printf '{apps}' ;;\n"
        "  *) echo \"unexpected $1\" >&2; exit 2 ;;\n"
        "esac\n"
    )
    script.chmod(0o755)
    return [str(script)]


def test_parse_gpu_csv() -> None:
    """Rows become GpuInfo; [N/A] memory becomes None; blank lines are ignored."""
    expected = [GpuInfo(0, 4, 81559), GpuInfo(1, 30012, 81559), GpuInfo(2, None, None)]
    assert expected == parse_gpu_csv(GPUS + "\n")


def test_parse_apps_csv_with_and_without_uuid() -> None:
    """Both `pid, used` and `uuid, pid, used` rows parse; [Not Supported] memory is None."""
    assert [ComputeApp(12, 500), ComputeApp(13, None)] == parse_apps_csv(
        "12, 500\n13, [Not Supported]\n")
    assert [ComputeApp(4242, 30000, None, "GPU-bbb")] == parse_apps_csv("GPU-bbb, 4242, 30000\n")


def test_parse_apps_csv_accepts_no_processes() -> None:
    """An empty answer, or nvidia-smi's 'No running processes found', means no apps."""
    assert [] == parse_apps_csv("")
    assert [] == parse_apps_csv("No running processes found\n")


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("0, 4, 81559\n1, lots, 81559\n", "line 2: 'lots' is not a number"),
        ("0, 4\n", "line 1: expected 3 comma-separated fields, got '0, 4'"),
        ("[N/A], 4, 5\n", "line 1: '[N/A]' is not a number"),
    ],
)
def test_parse_gpu_csv_errors_name_the_line(text: str, fragment: str) -> None:
    """A malformed row raises LogFormatError naming its line number and content."""
    with pytest.raises(LogFormatError, match=fragment.replace("[", r"\[")):
        parse_gpu_csv(text)


def test_parse_apps_csv_errors_name_the_line() -> None:
    """A bad pid raises LogFormatError naming the line."""
    with pytest.raises(LogFormatError, match="line 2: 'x' is not a number"):
        parse_apps_csv("1, 2\nx, 3\n")


def test_gpu_check_accepts_idle_gpus() -> None:
    """Idle wanted GPUs pass even when processes hold other GPUs."""
    gpus = parse_gpu_csv(GPUS)
    apps = [ComputeApp(4242, 30000, 1)]
    assert [] == GpuCheck([0]).problems(gpus, apps)


def test_gpu_check_reports_busy_missing_and_held_gpus() -> None:
    """Missing GPU, memory above the limit and a foreign holder each give a line naming pids."""
    gpus = [GpuInfo(0, 4, 81559), GpuInfo(1, 30012, 81559)]
    apps = [ComputeApp(4242, 30000, 1), ComputeApp(99, 200, 0), ComputeApp(5, 10, 0)]
    problems = GpuCheck([0, 1, 7], own_pids={5}).problems(gpus, apps)
    assert [
        "GPU 0: held by pid 99 (200 MiB)",
        "GPU 1: 30012 MiB of 81559 MiB in use (limit 1024 MiB); held by pid 4242 (30000 MiB)",
        "GPU 7: not present on the host (GPUs: 0, 1)",
    ] == problems


def test_gpu_check_names_unplaced_processes_as_suspects() -> None:
    """When nvidia-smi does not say which GPU a process uses, a busy GPU names it anyway."""
    gpus = [GpuInfo(0, 2048, 81559)]
    apps = [ComputeApp(31, None)]
    assert ["GPU 0: 2048 MiB of 81559 MiB in use (limit 1024 MiB); held by pid 31 (? MiB)"] == (
        GpuCheck([0]).problems(gpus, apps))


async def test_queries_run_the_configured_nvidia_smi(tmp_path: Path) -> None:
    """query_gpus and query_compute_apps run the real executable and map apps to GPU indices."""
    transport = LocalTransport("gpu1")
    nvidia_smi = fake_nvidia_smi(tmp_path)
    assert parse_gpu_csv(GPUS) == await query_gpus(transport, nvidia_smi)
    assert [ComputeApp(4242, 30000, 1, "GPU-bbb"), ComputeApp(777, None, 2, "GPU-ccc")] == (
        await query_compute_apps(transport, nvidia_smi))
    assert ["GPU 1: 30012 MiB of 81559 MiB in use (limit 1024 MiB); held by pid 4242 (30000 MiB)"
            ] == await check_gpus(transport, nvidia_smi, [0, 1])


async def test_queries_without_uuid_column_leave_the_gpu_unknown(tmp_path: Path) -> None:
    """An nvidia-smi that answers only `pid, used` gives apps without a GPU index."""
    transport = LocalTransport("gpu1")
    nvidia_smi = fake_nvidia_smi(tmp_path, apps="4242, 30000\n")
    assert [ComputeApp(4242, 30000)] == await query_compute_apps(transport, nvidia_smi)


async def test_query_failure_raises_remote_command_error(tmp_path: Path) -> None:
    """A failing nvidia-smi raises RemoteCommandError with its stderr and exit status."""
    transport = LocalTransport("gpu1")
    with pytest.raises(RemoteCommandError) as caught:
        await query_gpus(transport, fake_nvidia_smi(tmp_path, status=9))
    assert (9, "NVIDIA-SMI has failed\n") == (caught.value.exit_status, caught.value.stderr)
