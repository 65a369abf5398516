"""VECA from the teacher on the sparse-recognition task (benchmarks.sparse_recognition_veca): training.conversion's
`convert` (the copy, its bank seeded from the teacher's tokens, stage 1, stage 2) on the training canvases but their
validation ones and the training photos, at the canvas size; its per-block table on validation canvases; a checkpoint
of the student at each point of its learning curve (`conversion_points`)."""

from pathlib import Path
from types import SimpleNamespace

import torch
from safetensors.torch import save_file

from corevision_hf.saving import save_model_folder
from evaluation.canvases import PhotoSplit, Pixels, Split
from training.conversion import convert


def conversion_images(args, train: list[Split]) -> Pixels:
    """What the conversion trains on, of `train` (each variant's training canvases, then the photos): every canvas but
    the last --val of each split (its validation canvases), and every photo."""
    return Pixels([split if isinstance(split, PhotoSplit) else split.first(len(split) - args.val) for split in train])


def table_canvases(args, split: Split) -> torch.Tensor:
    """(--table-canvases, 3, S, S): the first validation canvases of the training split `split` (its last --val),
    where the per-block table and the final features' cosines are measured."""
    first = len(split) - args.val
    return split.pixels(slice(first, first + args.table_canvases))


def conversion_points(args) -> list[dict]:
    """The conversion's learning curve, {"stage", "stage_steps", "steps" (of the whole conversion)} per point: its start
    (the copy with its seeded bank, no step taken), the end of stage 1 (unless --stage1-steps is 0), stage 2 at each of
    --stage2-steps (unless 0). The last point is the converted student."""
    points = [{"stage": "start", "stage_steps": 0, "steps": 0}]
    if args.stage1_steps:
        points.append({"stage": "stage1", "stage_steps": args.stage1_steps, "steps": args.stage1_steps})
    return points + [{"stage": "stage2", "stage_steps": steps, "steps": args.stage1_steps + steps}
                     for steps in args.stage2_steps if steps]


def checkpoint_path(folder: Path, steps: int) -> Path:
    """The weights of a run's checkpoint after `steps` steps, where training.loop keeps them too."""
    return folder / "checkpoints" / f"checkpoint_{steps}" / "model.safetensors"


def convert_on_task(args, teacher, images, val: torch.Tensor, folder: Path, table_budgets: list[int], log) -> tuple:
    """`convert` of `teacher` on `images` (`conversion_images`), its tables on `val` (`table_canvases`) at
    `table_budgets`, with the benchmark's settings (a bank of max(--cores), nested dropout over --cores, the stages'
    steps, rates, LoRA rank and batch size, --seed); each later point of `conversion_points` kept as a checkpoint
    under `folder` (`checkpoint_path`), the student as a model folder in `folder`/final. Returns (its start: the copy
    with its seeded bank, the converted student, convert's record), the models float32 in eval mode."""
    settings = SimpleNamespace(num_cores=args.cores[-1], batch_size=args.convert_batch_size,
                               stage1_steps=args.stage1_steps, stage1_lr=args.stage1_lr,
                               stage2_steps=args.stage2_steps[-1], stage2_lr=args.stage2_lr, lora_rank=args.lora_rank,
                               seed=args.seed)
    kept, start = {point["steps"] for point in conversion_points(args)[1:]}, {}

    def keep(stage: str, steps: int, snapshot) -> None:
        steps += args.stage1_steps if stage == "stage2" else 0
        if stage == "start":
            start["model"] = snapshot().eval()
        elif steps in kept:
            path = checkpoint_path(folder, steps)
            path.parent.mkdir(parents=True)
            save_file(snapshot().state_dict(), str(path))

    student, record = convert(teacher, images, val, settings, log, budgets=args.cores, table_budgets=table_budgets,
                              after_step=keep)
    save_model_folder(student, folder / "final")
    return start["model"], student.eval(), record
