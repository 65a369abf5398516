"""Distill a budget-adjustable VECA from a frozen teacher, with Accelerate.

    accelerate launch -m training.distill_veca --teacher facebook/dinov3-vitb16-pretrain-lvd1689m \
        --data /path/to/images --preset base --image-size 256 --batch-size 128 --max-steps 100000

One core budget per optimisation step (nested dropout), drawn from the config's budgets and weights as a function
of (seed, step) alone, so every process of a distributed run uses the same one. Loss: CLS cosine + patch cosine +
patch MSE against the teacher's final tokens (CLS = token 0, patches = the last Hp * Wp). The loop (data per process,
schedule, guarded update, checkpoints, resume, export) is training.loop's. DDP, FSDP and DeepSpeed are chosen by
the `accelerate launch --config_file` alone (see training/configs/). The final export is a hub-ready folder:
`AutoModel.from_pretrained(OUT/final, trust_remote_code=True)`.
"""

import argparse
import json
import sys

if __package__ in (None, ""):  # run as a file (the command from before training/ became a package): say the new one
    import shlex

    print(f"error: training/ is a package; from the repository root run: python -m training.distill_veca "
          f"{shlex.join(sys.argv[1:])} (or: accelerate launch [options] -m training.distill_veca ...)",
          file=sys.stderr)
    sys.exit(2)

from .arguments import check_positive, run_cli, training_parser  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    parser = training_parser(__doc__, lr=4e-4, min_lr=5e-5, weight_decay=0.015)
    parser.add_argument("--preset", default="small", help="VECA size: small, splus, base, large")
    parser.add_argument("--config-overrides", default="{}", help='JSON of VecaConfig fields, e.g. {"num_hidden_layers": 6}')
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--resolutions", default=None,
                        help='multi-resolution stage: "256:1,384:1,512:1" (size:weight), one size drawn per step')
    parser.add_argument("--dense-weight", type=float, default=1.0, help="weight of the patch terms")
    parser.add_argument("--mse-weight", type=float, default=1.0, help="weight of the patch MSE within them")
    parser.add_argument("--teacher-cache", type=int, default=0, metavar="CYCLE",
                        help="reuse teacher targets: crops repeat every CYCLE epochs, targets computed once (0: off)")
    return parser.parse_args(argv)


def parse_resolutions(args) -> list[tuple[int, float]]:
    """--resolutions "256:1,384:2" -> [(256, 1.0), (384, 2.0)]; without it, [(--image-size, 1.0)]."""
    if not args.resolutions:
        return [(args.image_size, 1.0)]
    try:
        items = (item.split(":") for item in args.resolutions.split(","))
        pairs = [(int(size), float(weight)) for size, weight in items]
    except ValueError:
        pairs = []
    if not pairs or any(size <= 0 or weight <= 0 for size, weight in pairs):
        raise ValueError(
            f'--resolutions {args.resolutions!r}: expected "size:weight,..." with positive numbers, e.g. "256:1,384:1".'
        )
    return pairs


def main(argv=None) -> None:
    args = parse_args(argv)
    # heavy imports after parsing, so that --help answers at once
    import torch.nn.functional as F
    from .data import build_dataset
    from .loop import distill, start
    from .losses import veca_loss
    from .schedule import draw
    from .teacher import load_teacher, teacher_input, teacher_patch_size, teacher_targets
    from .teacher_cache import TeacherCache

    from corevision_hf import VecaConfig, VecaModel

    accelerator = start(args, "training.distill_veca")
    check_positive(args, "image_size")
    resolutions = parse_resolutions(args)
    try:
        overrides = json.loads(args.config_overrides)
    except json.JSONDecodeError as error:
        raise ValueError(
            f"--config-overrides is not valid JSON ({error}): e.g. '{{\"num_hidden_layers\": 6}}'."
        ) from None
    if args.teacher_cache and (args.resolutions or args.streaming):
        raise ValueError(
            "--teacher-cache needs one resolution and a map-style dataset (not --resolutions / --streaming)."
        )

    # Data, teacher and student are all checked before the first step.
    dataset, stats = build_dataset(
        args.data, streaming=args.streaming, image_size=max(size for size, _ in resolutions), seed=args.seed,
        process_index=accelerator.process_index, num_processes=accelerator.num_processes,
    )
    teacher = load_teacher(args.teacher).to(accelerator.device)
    teacher_patch = teacher_patch_size(teacher)
    config = VecaConfig.from_preset(args.preset, **overrides)
    for size, _ in resolutions:
        if size % config.patch_size:
            raise ValueError(f"Resolution {size} is not a multiple of the student's patch size {config.patch_size}.")
    if teacher.config.hidden_size != config.hidden_size and not config.output_projection_size:
        config.output_projection_size = teacher.config.hidden_size  # student -> teacher width for the loss
    student = VecaModel(config)
    cache = None
    if args.teacher_cache:
        fingerprint = {"teacher": args.teacher, "data": args.data, "image_size": args.image_size, "seed": args.seed}
        cache = TeacherCache(f"{args.output_dir}/teacher_cache", args.teacher_cache, fingerprint)
        epoch_set = dataset.set_epoch
        dataset.set_epoch = lambda epoch: epoch_set(cache.crop_epoch(epoch))  # crops repeat every CYCLE epochs

    def draws(step: int) -> dict:
        return {
            "num_cores": draw(config.training_budgets, config.training_budget_weights, args.seed, step),
            "resolution": draw([s for s, _ in resolutions], [w for _, w in resolutions], args.seed + 1, step),
        }

    def loss_fn(student, batch, step_draws):
        size, num_cores = step_draws["resolution"], step_draws["num_cores"]
        pixel_values = batch["pixel_values"]
        if size != pixel_values.shape[-1]:
            pixel_values = F.interpolate(pixel_values, size=(size, size), mode="bilinear", antialias=True)
        grid = (size // config.patch_size, size // config.patch_size)

        def compute_targets(images):
            return teacher_targets(teacher, teacher_input(images, teacher_patch, config.patch_size), grid)

        if cache:
            teacher_cls, teacher_patches = cache.targets(
                compute_targets, pixel_values, batch["index"], cache.crop_epoch(batch["epoch"])
            )
        else:
            teacher_cls, teacher_patches = compute_targets(pixel_values)
        output = student(pixel_values, num_cores=num_cores)
        return veca_loss(
            output.pooler_output, output.last_hidden_state[:, num_cores:], teacher_cls, teacher_patches,
            args.dense_weight, args.mse_weight,
        )

    distill(accelerator, args, "training.distill_veca", student, teacher, dataset, stats, draws, loss_fn)


if __name__ == "__main__":
    run_cli(main)
