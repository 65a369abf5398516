"""The Accelerate distillation scripts, run from the repository root as modules:

    accelerate launch -m training.distill_veca ...      (or python -m training.distill_veca ...)
    accelerate launch -m training.distill_lookwhere ...

Each script is its method's story (arguments, teacher, student, per-step draws, loss); the pieces they share are the
modules next to them: `loop`, `data`, `losses`, `schedule`, `teacher`, `teacher_cache`, `checkpointing`, `arguments`.
"""
