"""Moved to `publishing.model_card`: this stub answers the old command, `python training/model_card.py`,
with the new one."""

import shlex
import sys

if __name__ == "__main__":
    print(f"error: training/model_card.py moved; from the repository root run: "
          f"python -m publishing.model_card {shlex.join(sys.argv[1:])}", file=sys.stderr)
    sys.exit(2)
