"""What-where distillation of a LookWhere model from a frozen DINOv2 teacher, with Accelerate.

    accelerate launch training/distill_lookwhere.py --teacher facebook/dinov2-with-registers-base \
        --data /path/to/images --image-size 518 --batch-size 64 --max-steps 500000

The student starts from the teacher (`LookWhereModel.from_teacher`: the extractor is a copy, the selector its first
blocks). The teacher sees the full image once per sample. Loss: CLS MSE + dense patch MSE after the fill + 0.1 KL
between the teacher's last-layer attention map and the selector map. One k per step, uniform in [k_min, k_max] and a
function of (seed, step) alone, so every process agrees. The final export is a hub-ready folder.
"""

import argparse
import json
import os

import torch
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration, ProjectConfiguration, set_seed
from checkpointing import export, finish, guarded_update, resume, save_checkpoint
from data import build_dataset, collate
from losses import lookwhere_loss
from schedule import draw_int, reseed_for_step, warmup_cosine
from teacher import load_teacher, teacher_attention_map, teacher_targets
from tqdm.auto import tqdm

from corevision_hf import LookWhereModel


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--teacher", required=True, help="a DINOv2 (with registers) hub id or folder, or offline-dinov2-small")
    parser.add_argument("--data", required=True, help="an image folder (labels ignored) or a datasets name")
    parser.add_argument("--streaming", action="store_true")
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--selector-depth", type=int, default=3)
    parser.add_argument("--selector-image-size", type=int, default=154)
    parser.add_argument("--image-size", type=int, default=518)
    parser.add_argument("--k-min", type=int, default=16)
    parser.add_argument("--k-max", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=32, help="per process")
    parser.add_argument("--max-steps", type=int, required=True)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--min-lr", type=float, default=0.0)
    parser.add_argument("--warmup-steps", type=int, default=0)
    parser.add_argument("--weight-decay", type=float, default=0.05)
    parser.add_argument("--map-weight", type=float, default=0.1)
    parser.add_argument("--gradient-accumulation-steps", type=int, default=1)
    parser.add_argument("--max-grad-norm", type=float, default=1.0)
    parser.add_argument("--mixed-precision", default="no", choices=["no", "bf16", "fp16"])
    parser.add_argument("--checkpoint-every", type=int, default=1000)
    parser.add_argument("--keep-checkpoints", type=int, default=3)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--log-with", default="tensorboard", help='tracker, or "none"')
    parser.add_argument("--num-workers", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    os.makedirs(args.output_dir, exist_ok=True)
    accelerator = Accelerator(
        mixed_precision=args.mixed_precision,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        log_with=None if args.log_with == "none" else args.log_with,
        project_config=ProjectConfiguration(
            project_dir=args.output_dir, automatic_checkpoint_naming=True, total_limit=args.keep_checkpoints
        ),
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True),
    )
    set_seed(args.seed)

    dataset, stats = build_dataset(args.data, streaming=args.streaming, image_size=args.image_size, seed=args.seed)
    teacher = load_teacher(args.teacher)
    student = LookWhereModel.from_teacher(
        teacher, selector_depth=args.selector_depth, selector_image_size=args.selector_image_size
    )
    patch = student.config.patch_size
    if args.image_size % patch:
        raise ValueError(f"--image-size {args.image_size} is not a multiple of the teacher's patch size {patch}.")
    grid = (args.image_size // patch, args.image_size // patch)
    if not 1 <= args.k_min <= args.k_max <= grid[0] * grid[1]:
        raise ValueError(f"Need 1 <= k_min <= k_max <= {grid[0] * grid[1]} patches, got [{args.k_min}, {args.k_max}].")

    dataloader = torch.utils.data.DataLoader(
        dataset, batch_size=args.batch_size, shuffle=not args.streaming, collate_fn=collate,
        num_workers=args.num_workers, drop_last=True,
    )
    optimizer = torch.optim.AdamW(student.parameters(), lr=args.lr, weight_decay=args.weight_decay, betas=(0.9, 0.999))
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: warmup_cosine(step, args.warmup_steps, args.max_steps, args.min_lr / args.lr)
    )
    student, optimizer, dataloader, scheduler = accelerator.prepare(student, optimizer, dataloader, scheduler)
    teacher = accelerator.prepare_model(teacher, evaluation_mode=True)

    step = resume(accelerator, args.output_dir) if args.resume else 0
    accelerator.init_trackers("distill_lookwhere", config={k: v for k, v in vars(args).items() if v is not None})

    steps_per_epoch = len(dataloader) // args.gradient_accumulation_steps if not args.streaming else None
    if steps_per_epoch == 0:
        raise ValueError(f"{args.data} holds fewer images than one batch of {args.batch_size} per process.")
    progress = tqdm(total=args.max_steps, initial=step, disable=not accelerator.is_main_process, desc="distill")
    while step < args.max_steps:
        batches = dataloader
        if steps_per_epoch:
            dataloader.set_epoch(step // steps_per_epoch)
            dataset.set_epoch(step // steps_per_epoch)
            skip = (step % steps_per_epoch) * args.gradient_accumulation_steps
            batches = accelerator.skip_first_batches(dataloader, skip) if skip else dataloader
        for batch in batches:
            reseed_for_step(args.seed, step, accelerator.process_index)
            pixel_values = batch["pixel_values"]
            k = draw_int(args.k_min, args.k_max, args.seed, step)
            # a batch of only unreadable files is skipped by all processes together
            if (accelerator.gather(torch.tensor([len(pixel_values)], device=accelerator.device)) == 0).any():
                continue
            with accelerator.accumulate(student):
                teacher_cls, teacher_patches = teacher_targets(teacher, pixel_values, grid)
                teacher_map = teacher_attention_map(teacher, pixel_values, grid)
                output = student(pixel_values, k=k)
                num_prefix = output.last_hidden_state.shape[1] - grid[0] * grid[1]
                loss, terms = lookwhere_loss(
                    output.pooler_output, output.last_hidden_state[:, num_prefix:], output.selector_map,
                    teacher_cls, teacher_patches, teacher_map, map_weight=args.map_weight,
                )
                guarded_update(accelerator, student, optimizer, scheduler, loss, args.max_grad_norm, step, args.output_dir)
            if not accelerator.sync_gradients:
                continue
            step += 1
            progress.update(1)
            logs = {"loss": loss.item(), "k": k, "lr": scheduler.get_last_lr()[0]}
            logs.update({name: value.item() for name, value in terms.items()})
            accelerator.log(logs, step=step)
            progress.set_postfix(loss=f"{logs['loss']:.4f}", k=k)
            if accelerator.is_main_process:
                with open(os.path.join(args.output_dir, "metrics.jsonl"), "a") as f:
                    f.write(json.dumps({"step": step, **logs}) + "\n")
            if step % args.checkpoint_every == 0 or step == args.max_steps:
                save_checkpoint(accelerator, args.output_dir, step)
            if step >= args.max_steps:
                break
    progress.close()

    export(accelerator, student, args.output_dir, stats, "training/distill_lookwhere.py", args)
    finish(accelerator)


if __name__ == "__main__":
    main()
