"""Convert a pretrained ViT (DINOv2, DINOv3) into an elastic VECA that reads what its teacher reads.

    python -m training.convert_veca --teacher offline-dinov2-small --data assets/photos --image-size 518 \
        --output-dir runs/veca-from-dinov2s

The story, each stage measured before the next (issue #67; LoLCATs and MOHAWK convert attention the same way):
1. The copy: `corevision_hf.veca_from_teacher` (the teacher's patch embedding, positions, norms, attention and MLP).
2. Its bank seeded from the teacher (`training.conversion.seed_core_bank`): core 0 the teacher's CLS, then its
   registers, then centroids of its first block's patch tokens over the training images, in nested order.
3. Stage 1, attention transfer (--stage1-steps): the copied weights frozen, the bank and coordinate heads learn each
   block's attention branch, the patches reading the teacher's hidden states of that block.
4. Stage 2, end to end (--stage2-steps): the student alone against the teacher's every block and final features, all
   its weights trained (or LoRA adapters with --lora-rank, merged afterwards).
A core budget per step is drawn as nested dropout draws it (the config's training budgets). The per-block table
(`training.conversion.transfer_errors`, at C = 8 and the whole bank) is printed at the start and after each stage,
beside its references, with the final features' cosines; OUT/conversion.json keeps them, every loss and the times.
OUT/final is a hub-ready folder: `AutoModel.from_pretrained(OUT/final, trust_remote_code=True)`.
"""

import argparse
import json
import time
from pathlib import Path

import torch

from corevision_hf.cli import HelpFormatter, run

from .arguments import parse_seed

SCRIPT = "training.convert_veca"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--teacher", default="offline-dinov2-small",
                        help="a DINOv2 / DINOv3 ViT: hub id, save_pretrained folder, or offline-dinov2-small")
    parser.add_argument("--data", type=Path, required=True, help="a folder of training images (any nesting)")
    parser.add_argument("--val-images", type=int, default=2, help="the last images of --data, held out of training")
    parser.add_argument("--image-size", type=int, default=518, help="the side images are resized and cropped to")
    parser.add_argument("--num-cores", type=int, default=64, help="the bank's size")
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--stage1-steps", type=int, default=300)
    parser.add_argument("--stage1-lr", type=float, default=3e-3)
    parser.add_argument("--stage2-steps", type=int, default=300)
    parser.add_argument("--stage2-lr", type=float, default=2e-5)
    parser.add_argument("--lora-rank", type=int, default=0, help="stage 2 with LoRA adapters of this rank (0: every "
                                                                 "weight)")
    parser.add_argument("--seed", type=parse_seed, default=0)
    parser.add_argument("--output-dir", type=Path, required=True, help="a new folder (or an empty one)")
    args = parser.parse_args(argv)
    for name in ("val_images", "image_size", "num_cores", "batch_size", "stage1_lr", "stage2_lr"):
        if getattr(args, name) <= 0:
            raise ValueError(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}.")
    for name in ("stage1_steps", "stage2_steps", "lora_rank"):
        if getattr(args, name) < 0:
            raise ValueError(f"--{name.replace('_', '-')} must be 0 or more, got {getattr(args, name)}.")
    if args.output_dir.exists() and (not args.output_dir.is_dir() or any(args.output_dir.iterdir())):
        raise ValueError(f"--output-dir {args.output_dir} exists and is not an empty folder: give a new one (nothing "
                         "of yours is replaced).")
    return args


def load_images(folder: Path, size: int, patch_size: int) -> torch.Tensor:
    """Every image of `folder`, resized and centre-cropped to `size`, normalised: (N, 3, size, size)."""
    from corevision_hf.images import open_image, to_pixel_values

    from .data import image_files, resize_center_crop

    if size % patch_size:
        raise ValueError(f"--image-size {size} is not a multiple of the teacher's patch size {patch_size}.")
    files, _ = image_files(folder, "train")
    return torch.stack([to_pixel_values(resize_center_crop(open_image(file), size)) for file in files])


def table_record(student, teacher, targets: dict, pixel_values: torch.Tensor, log) -> dict:
    """The per-block table at C = 8 (or the bank, if smaller) and the whole bank, and the final features' cosines
    at the whole bank, printed and returned."""
    from .conversion import final_cosines, format_table, transfer_errors

    bank = student.config.num_cores
    table = transfer_errors(student, targets, sorted({min(8, bank), bank}))
    cosines = final_cosines(student.eval(), teacher, pixel_values, bank)
    log(format_table(table))
    log("final features at C = {}: patch cosine {patch_cosine:.3f}, centred {centred_patch_cosine:.3f}, core 0 / CLS "
        "{cls_cosine:.3f}".format(bank, **cosines))
    return {"transfer_error": table, "final_cosines": cosines}


def convert(teacher, train: torch.Tensor, val: torch.Tensor, args, log=print) -> tuple:
    """The conversion of `teacher` on the normalised images `train` (N, 3, S, S), measured on `val`, with the
    settings of `args` (this script's: num_cores, batch_size, the stages' steps and rates, lora_rank, seed). Returns
    (the student, the record: the seeding, each stage's table, cosines, losses and time, the whole time)."""
    from corevision_hf import veca_from_teacher

    from .conversion import attention_transfer, end_to_end, seed_core_bank, teacher_targets

    start = time.perf_counter()
    torch.manual_seed(args.seed)

    def batch(step: int) -> torch.Tensor:  # a function of the step alone: the same run twice gives the same bits
        order = torch.randperm(len(train), generator=torch.Generator().manual_seed(args.seed + step // len(train)))
        first = (step * args.batch_size) % len(train)
        return train[order[torch.arange(first, first + args.batch_size) % len(train)]]

    student = veca_from_teacher(teacher, num_cores=args.num_cores, image_size=train.shape[-1]).float()
    record = {"seeded": seed_core_bank(student, teacher, train.split(args.batch_size), seed=args.seed), "stages": {}}
    val_targets = teacher_targets(teacher, val)
    log("the copy, its bank seeded from the teacher:")
    record["stages"]["start"] = table_record(student, teacher, val_targets, val, log)
    for name, steps in (("stage1", args.stage1_steps), ("stage2", args.stage2_steps)):
        if not steps:
            continue
        began = time.perf_counter()
        if name == "stage1":
            losses = attention_transfer(student, teacher, batch, steps, args.stage1_lr, args.seed, log)
        else:
            student, losses = end_to_end(student, teacher, batch, steps, args.stage2_lr, args.seed,
                                         args.lora_rank or None, log)
        log(f"after {name} ({time.perf_counter() - began:.0f} s):")
        record["stages"][name] = {"losses": losses, "time_s": time.perf_counter() - began,
                                  **table_record(student, teacher, val_targets, val, log)}
    record["conversion_time_s"] = time.perf_counter() - start
    return student, record


def main(argv=None) -> None:
    from corevision_hf.saving import save_model_folder

    from .teacher import load_teacher

    args = parse_args(argv)
    teacher = load_teacher(args.teacher)
    images = load_images(args.data, args.image_size, teacher.config.patch_size)
    if len(images) <= args.val_images:
        raise ValueError(f"--data holds {len(images)} images: at least --val-images {args.val_images} + 1 are needed.")
    print(f"{len(images) - args.val_images} training images, {args.val_images} held out, at {args.image_size} px")
    student, record = convert(teacher, images[: -args.val_images], images[-args.val_images:], args)
    save_model_folder(student, args.output_dir / "final")
    record = {"script": SCRIPT, "args": {name: str(value) for name, value in vars(args).items()}, **record}
    (args.output_dir / "conversion.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"conversion took {record['conversion_time_s'] / 60:.1f} min; saved {args.output_dir / 'final'}")


if __name__ == "__main__":
    raise SystemExit(run(main))
