"""Moved to `publishing.publish`: this stub answers the old command, `python training/publish.py`,
with the new one."""

import shlex
import sys

if __name__ == "__main__":
    print(f"error: training/publish.py moved; from the repository root run: "
          f"python -m publishing.publish {shlex.join(sys.argv[1:])}", file=sys.stderr)
    sys.exit(2)
