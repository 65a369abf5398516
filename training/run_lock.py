"""One live run per output folder: a second run started into the --output-dir of a run that is still going is
refused before it deletes or writes anything, instead of both writing `final/`.

The lock is an exclusive POSIX record lock (`lockf`) on a file named after the folder's real path, held by the run's
main process until the run ends. The operating system releases it when that process dies, so a crashed or killed run
never leaves its folder locked; unlike a `flock`, it is not inherited by forked DataLoader workers, which can outlive
a killed run for a while. The file lives in the temporary folder, not in --output-dir, so that a run refused before it writes
leaves no folder behind; it guards the runs of one machine.
"""

import errno
import fcntl
import hashlib
import os
import tempfile

_held: dict[str, int] = {}  # real path of an output folder -> the open lock file this process holds for it


def lock_path(output_dir: str) -> str:
    """The lock file of `output_dir` (a path that need not exist yet)."""
    digest = hashlib.sha256(os.fsencode(os.path.realpath(output_dir))).hexdigest()[:32]
    return os.path.join(tempfile.gettempdir(), f"corevision_hf-run-{digest}.lock")


def lock_output_dir(output_dir: str) -> None:
    """Holds `output_dir`'s run lock for this process (again: nothing to do). Raises ValueError naming the process of
    the run that holds it."""
    real = os.path.realpath(output_dir)
    if real in _held:
        return
    fd = os.open(lock_path(output_dir), os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
        if error.errno not in (errno.EACCES, errno.EAGAIN):  # what lockf says when another process holds it
            os.close(fd)
            raise
        holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise ValueError(f"Another run (process {holder}) is writing into {output_dir}: wait until it ends, or choose "
                         "another --output-dir.") from None
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    _held[real] = fd


def release_output_dirs() -> None:
    """Releases the run locks this process holds (at the end of a run)."""
    while _held:
        os.close(_held.popitem()[1])
