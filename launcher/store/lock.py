"""The state-directory lock: ``StateLock(state_dir)`` makes sure one ``launcher up`` at a time
works on a state directory (an exclusive ``flock`` on ``state_dir/launcher.lock`` holding the
owner's pid and what it is). ``launcher down`` takes it too while it stops servers, so that no
``up`` starts meanwhile (and refuses to run while an ``up`` holds it). ``store`` re-exports it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
from pathlib import Path
from types import TracebackType

import structlog

from launcher.errors import StateError

LOCK_FILENAME = "launcher.lock"

UP = "launcher up"  # what holds the lock unless told otherwise
DOWN = "launcher down"

log = structlog.get_logger("launcher")


def make_private_dir(directory: Path) -> None:
    """Create ``directory`` (mode 0700, parents as needed) unless it exists, then check it
    with ``lstat``: a real directory (not a symlink) owned by us and writable by nobody else.

    A state directory (or one below it) that another user created first would let him plant
    symlinks that we then write through, or swap our files (docs/security.md,
    finding M8). Error handling: StateError naming the path and the fix.
    """
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.lstat(directory)
    except OSError as exc:
        raise StateError(
            f"cannot create the state directory {directory}: {exc.strerror or exc}",
            remedy="fix its permissions or set state_dir to a writable directory",
        ) from exc
    uid = os.geteuid()
    if stat.S_ISLNK(st.st_mode):
        problem = f"is a symlink (to {os.path.realpath(directory)})"
        remedy = "set state_dir to the real directory the symlink points at"
    elif not stat.S_ISDIR(st.st_mode):
        problem, remedy = "is not a directory", "remove it or set state_dir elsewhere"
    elif st.st_uid != uid:
        problem = f"is owned by uid {st.st_uid}, not by us (uid {uid})"
        remedy = ("remove it (another user may have made it to plant files in it) or set "
                  "state_dir to a directory of your own")
    elif st.st_mode & 0o022:
        problem = f"is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
        remedy = f"chmod 700 {directory}"
    else:
        return
    raise StateError(f"unsafe state directory {directory}: it {problem}", remedy=remedy)


def write_private_file(path: Path, data: bytes) -> None:
    """Replace ``path`` with a 0600 file holding ``data``: written to a fresh temporary file
    beside it (O_CREAT|O_EXCL|O_NOFOLLOW), then renamed over it, so a symlink or a file
    another user planted at ``path`` is replaced, never written through. OSError on failure
    (the temporary file is removed)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class StateLockHeld(StateError):
    """Another process holds the state lock: ``pid`` (None when unknown) and ``holder``, what
    it is (``launcher up`` or ``launcher down``)."""

    def __init__(self, message: str, *, pid: int | None, holder: str, remedy: str) -> None:
        super().__init__(message, remedy=remedy)
        self.pid = pid
        self.holder = holder


class StateLock:
    """An exclusive, non-blocking ``flock`` on ``state_dir/launcher.lock`` holding our pid
    (first line) and ``holder``, what we are (second line: ``launcher up`` by default).

    Entering creates ``state_dir`` (mode 0700) if needed and refuses one that is not ours
    alone (see :func:`make_private_dir`), takes the lock and writes this
    process's pid into the file; exiting empties the file and releases the lock. The file is
    never deleted: unlinking a lock file lets a waiter lock an inode nobody else sees.
    The lock dies with the process (flock), so a crashed ``launcher up`` leaves nothing stale.

    Error handling: StateLockHeld when another process (or another StateLock in this one)
    holds the lock, naming the pid and the holder written in the file; StateError when the
    file cannot be opened.
    """

    def __init__(self, state_dir: Path, holder: str = UP) -> None:
        self.state_dir = state_dir
        self.holder = holder
        self.path = state_dir / LOCK_FILENAME
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        """Take the lock or raise StateError at once (never waits)."""
        if self._fd is not None:
            raise StateError(f"{self.path} is already held by this StateLock")
        make_private_dir(self.state_dir)
        try:
            # os.open's descriptors are not inherited (PEP 446): a server we spawn cannot keep
            # the lock alive after we exit.
            # O_NOFOLLOW: a symlink planted at the lock's path must not make us lock (and
            # write our pid into) whatever file it points at.
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            raise StateError(
                f"cannot open the lock file {self.path}: {exc.strerror or exc}",
                remedy="fix the permissions of the state directory or use another state_dir",
            ) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            pid, holder = _read_holder(fd)
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise StateError(
                    f"cannot lock {self.path}: {exc.strerror or exc}",
                    remedy="use a state_dir on a local file system",
                ) from exc
            who = f"pid {pid}" if pid is not None else "pid unknown"
            raise StateLockHeld(
                f"another `{holder}` is running on this state directory ({who}): "
                f"{self.state_dir}",
                pid=pid, holder=holder,
                remedy="stop it or use another state_dir" if holder == UP
                else "wait for it to finish, then try again",
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n{self.holder}\n".encode(), 0)
        self._fd = fd
        log.debug("state.locked", path=str(self.path), pid=os.getpid())

    def release(self) -> None:
        """Empty the file and release the lock; nothing if not held."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            os.ftruncate(fd, 0)  # so a reader never names a pid that no longer holds it
        finally:
            os.close(fd)  # closing the last descriptor releases the flock

    def __enter__(self) -> StateLock:
        self.acquire()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


def _read_holder(fd: int) -> tuple[int | None, str]:
    """The pid and the holder written in the lock file (``launcher up`` when the file names
    none); the pid is None when the file holds no number."""
    try:
        text = os.pread(fd, 128, 0).decode("ascii", errors="replace")
    except OSError:
        return None, UP
    first, _, rest = text.partition("\n")
    holder = rest.strip() if rest.strip() in (UP, DOWN) else UP
    return (int(first.strip()) if first.strip().isdigit() else None), holder
