"""LookWhere-S on the sparse-recognition task (benchmarks.sparse_recognition; task_pilot uses its costs): made from the
teacher (`lookwhere_from_teacher`: the extractor the teacher, the selector its first SELECTOR_DEPTH blocks), the
budgets it is measured at (K_RATIOS; the goals' MAIN_K_RATIO) and trained at (TRAIN_K_RATIOS), the teacher it needs
(`check_teacher`), the cost of its lines and of the teacher at equal FLOPs (`line_costs`), its label-free distillation
on the training canvases (`fit_selector_map`, then `distil_student` through training.loop's `distill`), and the
photo-trained student measured beside it (`load_photo_student`, `recipe_of`)."""

import copy
import json
import os
import shutil
from pathlib import Path

import torch
import torch.nn.functional as F

from corevision_hf import lookwhere_flops, lookwhere_from_teacher
from corevision_hf.agreement import teacher_flops
from corevision_hf.lookwhere.budget_lookwhere import kept_for_ratio
from corevision_hf.outputs import files_under, record
from corevision_hf.saving import save_model_folder
from evaluation.canvases import CanvasDataset, Split
from evaluation.sparse_digits import CELL
from evaluation.teachers import equal_flops_resolution
from training.arguments import training_parser
from training.checkpointing import delete_run_files, write_json
from training.data import DataStats
from training.loop import distill, start
from training.losses import lookwhere_loss
from training.schedule import draw_int

SCRIPT = "benchmarks.sparse_recognition"  # the command that distils this student: its runs and recipe name it
K_RATIOS = (0.05, 0.1, 0.25)
MAIN_K_RATIO = 0.1  # the goals' budget; every selection runs there, the selector, random and the ceiling at all three
TRAIN_K_RATIOS = (0.05, 0.1)  # k drawn uniformly in this range each distillation step (the cheap budgets measured)
SELECTOR_DEPTH = 3  # the selector: the teacher's first 3 blocks, as in the paper
# Map-only steps of the selector before the distillation, then the selector frozen (--joint-selector: trained on, as in
# the paper). Chosen on validation canvases cut from the benchmark's own training canvases (experiments/selector_curve):
# at 154 px the selector alone keeps more of the label's cells than the teacher's own map from 25 steps on (1.22x its
# share at 100 steps); the joint distillation after it brings that back to 0.92x. 100 steps cost 20 s on 2 threads.
SELECTOR_STEPS = 100
SELECTOR_WARMUP_STEPS = 10
MAP_WEIGHT = 0.1  # training.losses.lookwhere_loss's weight of the map KL


def check_teacher(teacher) -> None:
    """The task needs a DINOv2 teacher at least as deep as the selector (its maps are attention logits, its extractor
    the whole teacher); anything else is a ValueError."""
    model_type = teacher.config.model_type
    if not model_type.startswith("dinov2"):
        raise ValueError(f"--teacher is a {model_type} model: this benchmark distils LookWhere from a DINOv2 teacher "
                         "(offline-dinov2-small, or a Dinov2Model save_pretrained folder).")
    if teacher.config.num_hidden_layers < SELECTOR_DEPTH:
        raise ValueError(f"--teacher has {teacher.config.num_hidden_layers} blocks: LookWhere's selector takes its "
                         f"first {SELECTOR_DEPTH}, so give a teacher with at least {SELECTOR_DEPTH}.")


def line_costs(args, teacher, student) -> tuple[dict, int]:
    """GFLOPs per canvas of the teacher dense and of LookWhere at each k_ratio, and the size at which the teacher
    costs what LookWhere costs at k_ratio 0.1 (with its GFLOPs)."""
    cells = (args.canvas_size // CELL) ** 2
    costs = {"dense": teacher_flops(teacher, args.canvas_size, args.canvas_size) / 1e9,
             **{r: lookwhere_flops(student.config, args.canvas_size, k=kept_for_ratio(r, cells)) / 1e9
                for r in K_RATIOS}}
    equal_size = equal_flops_resolution(teacher, costs[MAIN_K_RATIO], args.canvas_size)
    costs["equal"] = teacher_flops(teacher, equal_size, equal_size) / 1e9
    return costs, equal_size


def distil_student(args, teacher, train: list[Split], targets: list[dict], query: str, threads: int,
                   checkpoint_every: int | None = None):
    """LookWhere-S from the teacher distilled label-free on `train` by training.loop's `distill` with the teacher's
    cached targets of each canvas (`targets`, parallel to `train`), after the selector's map-only steps
    (fit_selector_map); returns (the trained model, its untrained start). `checkpoint_every`: keep a checkpoint every
    that many steps (a learning curve's points; default: the last step's only)."""
    grid = args.canvas_size // CELL
    cells = grid * grid
    # lookwhere_from_teacher resizes the map with antialiasing: every map-head cell learns
    student = lookwhere_from_teacher(teacher, selector_depth=SELECTOR_DEPTH, selector_image_size=args.selector_size,
                                     extractor_prefix=args.extractor_prefix)
    untrained = copy.deepcopy(student).eval()
    cls = torch.cat([t["cls"] for t in targets])
    patches = torch.cat([t["patches"] for t in targets])
    maps = torch.cat([t["maps"][query] for t in targets])
    fit_selector_map(student.selector, CanvasDataset(train, DataStats()), maps, args)
    k_min, k_max = kept_for_ratio(TRAIN_K_RATIOS[0], cells), kept_for_ratio(TRAIN_K_RATIOS[1], cells)
    if args.steps == 0:  # the extractor stays the teacher's copy
        save_student(args, student, {"k_min": k_min, "k_max": k_max, "map_queries": query})
        return student.float().eval(), untrained
    frozen_selector = args.selector_steps > 0 and not args.joint_selector
    student.selector.requires_grad_(not frozen_selector)
    run_args = training_parser(__doc__, lr=args.lr, min_lr=args.lr / 100, weight_decay=0.05).parse_args([
        "--teacher", args.teacher, "--data", "sparse-recognition canvases", "--output-dir", str(args.scratch_dir),
        "--overwrite", "--batch-size", str(args.batch_size), "--max-steps", str(args.steps),
        "--warmup-steps", str(max(1, args.steps // 10)), "--checkpoint-every", str(checkpoint_every or args.steps),
        "--keep-checkpoints", str(args.steps // (checkpoint_every or args.steps)), "--log-with", "none",
        "--seed", str(args.seed), "--num-workers", "0",
        "--log-every", str(max(1, args.steps // 5)),
    ])
    run_args.k_min, run_args.k_max, run_args.map_queries = k_min, k_max, query
    # with the selector frozen, nothing would train while the extractor is frozen too
    run_args.freeze_extractor_steps = 0 if frozen_selector else args.freeze_extractor_steps
    run_args.extractor_warmup_steps = args.extractor_warmup_steps
    accelerator = start(run_args, SCRIPT)

    def loss_fn(model, batch, step_draws):
        index = batch["index"]
        output = model(batch["pixel_values"], k=step_draws["k"])
        return lookwhere_loss(output.pooler_output, output.last_hidden_state[:, -cells:], output.selector_map,
                              cls[index], patches[index].float(), maps[index])

    stats = DataStats()
    distill(accelerator, run_args, SCRIPT, student, teacher, CanvasDataset(train, stats),
            stats, lambda step: {"k": draw_int(k_min, k_max, args.seed, step)}, loss_fn)
    torch.set_num_threads(threads)  # the loop's start may set its own
    trained = type(student).from_pretrained(str(args.scratch_dir / "final")).float().eval()
    return trained, untrained


def save_student(args, student, recorded: dict) -> None:
    """--steps 0: the student saved where a distillation run exports it, --scratch-dir/final (what make tasks' model
    card reads), with a training_recipe.json of this benchmark's arguments and `recorded`; written under a temporary
    name and renamed when complete, after the earlier run's files are cleared (as --overwrite clears them)."""
    delete_run_files(str(args.scratch_dir))
    partial = args.scratch_dir / "final.partial"
    if partial.exists():
        shutil.rmtree(partial)  # left by a run that died while saving
    save_model_folder(student, partial)
    arguments = {key: str(value) if isinstance(value, Path) else value for key, value in vars(args).items()
                 if key not in ("argv", "pilot_record")}
    write_json(str(partial / "training_recipe.json"), {
        "script": SCRIPT, "method": "lookwhere", "teacher": args.teacher,
        "data": "sparse-recognition canvases", "steps": 0, "selector_steps": args.selector_steps,
        "command": f"python -m {SCRIPT} " + " ".join(args.argv), "args": {**arguments, **recorded}})
    record(str(partial), files_under(str(partial)))  # as training.checkpointing.export marks its folders
    os.replace(partial, args.scratch_dir / "final")


def fit_selector_map(selector: torch.nn.Module, dataset: CanvasDataset, maps: torch.Tensor, args) -> None:
    """The selector alone (its blocks, prefix tokens, position table and map head) trained for `args.selector_steps`
    steps on the map loss alone: the distillation's KL to the teacher's map (`maps`, (N, G * G), one per canvas of
    `dataset`) at its weight, AdamW at `args.lr` after a 10-step linear warm-up, gradients clipped to norm 1, batches
    of `args.batch_size` canvases drawn with replacement from a generator seeded with `args.seed`."""
    if args.selector_steps == 0:
        return
    grid = (args.canvas_size // CELL,) * 2
    optimizer = torch.optim.AdamW(selector.parameters(), lr=args.lr, weight_decay=0.05)
    generator = torch.Generator().manual_seed(args.seed)
    selector.train()
    for step in range(args.selector_steps):
        for group in optimizer.param_groups:
            group["lr"] = args.lr * min(1.0, (step + 1) / SELECTOR_WARMUP_STEPS)
        index = torch.randint(len(dataset), (args.batch_size,), generator=generator)
        pixels = torch.stack([dataset[int(i)]["pixel_values"] for i in index])
        _, logits = selector(pixels, grid, None)
        loss = MAP_WEIGHT * F.kl_div(F.log_softmax(logits.float(), dim=-1), F.log_softmax(maps[index].float(), dim=-1),
                                     log_target=True, reduction="batchmean")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(selector.parameters(), 1.0)
        optimizer.step()


def load_photo_student(folder: Path, teacher):
    """The --photo-student folder as a float32 LookWhere model in eval mode; a ValueError naming it when it is not one
    of the teacher's width."""
    from corevision_hf import LookWhereModel

    config = folder / "config.json"
    model_type = json.loads(config.read_text()).get("model_type") if config.is_file() else None
    if model_type != "lookwhere":
        held = "no config.json" if model_type is None else f"a {model_type} model"
        raise ValueError(f"--photo-student {folder} holds {held}, not a LookWhere one: give make quality's "
                         "outputs/distill_quality/seed0/"
                         "LookWhere-S_from_teacher/best or another LookWhere save_pretrained folder.")
    try:
        model = LookWhereModel.from_pretrained(str(folder)).float().eval()
    except (OSError, ValueError) as error:
        raise ValueError(f"--photo-student {folder}: {error} (give a LookWhere save_pretrained folder, "
                         "e.g. make quality's outputs/distill_quality/seed0/LookWhere-S_from_teacher/best)") from None
    if model.config.hidden_size != teacher.config.hidden_size:
        raise ValueError(f"--photo-student {folder} has width {model.config.hidden_size}, the teacher "
                         f"{teacher.config.hidden_size}: give a student distilled from this teacher.")
    return model


def recipe_of(folder: Path) -> dict | None:
    """What a training run recorded beside its export (training_recipe.json: map target, k range, steps), if any."""
    recipe = folder / "training_recipe.json"
    if not recipe.is_file():
        return None
    keep = ("map_queries", "k_min", "k_max", "max_steps", "lr", "freeze_extractor_steps", "command")
    data = json.loads(recipe.read_text())
    flat = {**data, **data.get("args", {})} if isinstance(data.get("args"), dict) else data
    return {key: flat[key] for key in keep if key in flat}
