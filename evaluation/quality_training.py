"""How the quality benchmark (benchmarks.distill_quality) trains its students on the photos: a folder of copies of the
training photos (`prepare_train_folder`), random resized crops of them per seed (`training_dataset`), the teacher's
targets of every crop a seed's students will see, cached before any trains (`teacher_cache`, `fill_teacher_cache`;
their mean is the centre of the centred measures, `mean_teacher_tokens`), and one student through training.loop's
`distill` with the validation photos choosing its step (`train`). VECA from the teacher is issue #67's conversion: its
bank seeded from the teacher's tokens of the seed's first crops (`seeding_crops`), stage 1 (attention transfer) on the
seed's crops in order (`crop_batches`), then stage 2 as its step loss through `distill`, like every student; the
per-block table (training.conversion) on the validation photos at its start, after stage 1 and at its chosen step."""

import hashlib
import json
import math
import shutil
import statistics
import sys
import time
from pathlib import Path

import torch

from evaluation.quality_students import NUM_CORES, STUDENTS, validation_budgets
from training.arguments import training_parser
from training.conversion import attention_transfer, table_record, teacher_targets
from training.checkpointing import write_json
from training.data import build_dataset
from training.data import image_files as training_image_files  # (refuses held-out photos)
from training.loop import distill, start
from training.teacher import teacher_targets_and_map
from training.teacher_cache import TeacherCache
from training.teacher_mean import TeacherMean
from training.validation import HeldOutAgreement

SCRIPT = "benchmarks.distill_quality"  # the command that trains these students: their runs and recipes name it


def command(argv) -> str:
    """The benchmark's command line (`argv`: its arguments; None: this process's)."""
    return " ".join(["python", "-m", SCRIPT, *(sys.argv[1:] if argv is None else argv)])


def prepare_train_folder(scratch: Path, sources: list[Path], copies: int) -> tuple[Path, list[str]]:
    """`copies` copies of every training photo in one folder (one index per copy: each gets crops of its own). The
    sources are listed by training.data, which refuses held-out photos (also renamed copies) before anything is
    copied."""
    photos = [Path(p) for source in sources for p in training_image_files(Path(source), "none")[0]]
    train_dir = scratch / "train_photos"
    shutil.rmtree(train_dir, ignore_errors=True)  # the same copies again on --resume
    train_dir.mkdir(parents=True)
    for index, photo in enumerate(photos):
        for copy in range(copies):
            shutil.copy(photo, train_dir / f"{index:03d}_{photo.stem}_{copy}{photo.suffix}")
    return train_dir, [f"{p.parent.name}/{p.name}" for p in photos]


def training_dataset(train_dir: Path, args, seed: int, cache: TeacherCache) -> tuple:
    """The training photos' dataset of a seed: random resized crops of --crop-scale..1 of the full-resolution photos
    (and flips) at --image-size, repeating every --crop-cycle epochs (the cache's)."""
    dataset, data_stats = build_dataset(str(train_dir), image_size=args.image_size, scale=(args.crop_scale, 1.0),
                                        seed=seed)
    epoch_set = dataset.set_epoch
    dataset.set_epoch = lambda epoch: epoch_set(cache.crop_epoch(epoch))
    dataset.set_crop_epoch = epoch_set
    return dataset, data_stats


def crop_batches(dataset, batch_size: int, cycle: int):
    """batch(step) -> (batch_size, 3, S, S): the seed's crops in order, crop epoch after crop epoch (repeating every
    `cycle`), `batch_size` a step; unreadable photos skipped."""
    def batch(step: int) -> torch.Tensor:
        positions = range(step * batch_size, (step + 1) * batch_size)
        pixels = []
        for position in positions:
            dataset.set_crop_epoch(position // len(dataset) % cycle)
            item = dataset[position % len(dataset)]
            if item["pixel_values"] is not None:
                pixels.append(item["pixel_values"])
        return torch.stack(pixels)
    return batch


def seeding_crops(train_dir: Path, args, seed: int, cache: TeacherCache) -> list[torch.Tensor]:
    """The batches VECA from the teacher seeds its bank from: the seed's first crop epoch, 16 crops a batch."""
    dataset, _ = training_dataset(train_dir, args, seed, cache)
    dataset.set_crop_epoch(0)
    batches = []
    for first in range(0, len(dataset), 16):
        pixels = [pixels for pixels in dataset[first : first + 16]["pixel_values"] if pixels is not None]
        batches += [torch.stack(pixels)] if pixels else []
    return batches


def validation_pixels(args) -> torch.Tensor:
    """(M, 3, S, S): the validation photos at the training size, resized and centre-cropped as validation reads
    them; where VECA from the teacher's per-block table is measured."""
    dataset, _ = build_dataset(str(args.val_photos), image_size=args.image_size, train=False)
    return torch.stack([item["pixel_values"] for item in dataset if item["pixel_values"] is not None])


TABLE_BUDGETS = [8, NUM_CORES]  # where VECA from the teacher's per-block table is measured


def stage1(student, teacher, train_dir: Path, args, seed: int, cache: TeacherCache, val: torch.Tensor,
           targets: dict) -> dict:
    """VECA from the teacher's stage 1 (training.conversion's `attention_transfer`: the copied weights frozen, the bank
    and coordinate heads learn each block's attention branch) for --stage1-steps at --stage1-lr on the seed's crops
    in order, a --batch-size a step; the per-block table at TABLE_BUDGETS on the validation photos `val` (the
    teacher's `targets` of them) before and after. Returns its record."""
    print("      the copy, its bank seeded from the teacher's tokens: per-block table on the validation photos",
          flush=True)
    record = {"start": table_record(student, teacher, targets, val, TABLE_BUDGETS, print)}
    if not args.stage1_steps:
        return record
    began = time.perf_counter()
    dataset, _ = training_dataset(train_dir, args, seed, cache)
    losses = attention_transfer(student, teacher, crop_batches(dataset, args.batch_size, cache.cycle),
                                args.stage1_steps, args.stage1_lr, seed, lambda line: print("      " + line, flush=True))
    record["stage1"] = {"steps": args.stage1_steps, "lr": args.stage1_lr, "time_s": time.perf_counter() - began,
                        "loss_first": losses[0], "loss_last": losses[-1],
                        **table_record(student, teacher, targets, val, TABLE_BUDGETS, print)}
    return record


def teacher_cache(scratch: Path, seed: int, args, source: str, train_names: list[str]) -> TeacherCache:
    """The cache of a seed's crops' teacher targets under `scratch`, keyed by the teacher, the crop size, the map
    target, the seed, the copies and the training photos."""
    fingerprint = {"teacher": source, "image_size": args.image_size, "map_queries": args.map_queries, "seed": seed,
                   "copies": args.copies, "photos": hashlib.sha256("\n".join(train_names).encode()).hexdigest()[:16]}
    return TeacherCache(str(scratch / f"seed{seed}" / "teacher_cache"), args.crop_cycle, fingerprint)


def cached_targets(teacher, grid: tuple[int, int], map_queries: str):
    """The teacher's targets of a batch as the cache keeps them: CLS, patches, the attention map of `map_queries`,
    rounded to float16 as the cache stores them, and each crop's pixel sum (checked against the batch that reads
    them)."""
    def compute(pixel_values):
        targets = teacher_targets_and_map(teacher, pixel_values, grid, map_queries)
        return (*(t.half().float() for t in targets), pixel_values.sum((1, 2, 3)))
    return compute


def fill_teacher_cache(cache: TeacherCache, teacher, train_dir: Path, args, seed: int) -> int:
    """The teacher's targets for every crop a seed's students will see, computed before any trains (so that the
    centre, the mean over all of them, is known first). Returns the crops."""
    dataset, _ = training_dataset(train_dir, args, seed, cache)
    epochs = min(cache.cycle, math.ceil(args.steps * args.batch_size / len(dataset)))
    compute = cached_targets(teacher, (args.image_size // 14, args.image_size // 14), args.map_queries)
    start = last_print = time.perf_counter()
    for epoch in range(epochs):
        dataset.set_crop_epoch(epoch)
        for first in range(0, len(dataset), 16):
            items = dataset[first : first + 16]
            kept = [i for i, pixels in enumerate(items["pixel_values"]) if pixels is not None]  # unreadable: skipped
            pixel_values = torch.stack([items["pixel_values"][i] for i in kept])
            cache.targets(compute, pixel_values, torch.tensor([items["index"][i] for i in kept]), epoch)
        if time.perf_counter() - last_print >= 10 or epoch == epochs - 1:  # minutes in all: a line every 10 s or so
            last_print = time.perf_counter()
            print(f"    teacher targets, seed {seed}: crop epoch {epoch + 1}/{epochs} "
                  f"({(epoch + 1) * len(dataset)} crops, {last_print - start:.0f} s)", flush=True)
    return epochs * len(dataset)


def mean_teacher_tokens(caches: list[Path]) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The mean teacher CLS token and the mean patch token over every cached training crop: (D,), (D,), crops."""
    from safetensors.torch import load_file

    cls_sum, patch_sum, crops, patches = 0.0, 0.0, 0, 0
    for folder in caches:
        for file in sorted(folder.glob("*.safetensors")):
            stored = load_file(file)
            cls_sum = cls_sum + stored["0"].double()
            patch_sum = patch_sum + stored["1"].double().sum(0)
            crops, patches = crops + 1, patches + stored["1"].shape[0]
    return (cls_sum / crops).float(), (patch_sum / patches).float(), crops


def run_arguments(name: str, lr: float, train_dir: Path, args, seed: int, steps: int, output_dir: Path):
    """training.loop's arguments for one student of this benchmark: its rate, steps, data and validation photos, and
    the recipe fields its model card reads."""
    run_args = training_parser(__doc__, lr=lr, min_lr=lr / 100, weight_decay=args.weight_decay).parse_args([
        "--teacher", args.teacher, "--data", str(train_dir), "--output-dir", str(output_dir),
        "--batch-size", str(args.batch_size), "--max-steps", str(steps), "--warmup-steps", str(max(1, steps // 10)),
        "--max-grad-norm", str(args.max_grad_norm), "--checkpoint-every", str(steps), "--keep-checkpoints", "1",
        "--log-with", "none", "--seed", str(seed), "--num-workers", "0", "--eval-every", str(args.eval_every),
        "--eval-data", str(args.val_photos),
    ])
    if STUDENTS[name][0] == "lookwhere":  # its recipe records the k range and map target (the model card reads them)
        run_args.k_min, run_args.k_max, run_args.map_queries = args.k_min, args.k_max, args.map_queries
    if name == "LookWhere-S from teacher":
        run_args.freeze_extractor_steps = args.freeze_extractor_steps
        run_args.extractor_warmup_steps = args.extractor_warmup_steps
    return run_args


def train(name: str, student, step_loss, draws, lr: float, train_dir: Path, teacher, cache: TeacherCache, args,
          seed: int, steps: int, output_dir: Path, centre: tuple) -> tuple:
    """One student through training.loop's `distill` at peak `lr` for `steps` steps; the teacher's targets come from
    `cache` (filled before any student trains, `fill_teacher_cache`). Every --eval-every steps the validation photos
    score it (centred agreement against `centre`, over every budget it is measured at) and the best step is exported
    to OUT/best. Returns (the best step's student, its training record)."""
    run_args = run_arguments(name, lr, train_dir, args, seed, steps, output_dir)
    accelerator = start(run_args, SCRIPT)
    started = time.perf_counter()
    conversion = None
    if name == "VECA from teacher":  # its per-block table: on the validation photos, the teacher run on them once
        val = validation_pixels(args)
        val_targets = teacher_targets(teacher, val)
        conversion = stage1(student, teacher, train_dir, args, seed, cache, val, val_targets)
    dataset, data_stats = training_dataset(train_dir, args, seed, cache)
    grid = (args.image_size // 14, args.image_size // 14)
    seen = {"batches": 0, "checksum": 0.0}
    teacher_mean = TeacherMean()  # the exported folders carry the mean of the crops this student saw (model cards)

    def loss_fn(student, batch, step_draws):
        pixel_values = batch["pixel_values"]
        seen["batches"] += 1
        seen["checksum"] += pixel_values.double().sum().item() * seen["batches"]  # order-sensitive fingerprint
        cls, patches, attention_map, pixel_sums = cache.targets(cached_targets(teacher, grid, args.map_queries),
                                                                pixel_values, batch["index"],
                                                                cache.crop_epoch(batch["epoch"]))
        teacher_mean.update(cls, patches)
        if not torch.allclose(pixel_sums, pixel_values.sum((1, 2, 3)).half().float(), rtol=1e-3, atol=1e-2):
            raise RuntimeError("the teacher cache holds targets of other crops than this batch's: a bug; delete "
                               f"{cache.folder} and run again.")
        return step_loss(student, pixel_values, {"cls": cls, "patches": patches, "map": attention_map}, **step_draws)

    budget_name, budgets = validation_budgets(name, args.image_size)
    validation = HeldOutAgreement(str(args.val_photos), budget_name, budgets, [args.image_size], 8)
    distill(accelerator, run_args, SCRIPT, student, teacher, dataset, data_stats, draws, loss_fn,
            validate=lambda model: validation(model, teacher, centre=centre), teacher_mean=teacher_mean)
    for folder in ("final", "best"):  # the model card quotes the command that made it: this benchmark's
        recipe = output_dir / folder / "training_recipe.json"
        write_json(str(recipe), {**json.loads(recipe.read_text()), "command": command(args.argv)})
    history = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]
    for record in history[args.log_every - 1 :: args.log_every]:
        print(f"      step {record['step']:5d}/{steps}  loss {record['loss']:.4f}  lr {record['lr']:.2e}", flush=True)
    validations = [json.loads(line) for line in (output_dir / "validation.jsonl").read_text().splitlines()]
    best = max(validations, key=lambda v: v["score"])
    print(f"      validation picked step {best['step']} (score {best['score']:.4f}; "
          + ", ".join(f"{v['step']}: {v['score']:.3f}" for v in validations) + ")", flush=True)
    record = {"lr": lr, "steps": steps, "train_time_s": time.perf_counter() - started,
              "data_checksum": seen["checksum"], "loss_mean_last10": statistics.fmean(r["loss"] for r in history[-10:]),
              "loss_mean_first10": statistics.fmean(r["loss"] for r in history[:10]), "best_step": best["step"],
              "validation": [{"step": v["step"], "score": v["score"]} for v in validations]}
    best_student = type(student).from_pretrained(str(output_dir / "best")).float().eval()
    if conversion is not None:  # the per-block table of the step validation chose, beside its start's and stage 1's
        print(f"      at the chosen step {best['step']} of stage 2:", flush=True)
        conversion["chosen"] = table_record(best_student, teacher, val_targets, val, TABLE_BUDGETS, print)
        record["conversion"] = conversion
    return best_student, record
