"""What every command line shares: a bad input ends in one line on stderr and exit status 2, never a traceback.

Two forms of one rule: `run(main, argv)` for a command whose `main` raises, returning the exit status, and
`one_line_errors()` around the part of a `main` that can fail on the user's input (it exits with status 2). Running
out of memory is one line too: the size or batch asked for was too large for this machine."""

import contextlib
import errno
import pickle
import sys

from safetensors import SafetensorError

# bad values; missing, unreadable or existing files; an unreachable hub; weights that cannot be read or written (a full
# disk under safetensors)
USER_ERRORS = (ValueError, OSError, SafetensorError)


def error_line(error: BaseException, prefix: str = "error") -> str:
    """`error` as one line, whatever its message holds (transformers' and torch's messages span several)."""
    return f"{prefix}: " + " ".join(str(error).split())


def out_of_memory(error: BaseException) -> str | None:
    """The one line for torch's GPU OutOfMemoryError or its CPU allocator's failure (a plain RuntimeError), else
    None."""
    if type(error).__name__ == "OutOfMemoryError" or "can't allocate memory" in str(error):
        return error_line(error, "error: out of memory") + " Choose a smaller size or batch."
    return None


def run(main, argv: list[str] | None = None, errors: tuple = USER_ERRORS) -> int:
    """Calls `main(argv)`; returns 0, or 2 after printing an error of the `errors` types (or running out of memory)
    as one line on stderr."""
    try:
        main(argv)
    except errors as error:
        print(error_line(error), file=sys.stderr)
        return 2
    except RuntimeError as error:
        if not out_of_memory(error):
            raise
        print(out_of_memory(error), file=sys.stderr)
        return 2
    return 0


@contextlib.contextmanager
def one_line_errors(errors: tuple = USER_ERRORS):
    """Inside, an error of the `errors` types, or running out of memory, is printed as one line on stderr and ends the
    program with status 2."""
    try:
        yield
    except errors as error:
        print(error_line(error), file=sys.stderr)
        raise SystemExit(2) from None
    except RuntimeError as error:
        if not out_of_memory(error):
            raise
        print(out_of_memory(error), file=sys.stderr)
        raise SystemExit(2) from None


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
        raise ValueError(f"The weights of {name!r} cannot be loaded ({reason[:160]}): the file is truncated, corrupt "
                         "or not this model's (a pickle that would run code is never unpickled). Copy or download "
                         "it again.") from None
