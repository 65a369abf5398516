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
A core budget per step is drawn as nested dropout draws it (the config's training budgets). The stages are
`training.conversion.convert`'s, which benchmarks.sparse_recognition_veca runs on its canvases too. The per-block table
(`training.conversion.transfer_errors`, at C = 8 and the whole bank) is printed at the start and after each stage,
beside its references, with the final features' cosines; OUT/conversion.json keeps them, every loss and the times.
OUT/final is a hub-ready folder: `AutoModel.from_pretrained(OUT/final, trust_remote_code=True)`.
"""

import argparse
import json
from pathlib import Path

import torch

from corevision_hf.cli import HelpFormatter, run

from .arguments import parse_seed
from .conversion import STAGE1_LR, STAGE2_LR, convert

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
    parser.add_argument("--stage1-lr", type=float, default=STAGE1_LR)
    parser.add_argument("--stage2-steps", type=int, default=300)
    parser.add_argument("--stage2-lr", type=float, default=STAGE2_LR)
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
