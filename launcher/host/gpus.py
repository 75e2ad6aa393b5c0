"""What the GPUs of a host hold, from ``nvidia-smi`` queries, and whether a server may use them.

Parsing is pure (``parse_gpu_csv`` / ``parse_apps_csv``); the queries run through a Transport,
so ``nvidia_smi`` may be a prefix such as ``["docker", "exec", "c", "nvidia-smi"]``.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from launcher.errors import LogFormatError, RemoteCommandError
from launcher.host.transport.base import CommandResult, Transport

GPU_QUERY = ["--query-gpu=index,memory.used,memory.total", "--format=csv,noheader,nounits"]
UUID_QUERY = ["--query-gpu=index,uuid", "--format=csv,noheader,nounits"]
APPS_QUERY = ["--query-compute-apps=gpu_uuid,pid,used_memory", "--format=csv,noheader,nounits"]
DEFAULT_MAX_USED_MIB = 1024
_NOT_AVAILABLE = {
    "[N/A]", "N/A", "[Not Supported]", "[Unknown Error]", "[Insufficient Permissions]",
}
_NO_PROCESSES = "No running processes found"


@dataclass(frozen=True)
class GpuInfo:
    """One GPU; memory figures are None when nvidia-smi reports them as not available."""

    index: int
    used_mib: int | None
    total_mib: int | None


@dataclass(frozen=True)
class ComputeApp:
    """A process holding GPU memory. ``gpu_index`` is None when its GPU is not known."""

    pid: int
    used_mib: int | None
    gpu_index: int | None = None
    gpu_uuid: str | None = None


def _rows(text: str, what: str, widths: Collection[int]) -> list[tuple[int, list[str]]]:
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.strip().startswith(_NO_PROCESSES):
            continue
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) not in widths:
            raise LogFormatError(
                f"{what} line {number}: expected {' or '.join(map(str, widths))} "
                f"comma-separated fields, got {line!r}",
            )
        rows.append((number, cells))
    return rows


def _number(cell: str, what: str, number: int, line: list[str], *, optional: bool) -> int | None:
    if optional and cell in _NOT_AVAILABLE:
        return None
    try:
        return int(cell)
    except ValueError:
        raise LogFormatError(
            f"{what} line {number}: {cell!r} is not a number in {', '.join(line)!r}",
        ) from None


def parse_gpu_csv(text: str) -> list[GpuInfo]:
    """Parse ``index, memory.used, memory.total`` lines (csv, noheader, nounits)."""
    what = "nvidia-smi --query-gpu output"
    gpus = []
    for number, cells in _rows(text, what, (3,)):
        index = _number(cells[0], what, number, cells, optional=False)
        assert index is not None
        gpus.append(GpuInfo(
            index,
            _number(cells[1], what, number, cells, optional=True),
            _number(cells[2], what, number, cells, optional=True),
        ))
    return gpus


def parse_apps_csv(text: str) -> list[ComputeApp]:
    """Parse ``pid, used_memory`` or ``gpu_uuid, pid, used_memory`` lines."""
    what = "nvidia-smi --query-compute-apps output"
    apps = []
    for number, cells in _rows(text, what, (2, 3)):
        uuid = cells.pop(0) if len(cells) == 3 else None
        pid = _number(cells[0], what, number, cells, optional=False)
        assert pid is not None
        apps.append(ComputeApp(
            pid, _number(cells[1], what, number, cells, optional=True), gpu_uuid=uuid,
        ))
    return apps


def parse_uuid_csv(text: str) -> dict[str, int]:
    """Parse ``index, uuid`` lines into {uuid: index}."""
    what = "nvidia-smi --query-gpu=index,uuid output"
    mapping = {}
    for number, cells in _rows(text, what, (2,)):
        index = _number(cells[0], what, number, cells, optional=False)
        assert index is not None
        mapping[cells[1]] = index
    return mapping


async def _query(transport: Transport, argv: list[str]) -> str:
    result: CommandResult = await transport.run(argv)
    if not result.ok:
        raise RemoteCommandError(
            f"nvidia-smi failed on {transport.host_name} with exit status {result.exit_status}",
            host=transport.host_name,
            command=" ".join(argv),
            exit_status=result.exit_status,
            stderr=result.stderr[-2000:].decode("utf-8", "replace"),
            remedy="check the host's nvidia_smi setting and that the NVIDIA driver is loaded",
        )
    return result.stdout.decode("utf-8", "replace")


async def query_gpus(transport: Transport, nvidia_smi: Sequence[str]) -> list[GpuInfo]:
    """Every GPU of the host with its memory use."""
    return parse_gpu_csv(await _query(transport, [*nvidia_smi, *GPU_QUERY]))


async def query_compute_apps(transport: Transport, nvidia_smi: Sequence[str]) -> list[ComputeApp]:
    """Every process holding GPU memory, with its GPU index when nvidia-smi names the GPU."""
    apps = parse_apps_csv(await _query(transport, [*nvidia_smi, *APPS_QUERY]))
    if not any(app.gpu_uuid for app in apps):
        return apps
    indices = parse_uuid_csv(await _query(transport, [*nvidia_smi, *UUID_QUERY]))
    return [
        ComputeApp(app.pid, app.used_mib, indices.get(app.gpu_uuid or ""), app.gpu_uuid)
        for app in apps
    ]


@dataclass(frozen=True)
class GpuProblem:
    """One wanted GPU that is not usable: ``missing`` (the host has no such GPU) or busy."""

    index: int
    text: str
    missing: bool = False


@dataclass(frozen=True)
class GpuCheck:
    """Whether the GPUs ``wanted`` are free for a new server.

    A wanted GPU is a problem when it is missing, when more than ``max_used_mib`` of its memory
    is in use, or when a process not in ``own_pids`` holds memory on it. A process whose GPU is
    unknown is only named as a possible holder of a busy GPU, so processes on other GPUs of a
    shared host do not block a launch.
    """

    wanted: Sequence[int]
    max_used_mib: int = DEFAULT_MAX_USED_MIB
    own_pids: Collection[int] = ()

    def problems(self, gpus: Sequence[GpuInfo], apps: Sequence[ComputeApp]) -> list[str]:
        """One line per problem; empty when every wanted GPU is usable."""
        return [finding.text for finding in self.findings(gpus, apps)]

    def findings(self, gpus: Sequence[GpuInfo], apps: Sequence[ComputeApp]) -> list[GpuProblem]:
        """``problems`` with each line's GPU and whether that GPU is missing (which no wait
        mends) or busy (which may pass), in ``wanted`` order."""
        by_index = {gpu.index: gpu for gpu in gpus}
        foreign = [app for app in apps if app.pid not in self.own_pids]
        problems = []
        for index in self.wanted:
            gpu = by_index.get(index)
            if gpu is None:
                present = ", ".join(str(i) for i in sorted(by_index)) or "none"
                problems.append(GpuProblem(
                    index, f"GPU {index}: not present on the host (GPUs: {present})",
                    missing=True))
                continue
            holders = [app for app in foreign if app.gpu_index == index]
            unknown = [app for app in foreign if app.gpu_index is None]
            busy = gpu.used_mib is not None and gpu.used_mib > self.max_used_mib
            if busy:
                suspects = holders or unknown
                named = f"; held by {_describe(suspects)}" if suspects else ""
                problems.append(GpuProblem(
                    index, f"GPU {index}: {gpu.used_mib} MiB of {_mib(gpu.total_mib)} in use "
                    f"(limit {self.max_used_mib} MiB){named}",
                ))
            elif holders:
                problems.append(GpuProblem(index, f"GPU {index}: held by {_describe(holders)}"))
        return problems


def _mib(value: int | None) -> str:
    return "? MiB" if value is None else f"{value} MiB"


def _describe(apps: Sequence[ComputeApp]) -> str:
    return ", ".join(f"pid {app.pid} ({_mib(app.used_mib)})" for app in apps)


async def check_gpus(
    transport: Transport,
    nvidia_smi: Sequence[str],
    wanted: Sequence[int],
    *,
    max_used_mib: int = DEFAULT_MAX_USED_MIB,
    own_pids: Collection[int] = (),
) -> list[str]:
    """Query the host and return GpuCheck's problems for ``wanted``."""
    found = await gpu_findings(transport, nvidia_smi, wanted, max_used_mib=max_used_mib,
                               own_pids=own_pids)
    return [finding.text for finding in found]


async def gpu_findings(
    transport: Transport,
    nvidia_smi: Sequence[str],
    wanted: Sequence[int],
    *,
    max_used_mib: int = DEFAULT_MAX_USED_MIB,
    own_pids: Collection[int] = (),
) -> list[GpuProblem]:
    """Query the host and return GpuCheck's findings for ``wanted``."""
    gpus = await query_gpus(transport, nvidia_smi)
    apps = await query_compute_apps(transport, nvidia_smi)
    return GpuCheck(wanted, max_used_mib, own_pids).findings(gpus, apps)
