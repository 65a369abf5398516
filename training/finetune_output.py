"""The --output-dir of `training.finetune`: free before a run writes there (new, empty, or with --overwrite a run of
the command and nothing else), locked while it runs, and marked as its run (run.json, listed in the folder's manifest)
so that a later --overwrite replaces only what a run wrote: never a file a user added or changed (notes, an ONNX export
under final/onnx/).
"""

import os

SCRIPT = "training.finetune"
# What a run writes into --output-dir (export's `.partial` folders while it writes best/ and final/): all that
# --overwrite deletes, and only from a folder whose run.json names this script and where every file of them is the
# run's own (training.checkpointing.unmarked_run_files). The run lock (.run.lock) and the manifest stay.
RUN_NAMES = ("run.json", "metrics.jsonl", "choice.json", "best", "final", "best.partial", "final.partial")


def write_json(path: str, value) -> None:
    """`value` as JSON at `path`, written whole (corevision_hf.atomic: a link found there is replaced, not followed)."""
    import json

    from corevision_hf.atomic import write_text_atomically

    write_text_atomically(path, json.dumps(value, indent=1))


def check_output_dir_free(output_dir: str, overwrite: bool) -> None:
    """A ValueError, before anything is deleted or written, unless `output_dir` is new, empty, or (with `overwrite`)
    holds a run of this command and nothing else: its run.json names this script and is one a run wrote, every other
    entry is one of `RUN_NAMES`, none of them a link, and every file in them is the run's own
    (training.checkpointing.overwrite_problem: listed with its content in a manifest the run wrote)."""
    from corevision_hf.outputs import MANIFEST

    from .checkpointing import overwrite_problem
    from .run_lock import LOCK_FILE

    entries = sorted(set(os.listdir(output_dir)) - {LOCK_FILE, MANIFEST}) if os.path.isdir(output_dir) else []
    if not entries:
        return
    if not is_run_of_this_script(output_dir):
        if overwrite:
            raise ValueError(f"--overwrite replaces only a run of {SCRIPT}, and {output_dir} holds none (no run.json "
                             f"that a run of it wrote, listed in {MANIFEST}, but {entries[0]}): nothing was deleted; "
                             "choose a new or empty --output-dir.")
        raise ValueError(f"{output_dir} already holds files of its own ({', '.join(entries)}): choose a new or empty "
                         "--output-dir.")
    foreign = [name for name in entries if name not in RUN_NAMES or os.path.islink(os.path.join(output_dir, name))]
    if foreign:
        raise ValueError(f"{output_dir} holds a run of {SCRIPT} and also {foreign[0]}, which no run writes there (or "
                         "a link): nothing was deleted; move it elsewhere, or choose a new --output-dir.")
    if not overwrite:
        raise ValueError(f"{output_dir} already holds a run of {SCRIPT} ({', '.join(entries)}): replace it with "
                         "--overwrite, or choose a new or empty --output-dir.")
    if problem := overwrite_problem(output_dir, RUN_NAMES):
        raise ValueError(problem)


def is_run_of_this_script(output_dir: str) -> bool:
    """Whether `output_dir` holds a run.json (a regular file, not a link) that a run of this command wrote: naming this
    script, and listed with its content in the folder's manifest (a hand-written one is not)."""
    import json

    from corevision_hf.outputs import is_ours, read_manifest

    path = os.path.join(output_dir, "run.json")
    if os.path.islink(path) or not is_ours(output_dir, "run.json", read_manifest(output_dir)):
        return False
    try:
        with open(path) as f:
            record = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(record, dict) and record.get("script") == SCRIPT


def open_output_dir(args):
    """The run's Accelerator, once --output-dir is free (new, empty, or --overwrite: its earlier run deleted) and
    locked; writes run.json, the mark of a run of this command."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    from corevision_hf.outputs import record

    from .checkpointing import delete_entries, run_record
    from .run_lock import lock_output_dir

    AcceleratorState._reset_state()  # a second run in one process (the tests) starts clean
    accelerator = Accelerator()
    check_output_dir_free(args.output_dir, args.overwrite)
    lock_output_dir(args.output_dir)
    check_output_dir_free(args.output_dir, args.overwrite)  # again, now that no other run can write there
    if args.overwrite:
        delete_entries(args.output_dir, RUN_NAMES)  # what the earlier run wrote, which the check allowed
    write_json(os.path.join(args.output_dir, "run.json"), run_record(SCRIPT, args, 1))
    record(args.output_dir, ["run.json"], keep=True)  # the mark of a run of this command, for a later --overwrite
    return accelerator
