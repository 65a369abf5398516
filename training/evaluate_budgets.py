"""Moved to `evaluation.evaluate_budgets`: this stub answers the old command, `python training/evaluate_budgets.py`,
with the new one."""

import shlex
import sys

if __name__ == "__main__":
    print(f"error: training/evaluate_budgets.py moved; from the repository root run: "
          f"python -m evaluation.evaluate_budgets {shlex.join(sys.argv[1:])}", file=sys.stderr)
    sys.exit(2)
