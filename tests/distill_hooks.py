"""Distillation runs with a hook inside, for tests that need a process of their own. Run from the repository root:

    python -m tests.distill_hooks die-inside-a-save SCRIPT_ARGS...
    accelerate launch ... -m tests.distill_hooks spy-on-data RECORD_DIR SCRIPT_ARGS...
    accelerate launch ... -m tests.distill_hooks check-teardown SCRIPT_ARGS...

- die-inside-a-save: training.distill_veca, killed (SIGKILL) when the step-4 checkpoint's files and state.json are
  written but not its manifest (so neither the rename nor the rotation happens).
- spy-on-data: training.distill_lookwhere, first with another --seed on each process (refused: the error goes to
  RECORD_DIR/refused_<rank>.txt, and nothing may be written), then as given, recording in RECORD_DIR/seen_<rank>.json
  the gray level of every example (which image of a uniform-gray dataset it is a crop of).
- check-teardown: training.distill_veca, stopped with exit status 3 and one line on stderr if, when the process group
  goes down (`end_training` in training.checkpointing `finish`), a DDP model is still alive or the accelerator still
  holds its prepared model (on GPUs, the DDP wrapper itself). A DDP model's reducer holds the gloo group; when it goes
  after the group was destroyed, the group's last reference is dropped under the GIL, and its destructor joins the
  group's work thread, which may still need the GIL to free the tensors of the last barrier: a deadlock, about one
  two-process CPU run in six before the fix (seen in gdb: ~ProcessGroupGloo in std::thread::join under
  Reducer::~Reducer, the pt_gloo_runloop thread in gil_scoped_acquire under ~AsyncBarrierWork). The check sees the
  cause in every run, not only in the runs whose threads happen to interleave badly.
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


def check_teardown(argv: list[str]) -> None:
    import gc

    from accelerate import Accelerator
    from torch.nn.parallel import DistributedDataParallel

    from training import distill_veca

    end_training = Accelerator.end_training

    def checked(accelerator):
        held = [f"a live {type(o).__name__}" for o in gc.get_objects() if isinstance(o, DistributedDataParallel)]
        held += [f"the accelerator's prepared {type(model).__name__}" for model in accelerator._models]
        end_training(accelerator)
        if held:
            print(f"error: process {os.environ['RANK']}: the process group went down before {' and '.join(held)} "
                  "went (a DDP model's reducer holds the gloo group, and on GPUs the accelerator's prepared model is "
                  "the DDP model; freed after the group, under the GIL, it can deadlock with the group's work thread)",
                  file=sys.stderr, flush=True)
            os._exit(3)  # at once: the destructors that could hang never run

    Accelerator.end_training = checked
    distill_veca.main(argv)


if __name__ == "__main__":
    hook, *rest = sys.argv[1:]
    if hook == "die-inside-a-save":
        die_inside_a_save(rest)
    elif hook == "spy-on-data":
        spy_on_data(rest[0], rest[1:])
    elif hook == "check-teardown":
        check_teardown(rest)
    else:
        sys.exit(f"error: unknown hook {hook!r}: die-inside-a-save, spy-on-data or check-teardown")
