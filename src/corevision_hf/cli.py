"""What every command line shares: a bad input ends in one line on stderr and exit status 2, never a traceback.

`run(main, argv)` calls a command's `main` and returns its exit status (`exit_status` of what it raised). Running out of
memory is one line too (the size or batch asked for was too large for this machine), and so is a run that stopped
before its end (`RunStopped`, a non-finite loss, Ctrl-C). The training scripts call `exit_status` alone, after the
error (`training.arguments.run_as_command`): they import this module (and so torch) only then, so that their `--help`
answers at once."""

import argparse
import contextlib
import errno
import os
import pickle
import sys

from safetensors import SafetensorError

# bad values; missing, unreadable or existing files; an unreachable hub; weights that cannot be read or written (a full
# disk under safetensors)
USER_ERRORS = (ValueError, OSError, SafetensorError)


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """`--help` with the description as written and every option's default (where it has one and its help does not
    already name it)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.default in (None, False, argparse.SUPPRESS) or "default" in text.lower():
            return text
        return f"{text} (default: %(default)s)".lstrip()


class RunStopped(Exception):
    """A run that stopped on its own (a stuck or dead process, a full disk, Ctrl-C): its message says what happened
    and how to continue; exit status `code`, 130 after Ctrl-C, else 1."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


def error_line(error: BaseException, prefix: str = "error") -> str:
    """`error` as one line, whatever its message holds (transformers' and torch's messages span several)."""
    return f"{prefix}: " + " ".join(str(error).split())


def out_of_memory(error: BaseException, prefix: str = "error") -> str | None:
    """The one line for torch's GPU OutOfMemoryError or its CPU allocator's failure (a plain RuntimeError), else
    None."""
    if type(error).__name__ == "OutOfMemoryError" or "can't allocate memory" in str(error):
        return error_line(error, f"{prefix}: out of memory") + " Choose a smaller size or batch."
    return None


# errno of a write that failed for the disk, not the input -> what to tell the user
UNWRITABLE = {errno.ENOSPC: ("the disk is full", "free some space, or choose an output folder on another disk"),
              errno.EDQUOT: ("the disk quota is used up", "free some space, or choose an output folder on another disk"),
              errno.EROFS: ("the file system is read-only", "choose an output folder on a writable disk")}


def unwritable(error: BaseException, prefix: str = "error") -> str | None:
    """The one line for a write that a full disk, a used-up quota or a read-only file system refused, else None."""
    if not isinstance(error, OSError) or error.errno not in UNWRITABLE:
        return None
    reason, fix = UNWRITABLE[error.errno]
    where = f" {error.filename}" if error.filename else ""
    return f"{prefix}: could not write{where}: {reason}; {fix}."


def run(main, argv: list[str] | None = None, errors: tuple = USER_ERRORS) -> int:
    """Calls `main(argv)` and returns the exit status: 0, or `exit_status`'s for what it raised."""
    try:
        main(argv)
    except (Exception, KeyboardInterrupt) as error:  # exit_status raises again what it has no line for
        return exit_status(error, errors)
    return 0


def exit_status(error: BaseException, errors: tuple = USER_ERRORS) -> int:
    """Prints `error` as one line on stderr and returns the exit status: 2 for an error of the `errors` types or
    running out of memory; a RunStopped's code, 1 for a FloatingPointError (a loss that is no longer finite), 130 for
    Ctrl-C. Any other error is raised again. Under `accelerate launch`, processes other than 0 name themselves, and
    each leaves at once (no destructors): a process group torn down by the garbage collector can hang."""
    if isinstance(error, KeyboardInterrupt):
        error, code = RunStopped("interrupted (Ctrl-C)."), 130
    elif isinstance(error, (RunStopped, FloatingPointError)):
        code = getattr(error, "code", 1)
    elif isinstance(error, errors) or isinstance(error, RuntimeError) and out_of_memory(error):
        code = 2
    else:
        raise error
    rank = os.environ.get("RANK", "0")
    prefix = "error" if rank == "0" else f"error (process {rank})"
    print(out_of_memory(error, prefix) or unwritable(error, prefix) or error_line(error, prefix), file=sys.stderr)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


@contextlib.contextmanager
def reading_weights(name: str):
    """Around a `from_pretrained` of `name`: weights that cannot be loaded (a truncated or corrupt safetensors or
    PyTorch file, a pickle that would run code, another model's tensors) are one ValueError naming the model."""
    try:
        yield
    except (SafetensorError, pickle.UnpicklingError, EOFError, RuntimeError, OSError) as error:
        # EINVAL is torch's reader on a cut file; other OSErrors (missing, unreachable) say what they are themselves
        if out_of_memory(error) or isinstance(error, OSError) and error.errno != errno.EINVAL:
            raise
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
        if isinstance(error, pickle.UnpicklingError):  # torch's own first line says how to unpickle it anyway
            reason = "a pickle of more than tensors, which is never unpickled"
        raise ValueError(f"The weights of {name!r} cannot be loaded ({reason[:160]}): the file is truncated, corrupt "
                         "or not this model's (a pickle that would run code is never unpickled). Copy or download "
                         "it again.") from None
