"""What the command lines share: a bad input ends in one line on stderr and exit status 2, never a traceback."""

import sys


def run(main, argv: list[str] | None = None, errors: tuple = (ValueError, OSError)) -> int:
    """Calls `main(argv)`; returns 0, or 2 after printing an error of the `errors` types (by default bad values and
    OSError: missing, unreadable or existing files, an unreachable hub) as one line on stderr."""
    try:
        main(argv)
    except errors as error:
        print("error: " + " ".join(str(error).split()), file=sys.stderr)  # one line, whatever the message holds
        return 2
    return 0
