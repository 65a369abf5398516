"""VECA from the teacher on the sparse-recognition task (benchmarks.sparse_recognition_veca): training.conversion's
`convert` (the copy, its bank seeded from the teacher's tokens, stage 1, stage 2) on the training canvases but their
validation ones and the training photos, at the canvas size; its per-block table on validation canvases; a checkpoint
of the student at each point of its learning curve (`conversion_points`). A finished conversion is kept with its
record and key (`conversion_key`) and reused by a run that would compute the same bits: the conversion is most of
`make tasks-veca`'s time, and a killed run need not redo it."""

import hashlib
import json
from pathlib import Path
from types import SimpleNamespace

import torch
from safetensors.torch import save_file

import training.conversion
from corevision_hf import VecaModel
from corevision_hf.saving import save_model_folder
from evaluation.canvases import PhotoSplit, Pixels, Split
from evaluation.teacher_passes import code_digest, teacher_fingerprint
from training.checkpointing import delete_entries, write_json
from training.conversion import convert

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "corevision_hf"
RECORD = "conversion.json"  # in the student's folder, written last: the key and convert's record
WRITTEN = ("checkpoints", "start", "final", RECORD)  # what a conversion writes in that folder


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


def conversion_settings(args) -> SimpleNamespace:
    """training.conversion's settings from the benchmark's: a bank of max(--cores), the stages' steps (stage 2 up to
    the last of --stage2-steps), rates, LoRA rank and batch size, --seed."""
    return SimpleNamespace(num_cores=args.cores[-1], batch_size=args.convert_batch_size,
                           stage1_steps=args.stage1_steps, stage1_lr=args.stage1_lr,
                           stage2_steps=args.stage2_steps[-1], stage2_lr=args.stage2_lr, lora_rank=args.lora_rank,
                           seed=args.seed)


def conversion_key(args, teacher, images: Pixels, val: torch.Tensor, table_budgets: list[int]) -> str:
    """SHA-256 of what decides the conversion's bits and its record: the settings, the nested-dropout and table
    budgets, the curve's points, the training images' and the validation canvases' pixels, the teacher's weights
    (evaluation.teacher_passes' fingerprint), the code that runs (the package, training.conversion and this module, as
    syntax trees without docstrings) and torch's version."""
    digest = hashlib.sha256(json.dumps({
        "settings": vars(conversion_settings(args)), "budgets": list(args.cores), "table_budgets": list(table_budgets),
        "points": conversion_points(args), "teacher": teacher_fingerprint(teacher), "torch": torch.__version__,
        "code": code_digest(*(path.read_text() for path in sorted(PACKAGE.rglob("*.py"))),
                            Path(training.conversion.__file__).read_text(), Path(__file__).read_text()),
    }, sort_keys=True).encode())
    for split in images.splits:
        digest.update(split.images.tobytes())
    digest.update(val.contiguous().numpy().tobytes())
    return digest.hexdigest()


def finished_conversion(args, folder: Path, key: str) -> tuple | None:
    """(start, student, record) of the conversion kept in `folder` under `key`, the record marked "reused"; None where
    there is none, its key is another's, or a file it needs is missing."""
    try:
        kept = json.loads((folder / RECORD).read_text())
    except (OSError, ValueError):
        return None
    needed = [folder / "start", folder / "final", *(checkpoint_path(folder, point["steps"]).parent
                                                     for point in conversion_points(args)[1:])]
    if not isinstance(kept, dict) or kept.get("key") != key or not all(path.exists() for path in needed):
        return None
    start, student = (VecaModel.from_pretrained(str(folder / name)).float().eval() for name in ("start", "final"))
    return start, student, {**kept["record"], "reused": True}


def convert_on_task(args, teacher, images, val: torch.Tensor, folder: Path, table_budgets: list[int], log) -> tuple:
    """`convert` of `teacher` on `images` (`conversion_images`), its tables on `val` (`table_canvases`) at
    `table_budgets`, with the benchmark's settings (`conversion_settings`, nested dropout over --cores); each later
    point of `conversion_points` kept as a checkpoint under `folder` (`checkpoint_path`), its start and the student as
    model folders in `folder`/start and `folder`/final, then the key and the record in `folder`/conversion.json. A
    conversion kept there under the same key (`conversion_key`) is reused: its record, times included, is that run's,
    with "reused": true. Returns (its start: the copy with its seeded bank, the converted student, convert's record),
    the models float32 in eval mode."""
    key = conversion_key(args, teacher, images, val, table_budgets)
    finished = finished_conversion(args, folder, key)
    if finished is not None:
        log(f"reusing the conversion kept in {folder} (the same settings, images, teacher and code; its times are "
            "that run's): delete the folder to convert again")
        return finished
    delete_entries(str(folder), WRITTEN)  # what an earlier conversion wrote there (the scratch folder is ours)
    settings = conversion_settings(args)
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
    save_model_folder(start["model"], folder / "start")
    save_model_folder(student, folder / "final")
    write_json(str(folder / RECORD), {"key": key, "record": record})
    return start["model"], student.eval(), record
