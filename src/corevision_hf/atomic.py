"""The one way this package writes a file or folder whole: under a fresh name of its own beside the path, then renamed.

`tempfile.mkstemp` / `mkdtemp` create that name themselves (with O_EXCL and a random part), so no link planted beside
the path is ever written through; `os.replace` then puts the result at the path in one step, replacing a link found
there rather than following it. A reader sees the old content or the new, never half of it. What is written gets the
modes the user's umask gives, as `open` and `mkdir` would (`follow_umask`), and a finished folder takes the place of
an existing one in one step where the system allows (`exchange_folders`).
"""

import contextlib
import ctypes
import errno
import os
import shutil
import tempfile


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, folder: bool = False):
    """Yields the path (str) of a new empty file, or with `folder` a new empty folder, made beside `path` for the
    block to fill. Its name ends in ".tmp", never in `path`'s extension, so that no listing by extension (the teacher
    cache's "*.safetensors") picks up one that a killed process left; a writer that picks its format by the extension
    (matplotlib's savefig) is given the format. When the block ends without an error it gets the mode the user's umask
    gives and is renamed onto `path` (a folder onto a free path or an empty folder, never onto a link, a file or a
    folder that holds anything: a FileExistsError saying so, before the block runs); otherwise it is removed and the
    error goes on."""
    parent, name = os.path.split(os.path.abspath(os.fspath(path)))
    if folder:
        check_folder_target(path)
    prefix = f".{name[:128]}."  # the name it will have, for whoever lists the folder meanwhile; within NAME_MAX
    if folder:
        temporary = tempfile.mkdtemp(prefix=prefix, suffix=".tmp", dir=parent)
    else:
        handle, temporary = tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=parent)
        os.close(handle)
    try:
        yield temporary
        follow_umask(temporary)
        if folder:
            check_folder_target(path)  # again: something may have appeared there while the block ran
        os.replace(temporary, path)
    except BaseException:
        if os.path.isdir(temporary) and not os.path.islink(temporary):
            shutil.rmtree(temporary, ignore_errors=True)
        elif os.path.lexists(temporary):
            os.remove(temporary)
        raise


def check_folder_target(path: str | os.PathLike) -> None:
    """A FileExistsError unless a folder may be renamed onto `path`: free, or an empty folder (not a link)."""
    if not os.path.lexists(path):
        return
    if os.path.islink(path):
        found = "a link"
    elif not os.path.isdir(path):
        found = "a file"
    elif os.listdir(path):
        found = "a folder that holds files"
    else:
        return
    raise FileExistsError(f"{os.fspath(path)} is {found}: a folder is written only where nothing is, or onto an empty "
                          "folder (never through a link, never over files). Move it or choose another path.")


def write_text_atomically(path: str | os.PathLike, text: str) -> None:
    """Writes `text` (UTF-8) to `path` through `atomic_path`."""
    with atomic_path(path) as temporary, open(temporary, "w", encoding="utf-8") as f:
        f.write(text)


def follow_umask(path: str) -> None:
    """Gives `path` the mode a plain `open` (files) or `mkdir` (folders) would under the user's umask: `mkstemp` and
    `mkdtemp`, which the atomic writes go through, make them private (0600 / 0700)."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, (0o777 if os.path.isdir(path) else 0o666) & ~umask)


RENAME_EXCHANGE = 2  # linux/fs.h


def exchange_folders(new: str, target: str) -> None:
    """Puts the folder `new` at `target` and the old `target` at `new`. On Linux in one step (renameat2 with
    RENAME_EXCHANGE), so that `target` is never missing, even when the process is killed; elsewhere (no renameat2,
    or a file system without the flag) by renames one right after the other."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError, TypeError):  # no glibc
        renameat2 = None
    at_cwd = -100  # AT_FDCWD: paths relative to the working directory
    if renameat2 is not None:
        if renameat2(at_cwd, os.fsencode(new), at_cwd, os.fsencode(target), RENAME_EXCHANGE) == 0:
            return
        if ctypes.get_errno() not in (errno.EINVAL, errno.ENOSYS):  # a real failure, not a missing flag
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()), target)
    parked = new + ".old"
    os.rename(target, parked)
    os.rename(new, target)
    os.rename(parked, new)
