"""The one way this package writes a file or folder whole: under a fresh name of its own beside the path, then renamed.

`tempfile.mkstemp` / `mkdtemp` create that name themselves (with O_EXCL and a random part), so no link planted beside
the path is ever written through; `os.replace` then puts the result at the path in one step, replacing a link found
there rather than following it. A reader sees the old content or the new, never half of it.
"""

import contextlib
import os
import shutil
import tempfile

from .outputs import follow_umask


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, folder: bool = False):
    """Yields the path (str) of a new empty file, or with `folder` a new empty folder, made beside `path` for the
    block to fill. Its name ends in ".tmp", never in `path`'s extension, so that no listing by extension (the teacher
    cache's "*.safetensors") picks up one that a killed process left; a writer that picks its format by the extension
    (matplotlib's savefig) is given the format. When the block ends without an error it gets the mode the user's umask
    gives and is renamed onto `path` (a folder onto a free path or an empty folder); otherwise it is removed and the
    error goes on."""
    parent, name = os.path.split(os.path.abspath(os.fspath(path)))
    prefix = f".{name[:128]}."  # the name it will have, for whoever lists the folder meanwhile; within NAME_MAX
    if folder:
        temporary = tempfile.mkdtemp(prefix=prefix, suffix=".tmp", dir=parent)
    else:
        handle, temporary = tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=parent)
        os.close(handle)
    try:
        yield temporary
        follow_umask(temporary)
        os.replace(temporary, path)
    except BaseException:
        if os.path.isdir(temporary) and not os.path.islink(temporary):
            shutil.rmtree(temporary, ignore_errors=True)
        elif os.path.lexists(temporary):
            os.remove(temporary)
        raise


def write_text_atomically(path: str | os.PathLike, text: str) -> None:
    """Writes `text` (UTF-8) to `path` through `atomic_path`."""
    with atomic_path(path) as temporary, open(temporary, "w", encoding="utf-8") as f:
        f.write(text)
