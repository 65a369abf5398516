"""What-where distillation of a LookWhere model from a frozen DINOv2 teacher, with Accelerate.

    accelerate launch -m training.distill_lookwhere --recipe lookwhere-dinov2 --data /path/to/images
    accelerate launch -m training.distill_lookwhere --teacher facebook/dinov2-with-registers-base \
        --data /path/to/images --image-size 518 --batch-size 64 --max-steps 500000

The student starts from the teacher (`lookwhere_from_teacher`: the extractor is a copy, the selector its first
blocks), with the numerics --config-overrides gives (the recipe: the authors' JAX training's LayerNorm epsilon, tanh
GELU and antialiased resizes), which the exported student keeps. Its selector map is resized to the patch grid with
antialiasing (selector_map_antialias=True, the authors' JAX training numerics) unless --config-overrides sets
selector_map_antialias: a plain bilinear shrink of the map head's fine map (e.g. 40 x 40 to 8 x 8) would read, and so
train, only the centre cell of each block. The teacher sees the full image once per sample: one forward gives its
tokens and, through a hook, its last-layer attention map, the map target (--map-queries: the mean over the patch
queries, the authors' positions, or the CLS query). Loss: CLS MSE + dense patch MSE after the fill + 0.1 KL between
the teacher's attention map and the selector map. One k per step, uniform in [k_min, k_max] and a function of (seed,
step) alone, so every process agrees; at most --k-slots patches run (the authors draw k up to 129 and select 128).
AdamW decays only kernels (Linear and Conv2d weights), as the authors do. The loop (data per process, schedule,
guarded update, validation, checkpoints, resume, export) is training.loop's. The final export is a hub-ready folder.
"""

import argparse

from .arguments import MAP_QUERIES, check_positive, parse, parse_config_overrides, run_as_command, training_parser

SCRIPT = "training.distill_lookwhere"
# Fields the teacher fixes: the student is a copy of it (depth and size of the selector have their own flags).
TEACHER_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "patch_size",
                  "num_channels", "num_register_tokens", "use_swiglu_ffn", "qkv_bias", "image_size",
                  "selector_depth", "selector_image_size")


def patches_kept(k: int, slots: int) -> int:
    """The patches a drawn k runs: the authors select `slots` (M) patches, best first, and mask those past k, so a k
    above M runs M."""
    return min(k, slots)


def parse_args(argv=None) -> argparse.Namespace:
    parser = training_parser(__doc__, lr=1e-4, min_lr=0.0, weight_decay=0.05)
    parser.add_argument("--selector-depth", type=int, default=3, help="teacher blocks copied into the selector")
    parser.add_argument("--selector-image-size", type=int, default=154, help="the selector's low-resolution input")
    parser.add_argument("--image-size", type=int, default=518)
    parser.add_argument("--k-min", type=int, default=16, help="fewest patches the extractor keeps")
    parser.add_argument("--k-max", type=int, default=128, help="largest k drawn")
    parser.add_argument("--k-slots", type=int, default=None,
                        help="M, the most patches the extractor keeps: a k drawn above it runs M (default: --k-max)")
    parser.add_argument("--config-overrides", default="{}",
                        help='JSON of LookWhereConfig fields the teacher does not fix, e.g. {"layer_norm_eps": 1e-5}; '
                             'selector_map_antialias is true unless set here (every map-head cell trains)')
    parser.add_argument("--map-weight", type=float, default=0.1, help="weight of the attention-map KL")
    parser.add_argument("--map-queries", default="patches", choices=MAP_QUERIES,
                        help="the teacher queries the map target averages: every patch token, the authors' token "
                             "positions 5..1373 (the same for a 4-register teacher at 518 px), or the CLS token alone")
    parser.add_argument("--teacher-microbatch", type=int, default=None, help="images per teacher forward (default: "
                        "the batch)")
    parser.add_argument("--eval-budgets", default=None, help='k validated, "16,128" (default: --k-min and --k-slots)')
    parser.add_argument("--freeze-extractor-steps", type=int, default=0,
                        help="optimisation steps at the start in which only the selector trains and the extractor's "
                             "weights stay as copied from the teacher (0: the authors' recipe)")
    parser.add_argument("--extractor-warmup-steps", type=int, default=None,
                        help="after those (or from step 0), the extractor's learning rate ramps up linearly from 0 "
                             "over this many steps (default: --warmup-steps after frozen steps, else no ramp)")
    return parse(parser, argv, SCRIPT)


def check_before_start(args) -> None:
    """Raises ValueError for what is wrong before the run starts: the optimiser, the frozen steps, unknown overrides."""
    from corevision_hf import LookWhereConfig

    from .optim import check_optimizer

    check_optimizer("lookwhere", args.optimizer)
    if args.freeze_extractor_steps >= args.max_steps:
        raise ValueError(f"--freeze-extractor-steps {args.freeze_extractor_steps} is not below --max-steps "
                         f"{args.max_steps}: the extractor would never train (final/ would hold the teacher's copy); "
                         "lower it, or raise --max-steps.")
    if unknown := sorted(set(parse_config_overrides(args.config_overrides)) - set(LookWhereConfig().to_dict())):
        raise ValueError(f"--config-overrides sets {', '.join(unknown)}, which LookWhereConfig does not have.")


def grid_and_slots(args, patch: int) -> tuple[tuple[int, int], int]:
    """(the patch grid at --image-size, M: the most patches the extractor keeps), checked against --k-min/--k-max."""
    if args.image_size % patch:
        raise ValueError(f"--image-size {args.image_size} is not a multiple of the teacher's patch size {patch}.")
    grid = (args.image_size // patch, args.image_size // patch)
    if not 1 <= args.k_min <= args.k_max <= grid[0] * grid[1]:
        raise ValueError(f"Need 1 <= k_min <= k_max <= {grid[0] * grid[1]} patches, got [{args.k_min}, {args.k_max}].")
    slots = args.k_max if args.k_slots is None else args.k_slots
    if not args.k_min <= slots:
        raise ValueError(f"--k-slots {slots} is below --k-min {args.k_min}: every k would run {slots} patches.")
    return grid, slots


def validator(args, accelerator, teacher, teacher_mean, slots: int):
    """validate(student), the held-out agreement at --eval-budgets (k); None without --eval-every."""
    from .validation import HeldOutAgreement

    if not args.eval_every:
        return None
    budgets = [int(k) for k in args.eval_budgets.split(",")] if args.eval_budgets else [args.k_min, slots]
    held_out = HeldOutAgreement(args.eval_data, "k", budgets, [args.image_size], args.batch_size, args.eval_images,
                                accelerator, args.augment)

    def validate(student):
        return held_out(student, teacher, teacher_mean.validation_centre(accelerator))

    return validate


def lookwhere_loss_fn(args, teacher, grid: tuple[int, int], cache, teacher_mean):
    """loss_fn(student, batch, step_draws) for training.loop.distill: the what-where loss against the teacher."""
    from .losses import lookwhere_loss
    from .teacher import run_teacher, teacher_targets_and_map

    def loss_fn(student, batch, step_draws):
        pixel_values = batch["pixel_values"]
        def compute_targets(images):
            return run_teacher(lambda chunk: teacher_targets_and_map(teacher, chunk, grid, args.map_queries), images,
                               args.teacher_microbatch)

        teacher_cls, teacher_patches, teacher_map = (cache.serve(compute_targets, batch) if cache else
                                                     compute_targets(pixel_values))
        teacher_mean.update(teacher_cls, teacher_patches)
        output = student(pixel_values, k=step_draws["k"])
        num_prefix = output.last_hidden_state.shape[1] - grid[0] * grid[1]
        return lookwhere_loss(
            output.pooler_output, output.last_hidden_state[:, num_prefix:], output.selector_map,
            teacher_cls, teacher_patches, teacher_map, map_weight=args.map_weight,
        )

    return loss_fn


def main(argv=None) -> None:
    args = parse_args(argv)
    # heavy imports after parsing, so that --help answers at once
    from corevision_hf import lookwhere_from_teacher
    from corevision_hf.cli import reading_weights
    from corevision_hf.images import check_pixels_fit

    from .loop import distill, start, training_data
    from .schedule import draw_int
    from .teacher import TEACHER_DTYPES, load_teacher
    from .teacher_cache import teacher_cache
    from .teacher_mean import TeacherMean

    check_before_start(args)
    accelerator = start(args, SCRIPT)
    check_positive(args, "image_size", "selector_depth", "selector_image_size")
    overrides = parse_config_overrides(args.config_overrides)
    if fixed := sorted(set(overrides) & set(TEACHER_FIELDS)):
        raise ValueError(f"--config-overrides sets {', '.join(fixed)}, which the teacher fixes (the student is a copy "
                         "of it); use --selector-depth / --selector-image-size / --image-size for the selector and "
                         "size.")
    check_pixels_fit(args.image_size, args.image_size, args.batch_size, f"--image-size {args.image_size}",
                     accelerator.device)  # an impossible size is one line here, not the out-of-memory killer later
    if args.teacher_microbatch is not None and not 1 <= args.teacher_microbatch <= args.batch_size:
        raise ValueError(f"--teacher-microbatch must lie in 1..--batch-size {args.batch_size}, got "
                         f"{args.teacher_microbatch}.")

    with reading_weights(args.teacher):
        teacher = load_teacher(args.teacher).to(accelerator.device)
    student = lookwhere_from_teacher(
        teacher, selector_depth=args.selector_depth, selector_image_size=args.selector_image_size, **overrides
    )
    teacher.to(TEACHER_DTYPES[args.teacher_dtype])  # after the student copied its float32 weights
    grid, slots = grid_and_slots(args, student.config.patch_size)
    dataset, stats = training_data(accelerator, args, args.image_size)
    cache = teacher_cache(args, dataset)
    teacher_mean = TeacherMean(accelerator.device)  # the centre of the centred measures: validation, export
    validate = validator(args, accelerator, teacher, teacher_mean, slots)

    def draws(step: int) -> dict:
        return {"k": patches_kept(draw_int(args.k_min, args.k_max, args.seed, step), slots)}

    loss_fn = lookwhere_loss_fn(args, teacher, grid, cache, teacher_mean)
    distill(accelerator, args, SCRIPT, student, teacher, dataset, stats, draws, loss_fn, validate, teacher_mean)


if __name__ == "__main__":
    run_as_command(main)
