"""Distillation runs with a hook inside, for tests that need a process of their own. Run from the repository root:

    python -m tests.distill_hooks die-inside-a-save SCRIPT_ARGS...
    accelerate launch ... -m tests.distill_hooks spy-on-data RECORD_DIR SCRIPT_ARGS...

- die-inside-a-save: training.distill_veca, killed (SIGKILL) when the step-4 checkpoint's files and state.json are
  written but not its manifest (so neither the rename nor the rotation happens).
- spy-on-data: training.distill_lookwhere, first with another --seed on each process (refused: the error goes to
  RECORD_DIR/refused_<rank>.txt, and nothing may be written), then as given, recording in RECORD_DIR/seen_<rank>.json
  the gray level of every example (which image of a uniform-gray dataset it is a crop of).
"""

import json
import os
import signal
import sys


def die_inside_a_save(argv: list[str]) -> None:
    from training import checkpointing, distill_veca

    write_json = checkpointing.write_json

    def dying(path, value):
        if path.endswith("checkpoint_4.partial/manifest.json"):
            os.kill(os.getpid(), signal.SIGKILL)
        write_json(path, value)

    checkpointing.write_json = dying
    distill_veca.main(argv)


def spy_on_data(record_dir: str, argv: list[str]) -> None:
    from training import data, distill_lookwhere

    rank, seen = os.environ["RANK"], []
    collate = data.collate

    def spy(examples):  # a crop's gray level survives crop, flip and normalisation
        seen.extend(float(e["pixel_values"][0].mean()) * 0.229 + 0.485 for e in examples)
        return collate(examples)

    data.collate = spy
    try:  # the processes disagree: process 1 was given another seed
        distill_lookwhere.main(argv + ["--seed", str(3 + int(rank))])
    except ValueError as error:
        with open(os.path.join(record_dir, f"refused_{rank}.txt"), "w") as f:
            f.write(str(error))
    assert not os.path.exists(argv[argv.index("--output-dir") + 1])
    seen.clear()
    distill_lookwhere.main(argv)
    with open(os.path.join(record_dir, f"seen_{rank}.json"), "w") as f:
        json.dump(seen, f)


if __name__ == "__main__":
    hook, *rest = sys.argv[1:]
    if hook == "die-inside-a-save":
        die_inside_a_save(rest)
    elif hook == "spy-on-data":
        spy_on_data(rest[0], rest[1:])
    else:
        sys.exit(f"error: unknown hook {hook!r}: die-inside-a-save or spy-on-data")
