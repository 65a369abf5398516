"""One live run per output folder: a second run started into the --output-dir of a run that is still going is
refused before it deletes or writes anything, instead of both writing `final/`.

The lock is an exclusive POSIX record lock (`lockf`) on `OUT/.run.lock`, held by the run's main process until the run
ends. The operating system releases it when that process dies, so a crashed or killed run never leaves its folder
locked; unlike a `flock`, it is not inherited by forked DataLoader workers, which can outlive a killed run for a while.
It lives in the folder itself, so every run into that folder finds it whatever its TMPDIR (and on a shared file system
with POSIX locks, whatever its machine). It is never deleted, by --overwrite (which deletes `checkpointing.RUN_FILES`)
or otherwise: a run could hold the deleted file while another locks a new one. It is opened without following a link
and never truncated, so a link planted there cannot make a run write elsewhere.
"""

import errno
import fcntl
import os
import stat

LOCK_FILE = ".run.lock"
_PID_WIDTH = 20  # the pid is written padded to this width at offset 0, so a shorter pid overwrites a longer one whole
_held: dict[str, int] = {}  # real path of an output folder -> the open lock file this process holds for it


def lock_path(output_dir: str) -> str:
    """The lock file of `output_dir`."""
    return os.path.join(output_dir, LOCK_FILE)


def open_lock(path: str) -> int:
    """Opens (creating, never truncating) the lock file at `path` and returns its descriptor. Raises ValueError when
    `path` is a symbolic link or not a regular file."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as error:
        if error.errno == errno.ELOOP:  # what O_NOFOLLOW says for a link
            raise ValueError(f"{path} is a symbolic link, not a run lock: remove it (a run never follows a link "
                             "there).") from None
        if error.errno == errno.EISDIR:
            raise ValueError(f"{path} is not a regular file, not a run lock: remove it.") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO or a device
        os.close(fd)
        raise ValueError(f"{path} is not a regular file, not a run lock: remove it.")
    return fd


def lock_output_dir(output_dir: str) -> None:
    """Creates `output_dir` if needed and holds its run lock for this process (again: nothing to do). Raises
    ValueError naming the process of the run that holds it."""
    real = os.path.realpath(output_dir)
    if real in _held:
        return
    os.makedirs(output_dir, exist_ok=True)
    fd = open_lock(lock_path(output_dir))
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
        if error.errno not in (errno.EACCES, errno.EAGAIN):  # what lockf says when another process holds it
            os.close(fd)
            raise
        holder = os.pread(fd, _PID_WIDTH, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise ValueError(f"Another run (process {holder}) is writing into {output_dir}: wait until it ends, or choose "
                         "another --output-dir.") from None
    os.pwrite(fd, str(os.getpid()).ljust(_PID_WIDTH).encode(), 0)
    _held[real] = fd


def release_output_dirs() -> None:
    """Releases the run locks this process holds (at the end of a run)."""
    while _held:
        os.close(_held.popitem()[1])
