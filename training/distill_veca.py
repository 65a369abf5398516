"""Distill a budget-adjustable VECA from a frozen teacher, with Accelerate.

    accelerate launch training/distill_veca.py --teacher facebook/dinov3-vitb16-pretrain-lvd1689m \
        --data /path/to/images --preset base --image-size 256 --batch-size 128 --max-steps 100000

One core budget per optimisation step (nested dropout), drawn from the config's budgets and weights as a function
of (seed, step) alone, so every process of a distributed run uses the same one. Loss: CLS cosine + patch cosine +
patch MSE against the teacher's final tokens (CLS = token 0, patches = the last Hp * Wp). DDP, FSDP and DeepSpeed
are chosen by the `accelerate launch --config_file` alone (see training/configs/). The final export is a hub-ready
folder: `AutoModel.from_pretrained(OUT/final, trust_remote_code=True)`.
"""

import argparse
import json
import os

import torch
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration, ProjectConfiguration, set_seed
from checkpointing import export, finish, guarded_update, resume, save_checkpoint
from data import build_dataset, collate
from losses import veca_loss
from schedule import draw, reseed_for_step, warmup_cosine
from teacher import load_teacher, teacher_input, teacher_patch_size, teacher_targets
from teacher_cache import TeacherCache
from tqdm.auto import tqdm

from corevision_hf import VecaConfig, VecaModel


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--teacher", required=True, help="hub id, save_pretrained folder, or offline-dinov2-small")
    parser.add_argument("--data", required=True, help="an image folder (labels ignored) or a datasets name")
    parser.add_argument("--streaming", action="store_true", help="stream the datasets name instead of downloading")
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--preset", default="small", help="VECA size: small, splus, base, large")
    parser.add_argument("--config-overrides", default="{}", help='JSON of VecaConfig fields, e.g. {"num_hidden_layers": 6}')
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--resolutions", default=None, help='multi-resolution stage: "256:1,384:1,512:1" (size:weight)')
    parser.add_argument("--batch-size", type=int, default=32, help="per process")
    parser.add_argument("--max-steps", type=int, required=True, help="optimisation steps")
    parser.add_argument("--lr", type=float, default=4e-4)
    parser.add_argument("--min-lr", type=float, default=5e-5)
    parser.add_argument("--warmup-steps", type=int, default=0)
    parser.add_argument("--weight-decay", type=float, default=0.015)
    parser.add_argument("--dense-weight", type=float, default=1.0)
    parser.add_argument("--mse-weight", type=float, default=1.0)
    parser.add_argument("--gradient-accumulation-steps", type=int, default=1)
    parser.add_argument("--max-grad-norm", type=float, default=1.0)
    parser.add_argument("--mixed-precision", default="no", choices=["no", "bf16", "fp16"])
    parser.add_argument("--checkpoint-every", type=int, default=1000, help="save_state every N steps")
    parser.add_argument("--keep-checkpoints", type=int, default=3)
    parser.add_argument("--resume", action="store_true", help="continue from the last checkpoint in --output-dir")
    parser.add_argument("--log-with", default="tensorboard", help='tracker, or "none"')
    parser.add_argument("--teacher-cache", type=int, default=0, metavar="CYCLE",
                        help="reuse teacher targets: crops repeat every CYCLE epochs, targets are computed once (0: off)")
    parser.add_argument("--num-workers", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--stop-at-step", type=int, default=None, help=argparse.SUPPRESS)  # simulates a crash (tests)
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    os.makedirs(args.output_dir, exist_ok=True)
    log_with = None if args.log_with == "none" else args.log_with
    accelerator = Accelerator(
        mixed_precision=args.mixed_precision,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        log_with=log_with,
        project_config=ProjectConfiguration(
            project_dir=args.output_dir, automatic_checkpoint_naming=True, total_limit=args.keep_checkpoints
        ),
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True),
    )
    set_seed(args.seed)

    # Data, teacher and student are all checked before the first step.
    resolutions = [(args.image_size, 1.0)]
    if args.resolutions:
        resolutions = [(int(s), float(w)) for s, w in (item.split(":") for item in args.resolutions.split(","))]
    dataset, stats = build_dataset(args.data, streaming=args.streaming, image_size=max(s for s, _ in resolutions), seed=args.seed)
    teacher = load_teacher(args.teacher)
    if args.teacher_cache and (args.resolutions or args.streaming):
        raise ValueError("--teacher-cache needs one resolution and a map-style dataset (not --resolutions / --streaming).")
    cache = None
    if args.teacher_cache:
        fingerprint = {"teacher": args.teacher, "data": args.data, "image_size": args.image_size, "seed": args.seed}
        cache = TeacherCache(os.path.join(args.output_dir, "teacher_cache"), args.teacher_cache, fingerprint)
    config = VecaConfig.from_preset(args.preset, **json.loads(args.config_overrides))
    teacher_patch = teacher_patch_size(teacher)
    for size, _ in resolutions:
        if size % config.patch_size:
            raise ValueError(f"Resolution {size} is not a multiple of the student's patch size {config.patch_size}.")
    if teacher.config.hidden_size != config.hidden_size and not config.output_projection_size:
        config.output_projection_size = teacher.config.hidden_size  # student -> teacher width for the loss
    student = VecaModel(config)

    dataloader = torch.utils.data.DataLoader(
        dataset,
        batch_size=args.batch_size,
        shuffle=not args.streaming,
        collate_fn=collate,
        num_workers=args.num_workers,
        drop_last=True,
    )
    optimizer = torch.optim.AdamW(student.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: warmup_cosine(step, args.warmup_steps, args.max_steps, args.min_lr / args.lr)
    )
    student, optimizer, dataloader, scheduler = accelerator.prepare(student, optimizer, dataloader, scheduler)
    teacher = accelerator.prepare_model(teacher, evaluation_mode=True)

    step = resume(accelerator, args.output_dir) if args.resume else 0
    accelerator.init_trackers("distill_veca", config={k: v for k, v in vars(args).items() if v is not None})

    steps_per_epoch = len(dataloader) // args.gradient_accumulation_steps if not args.streaming else None
    if steps_per_epoch == 0:
        raise ValueError(f"{args.data} holds fewer images than one batch of {args.batch_size} per process.")
    progress = tqdm(total=args.max_steps, initial=step, disable=not accelerator.is_main_process, desc="distill")
    while step < args.max_steps:
        epoch = step // steps_per_epoch if steps_per_epoch else 0
        batches = dataloader
        if steps_per_epoch:
            dataloader.set_epoch(epoch)
            dataset.set_epoch(cache.crop_epoch(epoch) if cache else epoch)
            skip = (step % steps_per_epoch) * args.gradient_accumulation_steps
            batches = accelerator.skip_first_batches(dataloader, skip) if skip else dataloader
        for batch in batches:
            reseed_for_step(args.seed, step, accelerator.process_index)
            num_cores = draw(config.training_budgets, config.training_budget_weights, args.seed, step)
            size = draw([s for s, _ in resolutions], [w for _, w in resolutions], args.seed + 1, step)
            pixel_values = batch["pixel_values"]
            # One tiny all-gather per batch: every process must use the same budget (checked, not assumed), and a
            # batch of only unreadable files is skipped by all processes together.
            shared = accelerator.gather(torch.tensor([[num_cores, len(pixel_values)]], device=accelerator.device))
            if len(set(shared[:, 0].tolist())) != 1:
                raise RuntimeError(f"Processes disagree on the core budget at step {step}: {shared[:, 0].tolist()}.")
            if (shared[:, 1] == 0).any():
                continue
            if size != pixel_values.shape[-1]:
                pixel_values = torch.nn.functional.interpolate(pixel_values, size=(size, size), mode="bilinear", antialias=True)
            grid = (size // config.patch_size, size // config.patch_size)
            with accelerator.accumulate(student):
                def compute_targets(images):
                    return teacher_targets(teacher, teacher_input(images, teacher_patch, config.patch_size), grid)

                if cache:
                    crop_epoch = cache.crop_epoch(epoch)
                    teacher_cls, teacher_patches = cache.targets(compute_targets, pixel_values, batch["index"], crop_epoch)
                else:
                    teacher_cls, teacher_patches = compute_targets(pixel_values)
                output = student(pixel_values, num_cores=num_cores)
                loss, terms = veca_loss(
                    output.pooler_output, output.last_hidden_state[:, num_cores:], teacher_cls, teacher_patches,
                    args.dense_weight, args.mse_weight,
                )
                guarded_update(accelerator, student, optimizer, scheduler, loss, args.max_grad_norm, step, args.output_dir)
            if not accelerator.sync_gradients:
                continue
            step += 1
            progress.update(1)
            logs = {"loss": loss.item(), "num_cores": num_cores, "resolution": size, "lr": scheduler.get_last_lr()[0]}
            logs.update({name: value.item() for name, value in terms.items()})
            accelerator.log(logs, step=step)
            progress.set_postfix(loss=f"{logs['loss']:.4f}", cores=num_cores)
            if accelerator.is_main_process:
                with open(os.path.join(args.output_dir, "metrics.jsonl"), "a") as f:
                    f.write(json.dumps({"step": step, **logs, "budgets_all_processes": shared[:, 0].tolist()}) + "\n")
            if step % args.checkpoint_every == 0 or step == args.max_steps:
                save_checkpoint(accelerator, args.output_dir, step)
            if args.stop_at_step is not None and step >= args.stop_at_step:
                accelerator.print(f"stopping at step {step} as asked (--stop-at-step)")
                finish(accelerator)
                return
            if step >= args.max_steps:
                break
    progress.close()

    export(accelerator, student, args.output_dir, stats, "training/distill_veca.py", args)
    finish(accelerator)


if __name__ == "__main__":
    main()
