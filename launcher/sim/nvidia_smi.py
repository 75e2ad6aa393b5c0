"""``nvidia-smi`` for a sim host: ``python -m launcher.sim.nvidia_smi [args]``.

Reads the host named by ``SGLANG_SIM_HOST`` (see :mod:`launcher.sim.gpustate`) and answers the
queries a supervisor makes, in nvidia-smi's CSV format (sizes in MiB, integers)::

    --query-gpu=index,memory.used,memory.total --format=csv,noheader,nounits
    --query-compute-apps=pid,used_memory --format=csv,noheader,nounits
    -L            one line per GPU
    (no args)     the usual table

``-i/--id`` selects GPUs. Compute apps include orphans still holding memory and the host's
foreign process. Like nvidia-smi, it ignores CUDA_VISIBLE_DEVICES. Errors print nvidia-smi's
message and exit non-zero (2 for bad arguments, 9 when there is no host, i.e. no driver).
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime

from launcher.sim.gpustate import GpuProcess, HostConfigError, SimGpuHost, processes

DRIVER_VERSION = "550.54.15"
CUDA_VERSION = "12.4"
_NAMESPACE = uuid.UUID("6f1c2b8e-3d4a-4c5b-9e7f-0a1b2c3d4e5f")

_BAD_ARGS = "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help."
_NO_DRIVER = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure "
    "that the latest NVIDIA driver is installed and running."
)


class SmiError(Exception):
    """An nvidia-smi error: ``message`` and the exit status nvidia-smi uses."""

    def __init__(self, message: str, status: int = 2) -> None:
        super().__init__(message)
        self.status = status


def gpu_uuid(index: int) -> str:
    return f"GPU-{uuid.uuid5(_NAMESPACE, f'sim-gpu-{index}')}"


def bus_id(index: int) -> str:
    return f"00000000:{0x18 + 0x10 * index:02X}:00.0"


def _mib(gib: float) -> int:
    return round(gib * 1024)


class _Snapshot:
    """The host's state at one instant, as nvidia-smi reports it."""

    def __init__(self, host: SimGpuHost) -> None:
        self.host = host
        self.apps: list[GpuProcess] = processes(host)
        self.used = [0] * host.gpu_count
        for p in self.apps:
            self.used[p.gpu] += _mib(p.used_gib)

    def gpu_field(self, name: str, i: int, units: bool) -> str:
        h = self.host
        mib = (lambda v: f"{v} MiB") if units else str
        values: dict[str, Callable[[], str]] = {
            "index": lambda: str(i),
            "name": lambda: h.gpu_name,
            "gpu_name": lambda: h.gpu_name,
            "uuid": lambda: gpu_uuid(i),
            "gpu_uuid": lambda: gpu_uuid(i),
            "pci.bus_id": lambda: bus_id(i),
            "gpu_bus_id": lambda: bus_id(i),
            "count": lambda: str(h.gpu_count),
            "driver_version": lambda: DRIVER_VERSION,
            "memory.total": lambda: mib(h.gpu_total_mib),
            "memory.used": lambda: mib(self.used[i]),
            "memory.free": lambda: mib(max(0, h.gpu_total_mib - self.used[i])),
            "utilization.gpu": lambda: "0 %" if units else "0",
            "utilization.memory": lambda: "0 %" if units else "0",
            "temperature.gpu": lambda: "33",
            "persistence_mode": lambda: "Enabled",
        }
        if name not in values:
            raise SmiError(f'Field "{name}" is not a valid field to query.')
        return values[name]()

    def app_field(self, name: str, p: GpuProcess, units: bool) -> str:
        values: dict[str, Callable[[], str]] = {
            "pid": lambda: str(p.pid),
            "process_name": lambda: p.name,
            "name": lambda: p.name,
            "used_memory": lambda: f"{_mib(p.used_gib)} MiB" if units else str(_mib(p.used_gib)),
            "used_gpu_memory": lambda: (
                f"{_mib(p.used_gib)} MiB" if units else str(_mib(p.used_gib))
            ),
            "gpu_uuid": lambda: gpu_uuid(p.gpu),
            "gpu_bus_id": lambda: bus_id(p.gpu),
            "gpu_name": lambda: self.host.gpu_name,
            "gpu_serial": lambda: f"{1650000000000 + p.gpu}",
        }
        if name not in values:
            raise SmiError(f'Field "{name}" is not a valid field to query.')
        return values[name]()


GPU_FIELDS = frozenset(
    {
        "index",
        "name",
        "gpu_name",
        "uuid",
        "gpu_uuid",
        "pci.bus_id",
        "gpu_bus_id",
        "count",
        "driver_version",
        "memory.total",
        "memory.used",
        "memory.free",
        "utilization.gpu",
        "utilization.memory",
        "temperature.gpu",
        "persistence_mode",
    }
)
APP_FIELDS = frozenset(
    {
        "pid",
        "process_name",
        "name",
        "used_memory",
        "used_gpu_memory",
        "gpu_uuid",
        "gpu_bus_id",
        "gpu_name",
        "gpu_serial",
    }
)

_HEADER_UNITS = {
    "memory.total": " [MiB]",
    "memory.used": " [MiB]",
    "memory.free": " [MiB]",
    "used_memory": " [MiB]",
    "used_gpu_memory": " [MiB]",
    "utilization.gpu": " [%]",
    "utilization.memory": " [%]",
}


def _header(fields: Sequence[str], units: bool) -> str:
    names = ["used_gpu_memory" if f == "used_memory" else f for f in fields]
    return ", ".join(n + (_HEADER_UNITS.get(n, "") if units else "") for n in names)


def _cells(*cells: tuple[str, int]) -> str:
    """One table row: each cell padded to its width, between bars."""
    return "|" + "|".join(text[:width].ljust(width) for text, width in cells) + "|"


_COLS = (41, 24, 22)  # the three columns of the GPU part; 89 inside the outer bars


def _gpu_rows(*texts: str) -> str:
    return _cells(*zip(texts, _COLS, strict=True))


def _table(snap: _Snapshot, gpus: Sequence[int]) -> str:
    h = snap.host
    bar = "+" + "-" * 89 + "+"
    rule = "+" + "+".join("-" * w for w in _COLS) + "+"
    lines = [
        datetime.now().strftime("%a %b %d %H:%M:%S %Y"),
        bar,
        _cells(
            (
                f" NVIDIA-SMI {DRIVER_VERSION:<21}Driver Version: {DRIVER_VERSION:<15}"
                f"CUDA Version: {CUDA_VERSION}",
                89,
            )
        ),
        rule.replace("+", "|", 1)[:-1] + "|",
        _gpu_rows(
            " GPU  Name                 Persistence-M",
            " Bus-Id          Disp.A",
            " Volatile Uncorr. ECC",
        ),
        _gpu_rows(
            " Fan  Temp   Perf          Pwr:Usage/Cap",
            "           Memory-Usage",
            " GPU-Util  Compute M.",
        ),
        "|" + "+".join("=" * w for w in _COLS).replace("+", "+") + "|",
    ]
    for i in gpus:
        mem = f"{snap.used[i]}MiB / {h.gpu_total_mib}MiB"
        lines.append(
            _gpu_rows(
                f" {i:>3}  {h.gpu_name[:25]:<25}      On  ", f"   {bus_id(i)} Off", f"{'0':>21}"
            )
        )
        lines.append(
            _gpu_rows(
                " N/A   33C    P0             70W /  700W", f" {mem:>22}", "      0%      Default"
            )
        )
        lines.append(rule)
    lines += [
        "",
        bar,
        _cells((" Processes:", 89)),
        _cells(("  GPU   GI   CI        PID   Type   Process name" + " " * 30 + "GPU Memory", 89)),
        _cells(("        ID   ID" + " " * 63 + "Usage", 89)),
        "|" + "=" * 89 + "|",
    ]
    apps = [p for p in snap.apps if p.gpu in gpus]
    if not apps:
        lines.append(_cells(("  No running processes found", 89)))
    for p in apps:
        used = f"{_mib(p.used_gib)}MiB"
        left = f"  {p.gpu:>3}   N/A  N/A  {p.pid:>9}      C   {p.name[:38]}"
        lines.append(_cells((left + used.rjust(88 - len(left)) + " ", 89)))
    lines.append(bar)
    return "\n".join(lines) + "\n"


def _option(args: list[str], i: int) -> tuple[str, str | None, int]:
    """(name, inline-or-next value, index after it) for ``--x=v`` / ``--x v`` / ``-i v``."""
    arg = args[i]
    if "=" in arg:
        name, value = arg.split("=", 1)
        return name, value, i + 1
    if i + 1 < len(args) and not args[i + 1].startswith("-"):
        return arg, args[i + 1], i + 2
    return arg, None, i + 1


def run(argv: Sequence[str], host: SimGpuHost | None) -> str:
    """nvidia-smi's output for ``argv``; raises SmiError."""
    if host is None:
        raise SmiError(_NO_DRIVER, 9)
    args = list(argv)
    query_gpu: list[str] | None = None
    query_apps: list[str] | None = None
    fmt: set[str] | None = None
    ids: list[int] | None = None
    list_gpus = False
    i = 0
    while i < len(args):
        name, value, nxt = _option(args, i)
        if name in ("-L", "--list-gpus"):
            list_gpus, i = True, i + 1
            continue
        if value is None:
            raise SmiError(_BAD_ARGS)
        if name == "--query-gpu":
            query_gpu = [f.strip() for f in value.split(",") if f.strip()]
        elif name == "--query-compute-apps":
            query_apps = [f.strip() for f in value.split(",") if f.strip()]
        elif name == "--format":
            fmt = {f.strip() for f in value.split(",")}
            if "csv" not in fmt or not fmt <= {"csv", "noheader", "nounits"}:
                raise SmiError(f'"{value}" is not a valid format.')
        elif name in ("-i", "--id"):
            try:
                ids = [int(x) for x in value.split(",")]
            except ValueError:
                raise SmiError(f"Invalid GPU id: {value}", 6) from None
            if any(not 0 <= x < host.gpu_count for x in ids):
                raise SmiError("No devices were found", 6)
        else:
            raise SmiError(_BAD_ARGS)
        i = nxt
    gpus = ids if ids is not None else list(range(host.gpu_count))
    snap = _Snapshot(host)
    if list_gpus:
        return "".join(f"GPU {g}: {host.gpu_name} (UUID: {gpu_uuid(g)})\n" for g in gpus)
    if query_gpu is None and query_apps is None:
        if fmt is not None:
            raise SmiError(_BAD_ARGS)
        return _table(snap, gpus)
    if (query_gpu is not None and query_apps is not None) or fmt is None:
        raise SmiError(_BAD_ARGS)
    units = "nounits" not in fmt
    fields = query_gpu if query_gpu is not None else (query_apps or [])
    known = GPU_FIELDS if query_gpu is not None else APP_FIELDS
    if not fields:
        raise SmiError(_BAD_ARGS)
    for f in fields:
        if f not in known:
            raise SmiError(f'Field "{f}" is not a valid field to query.')
    rows: list[str] = []
    if query_gpu is not None:
        rows = [", ".join(snap.gpu_field(f, g, units) for f in fields) for g in gpus]
    else:
        rows = [
            ", ".join(snap.app_field(f, p, units) for f in fields)
            for p in snap.apps
            if p.gpu in gpus
        ]
    head = [] if "noheader" in fmt else [_header(fields, units)]
    return "".join(line + "\n" for line in head + rows)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        host = SimGpuHost.from_env()
        sys.stdout.write(run(sys.argv[1:] if argv is None else argv, host))
    except HostConfigError:
        sys.stdout.write(_NO_DRIVER + "\n")
        return 9
    except SmiError as exc:
        sys.stdout.write(f"{exc}\n")
        return exc.status
    return 0


if __name__ == "__main__":
    sys.exit(main())
