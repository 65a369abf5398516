"""Distill a budget-adjustable VECA from a frozen teacher, with Accelerate.

    accelerate launch -m training.distill_veca --recipe veca-pretrain --data /path/to/images --eval-data /path/to/val
    accelerate launch -m training.distill_veca --recipe veca-multires --init-from runs/veca-b/best --data ... --eval-data ...
    python -m training.distill_veca --teacher facebook/dinov3-vitb16-pretrain-lvd1689m --data /path/to/images \
        --preset small --image-size 224 --batch-size 64 --max-steps 100000
    python -m training.distill_veca --teacher facebook/dinov2-small --init-from-teacher --data /path/to/images ...

One core budget per optimisation step (nested dropout), drawn from the config's budgets and weights as a function
of (seed, step) alone, so every process of a distributed run uses the same one; likewise the resolution of a step,
from the phase of --resolutions it falls in, each resolution with its own crops and batch size. Loss: CLS cosine +
patch cosine + patch MSE against the teacher's final tokens (CLS = token 0, patches = the last Hp * Wp). The loop
(data per process, schedule, guarded update, validation, checkpoints, resume, export) is training.loop's. DDP, FSDP
and DeepSpeed are chosen by the `accelerate launch --config_file` alone (see training/configs/). The final export is
a hub-ready folder: `AutoModel.from_pretrained(OUT/final, trust_remote_code=True)`.
"""

import argparse
import math

from .arguments import check_positive, parse, parse_config_overrides, run_as_command, training_parser

SCRIPT = "training.distill_veca"


def parse_args(argv=None) -> argparse.Namespace:
    parser = training_parser(__doc__, lr=4e-4, min_lr=5e-5, weight_decay=0.015)
    parser.add_argument("--preset", default=None,
                        help="VECA size: small, splus, base, large (default small; with --init-from, its own; with "
                             "--init-from-teacher, the teacher's)")
    parser.add_argument("--config-overrides", default="{}", help='JSON of VecaConfig fields, e.g. {"num_hidden_layers": 6}')
    parser.add_argument("--init-from", default=None,
                        help="start from this VECA's weights (a save_pretrained folder, e.g. a stage-1 OUT/best); "
                             "fresh optimiser and schedule")
    parser.add_argument("--patch-embed-from-teacher", action=argparse.BooleanOptionalAction, default=False,
                        help="start the patch embedding from the teacher's when their shapes match")
    parser.add_argument("--init-from-teacher", action=argparse.BooleanOptionalAction, default=False,
                        help="start from the teacher's weights (a DINOv2 / DINOv3 ViT): its architecture, patch "
                             "embedding, norms, attention and MLP; new core bank and coordinate heads "
                             "(corevision_hf.veca_from_teacher; --config-overrides for the rest, e.g. num_cores)")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--resolutions", default=None,
                        help='resolutions drawn per step, "size:weight,..."; phases after ";" start at a step: '
                             '"256:.35,384:.35;7000=256:.15,768:.3" (default: --image-size)')
    parser.add_argument("--batch-sizes", default=None, help='per resolution, "size:n,..." (default: --batch-size)')
    parser.add_argument("--teacher-microbatch", default=None,
                        help='images per teacher forward, "n" or per resolution "size:n,..." (default: the batch)')
    parser.add_argument("--dense-weight", type=float, default=1.0, help="weight of the patch terms")
    parser.add_argument("--mse-weight", type=float, default=1.0, help="weight of the patch MSE within them")
    parser.add_argument("--eval-budgets", default=None, help='core budgets validated, "8,16,..." (default: the bank)')
    parser.add_argument("--eval-resolutions", default=None, help='sizes validated, "256,512" (default: the trained ones)')
    return parse(parser, argv, SCRIPT)


def parse_resolutions(args) -> list[tuple[int, list[int], list[float]]]:
    """--resolutions -> phases [(first step, sizes, weights), ...]; "256:1,384:2" is one phase from step 0. Without
    it, [(0, [--image-size], [1.0])]."""
    if not args.resolutions:
        return [(0, [args.image_size], [1.0])]
    phases = []
    try:
        for index, text in enumerate(args.resolutions.split(";")):
            first, _, pairs = text.rpartition("=") if index else ("0", "", text)
            items = [item.split(":") for item in pairs.split(",")]
            phases.append((int(first), [int(size) for size, _ in items], [float(weight) for _, weight in items]))
    except ValueError:
        phases = []
    starts = [first for first, _, _ in phases]
    if (not phases or starts != sorted(set(starts))  # a NaN or infinite weight is no positive number either
            or any(not (size > 0 and 0 < weight < math.inf) for _, sizes, weights in phases
                   for size, weight in zip(sizes, weights))
            or any(sum(weights) == math.inf for _, _, weights in phases)):  # the draw divides by it
        raise ValueError(
            f'--resolutions {args.resolutions!r}: expected "size:weight,..." with positive numbers (each phase\'s sum '
            'finite), and later phases as ";STEP=size:weight,..." with increasing steps, e.g. '
            '"256:1,384:1;7000=256:1,768:1".'
        )
    for first, sizes, _ in phases:
        if len(set(sizes)) < len(sizes):
            repeated = sorted({size for size in sizes if sizes.count(size) > 1})
            raise ValueError(f"--resolutions {args.resolutions!r}: the phase from step {first} names {repeated} twice; "
                             "give each size once, with the sum of its weights.")
        if first >= args.max_steps:
            raise ValueError(f"--resolutions {args.resolutions!r}: the phase from step {first} starts at or after "
                             f"--max-steps {args.max_steps}, so it would never run; raise --max-steps or drop it.")
    return phases


def per_resolution(text: str | None, name: str, sizes: list[int], default: int | None) -> dict[int, int | None]:
    """ "n" or "size:n,..." -> {size: n} for every size in `sizes` (missing ones: `default`)."""
    if not text:
        return dict.fromkeys(sizes, default)
    try:
        if ":" not in text:
            values = dict.fromkeys(sizes, int(text))
        else:
            values = {int(size): int(n) for size, n in (item.split(":") for item in text.split(","))}
    except ValueError:
        values = {}
    if not values or any(n <= 0 for n in values.values()) or set(values) - set(sizes):
        raise ValueError(f'--{name} {text!r}: expected a positive "n" or "size:n,..." for the sizes {sizes}.')
    return {size: values.get(size, default) for size in sizes}


def resolution_batches(args, phases: list, device) -> tuple[list[int], dict, dict]:
    """(the trained sizes, the batch size per size, the teacher micro-batch per size), each size checked to fit."""
    from corevision_hf.images import check_pixels_fit

    sizes = sorted({size for _, phase_sizes, _ in phases for size in phase_sizes})
    batch_sizes = per_resolution(args.batch_sizes, "batch-sizes", sizes, args.batch_size)
    for size in sizes:  # an impossible size is one line here, not the out-of-memory killer later
        check_pixels_fit(size, size, batch_sizes[size], f"Resolution {size}", device)
    microbatches = per_resolution(args.teacher_microbatch, "teacher-microbatch", sizes, None)
    too_large = [size for size in sizes if microbatches[size] and microbatches[size] > batch_sizes[size]]
    if too_large:
        raise ValueError(f"--teacher-microbatch is larger than the batch at {too_large} px: at most the batch size.")
    return sizes, batch_sizes, microbatches


def check_starts(args, sizes: list[int]) -> None:
    """Raises ValueError for two starting points at once, or a teacher cache with more than one resolution."""
    if args.init_from_teacher and args.init_from:
        raise ValueError("--init-from-teacher starts from the teacher's weights, --init-from from a VECA's: "
                         "choose one.")
    if args.teacher_cache and len(sizes) > 1:
        raise ValueError("--teacher-cache needs one resolution (its targets are per image and size): drop "
                         "--resolutions.")


def build_student(args, accelerator, teacher, overrides: dict, sizes: list[int]) -> tuple:
    """(student, its config): from the teacher, from --init-from or new from --preset; sizes checked by its patch."""
    from corevision_hf import VecaConfig, VecaModel, veca_from_teacher
    from corevision_hf.cli import reading_weights

    from .teacher import copy_patch_embedding, load_init

    if args.init_from_teacher:
        student = veca_from_teacher(teacher, **overrides).float()  # float32 weights whatever --teacher-dtype
        config = student.config
        accelerator.print(f"copied from the teacher: {', '.join(config.init_from_teacher['copied'])}")
        accelerator.print(f"new: {', '.join(config.init_from_teacher['new'])}")
    elif args.init_from:
        with reading_weights(args.init_from):
            student = load_init(args.init_from, VecaModel, args.preset, overrides, teacher.config.hidden_size)
        config = student.config
    else:
        config = VecaConfig.from_preset(args.preset or "small", **overrides)
        if teacher.config.hidden_size != config.hidden_size and not config.output_projection_size:
            config.output_projection_size = teacher.config.hidden_size  # student -> teacher width for the loss
        student = VecaModel(config)
    for size in sizes:
        if size % config.patch_size:
            raise ValueError(f"Resolution {size} is not a multiple of the student's patch size {config.patch_size}.")
    if args.patch_embed_from_teacher and not (args.init_from or args.init_from_teacher):
        accelerator.print(copy_patch_embedding(teacher, student.embeddings.patch_embeddings.projection))
    return student, config


def resolution_data(accelerator, args, sizes: list[int], batch_sizes: dict) -> tuple[dict, list]:
    """({size: (this process's training images, batch size)}, each size's data stats)."""
    from .loop import training_data

    streams = {}
    for size in sizes:
        streams[size] = training_data(accelerator, args, size), batch_sizes[size]
    stats = [data_stats for (_, data_stats), _ in streams.values()]
    dataset = {size: (data, batch_size) for size, ((data, _), batch_size) in streams.items()}
    return dataset, stats


def validator(args, accelerator, teacher, teacher_mean, config, sizes: list[int]):
    """validate(student), the held-out agreement at --eval-budgets and --eval-resolutions; None without --eval-every."""
    from .validation import HeldOutAgreement

    if not args.eval_every:
        return None
    budgets = [int(b) for b in args.eval_budgets.split(",")] if args.eval_budgets else [config.num_cores]
    eval_sizes = [int(s) for s in args.eval_resolutions.split(",")] if args.eval_resolutions else sizes
    held_out = HeldOutAgreement(args.eval_data, "num_cores", budgets, eval_sizes, args.batch_size,
                                args.eval_images, accelerator, args.augment)

    def validate(student):
        return held_out(student, teacher, teacher_mean.validation_centre(accelerator))

    return validate


def veca_loss_fn(args, teacher, config, microbatches: dict, cache, teacher_mean):
    """loss_fn(student, batch, step_draws) for training.loop.distill: the VECA loss against the teacher's targets."""
    from .losses import veca_loss
    from .teacher import run_teacher, teacher_input, teacher_patch_size, teacher_targets

    teacher_patch = teacher_patch_size(teacher)

    def loss_fn(student, batch, step_draws):
        size, num_cores = step_draws["resolution"], step_draws["num_cores"]
        pixel_values = batch["pixel_values"]
        grid = (size // config.patch_size, size // config.patch_size)

        def compute_targets(images):
            return run_teacher(
                lambda chunk: teacher_targets(teacher, teacher_input(chunk, teacher_patch, config.patch_size), grid,
                                              check_finite=False),  # the loop's loss guard sees a non-finite target
                images, microbatches[size],
            )

        teacher_cls, teacher_patches = cache.serve(compute_targets, batch) if cache else compute_targets(pixel_values)
        teacher_mean.update(teacher_cls, teacher_patches)
        output = student(pixel_values, num_cores=num_cores)
        return veca_loss(
            output.pooler_output, output.last_hidden_state[:, num_cores:], teacher_cls, teacher_patches,
            args.dense_weight, args.mse_weight,
        )

    return loss_fn


def main(argv=None) -> None:
    args = parse_args(argv)
    # heavy imports after parsing, so that --help answers at once
    from corevision_hf.cli import reading_weights

    from .loop import distill, start
    from .schedule import draw
    from .teacher import TEACHER_DTYPES, load_teacher
    from .teacher_cache import teacher_cache
    from .teacher_mean import TeacherMean

    accelerator = start(args, SCRIPT)
    check_positive(args, "image_size")
    phases = parse_resolutions(args)
    sizes, batch_sizes, microbatches = resolution_batches(args, phases, accelerator.device)
    overrides = parse_config_overrides(args.config_overrides)
    check_starts(args, sizes)

    # Data, teacher and student are all checked before the first step.
    with reading_weights(args.teacher):
        teacher = load_teacher(args.teacher, TEACHER_DTYPES[args.teacher_dtype]).to(accelerator.device)
    student, config = build_student(args, accelerator, teacher, overrides, sizes)
    dataset, stats = resolution_data(accelerator, args, sizes, batch_sizes)
    cache = teacher_cache(args, dataset[sizes[0]][0])
    teacher_mean = TeacherMean(accelerator.device)  # the centre of the centred measures: validation, export
    validate = validator(args, accelerator, teacher, teacher_mean, config, sizes)

    def draws(step: int) -> dict:
        _, phase_sizes, weights = [phase for phase in phases if phase[0] <= step][-1]
        return {
            "num_cores": draw(config.training_budgets, config.training_budget_weights, args.seed, step),
            "resolution": draw(phase_sizes, weights, args.seed + 1, step),
        }

    loss_fn = veca_loss_fn(args, teacher, config, microbatches, cache, teacher_mean)
    distill(accelerator, args, SCRIPT, student, teacher, dataset, stats, draws, loss_fn, validate, teacher_mean)


if __name__ == "__main__":
    run_as_command(main)
