"""What every command line shares: a bad input ends in one line on stderr and exit status 2, never a traceback.

Two forms of one rule: `run(main, argv)` for a command whose `main` raises, returning the exit status, and
`one_line_errors()` around the part of a `main` that can fail on the user's input (it exits with status 2)."""

import contextlib
import sys

USER_ERRORS = (ValueError, OSError)  # bad values; missing, unreadable or existing files; an unreachable hub


def error_line(error: BaseException, prefix: str = "error") -> str:
    """`error` as one line, whatever its message holds (transformers' and torch's messages span several)."""
    return f"{prefix}: " + " ".join(str(error).split())


def run(main, argv: list[str] | None = None, errors: tuple = USER_ERRORS) -> int:
    """Calls `main(argv)`; returns 0, or 2 after printing an error of the `errors` types as one line on stderr."""
    try:
        main(argv)
    except errors as error:
        print(error_line(error), file=sys.stderr)
        return 2
    return 0


@contextlib.contextmanager
def one_line_errors(errors: tuple = USER_ERRORS):
    """Inside, an error of the `errors` types is printed as one line on stderr and ends the program with status 2."""
    try:
        yield
    except errors as error:
        print(error_line(error), file=sys.stderr)
        raise SystemExit(2) from None
