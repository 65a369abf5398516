"""Study (#68 item 3, 2026-12-08): is it the readers? Neither of the pilot's frozen readers (the linear probe on
[CLS ; mean patch], the attentive probe's four learnt queries) finds a digit on a photo, even an 84 px digit on its own
black plate. This reader looks for a small object: a linear classifier on each patch token, its logits pooled over
the tokens by log-sum-exp (a smooth maximum: the tokens that see a digit decide, the photo's add a near-constant),
fitted and validated as the pilot's readers are (the last `val` canvases, one fit per weight decay). Read on the
cached passes of the black pilot, the product's photo canvases and photo_plates.py's plates, the dense teacher and
the teacher at equal FLOPs, so the pilot's rule can be read on it. A diagnostic, not one of the benchmark's readers.

    python -m experiments.task_calibration.token_reader
"""

import json
import time
import types
from pathlib import Path

import torch

from benchmarks import task_pilot
from corevision_hf import lookwhere_from_teacher
from evaluation.canvases import task_splits
from evaluation.task_arguments import GCOMPRIS_PHOTOS
from evaluation.task_student import SELECTOR_DEPTH, line_costs
from evaluation.teacher_passes import TeacherPasses
from evaluation.teachers import load_teacher_model
from experiments.task_calibration.photo_plates import canvases

OUT = Path("experiments/task_calibration/token_reader.json")
DECAYS = (1e-4, 1e-2)
STEPS, BATCH, LR = 300, 64, 1e-2


def fit_token_reader(tokens: torch.Tensor, labels: torch.Tensor, decay: float, seed: int) -> torch.nn.Linear:
    """A linear head (D -> 10) on each token of `tokens` (N, P, D) float16, the logits log-sum-exp pooled over P,
    fitted by AdamW on cross-entropy (STEPS steps of BATCH canvases drawn with `seed`); tokens scaled by one number."""
    generator = torch.Generator().manual_seed(seed)
    head = torch.nn.Linear(tokens.shape[-1], 10)
    torch.nn.init.zeros_(head.weight)
    torch.nn.init.zeros_(head.bias)
    optimizer = torch.optim.AdamW(head.parameters(), lr=LR, weight_decay=decay)
    for _ in range(STEPS):
        batch = torch.randint(len(tokens), (BATCH,), generator=generator)
        loss = torch.nn.functional.cross_entropy(pooled_logits(head, tokens[batch]), labels[batch])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return head


def pooled_logits(head: torch.nn.Linear, tokens: torch.Tensor) -> torch.Tensor:
    return head(tokens.float()).logsumexp(dim=1)


def read(tokens: torch.Tensor, labels: torch.Tensor, val: int, seed: int) -> dict:
    """{decay: validation accuracy} of the token reader on the last `val` canvases, fitted on the others."""
    tokens = tokens / tokens[: len(tokens) - val].float().std()
    fit, held = slice(0, len(labels) - val), slice(len(labels) - val, None)
    scores = {}
    for decay in DECAYS:
        head = fit_token_reader(tokens[fit], labels[fit], decay, seed)
        with torch.no_grad():
            predictions = torch.cat([pooled_logits(head, part).argmax(-1) for part in tokens[held].split(BATCH)])
        scores[str(decay)] = float((predictions == labels[held]).float().mean())
    return scores


def splits(pilot) -> list[tuple[str, int, int, object, str]]:
    """(canvases, digit size, count, Split, cache) of each row: the pilot's own passes on black and photos, the
    study's on plates."""
    rows = []
    for background in ("black", "photo"):
        setting = types.SimpleNamespace(canvas_size=518, seed=1, background=background, extra_photos=GCOMPRIS_PHOTOS,
                                        digit_size=28, strokes=0, train=pilot.train, test=1)
        rows.append((background, 28, pilot.train, task_splits(setting, "single")["train"], "product"))
    for digit_size, count in ((28, pilot.train), (84, pilot.train), (84, 2000)):
        rows.append(("plate", digit_size, count, canvases("plate", digit_size, count, 1, GCOMPRIS_PHOTOS), "study"))
    return rows


def main() -> None:
    torch.set_num_threads(2)
    torch.manual_seed(0)
    pilot = task_pilot.parse_args([])
    teacher, _ = load_teacher_model(pilot.teacher)
    student = lookwhere_from_teacher(teacher, selector_depth=SELECTOR_DEPTH, selector_image_size=pilot.selector_size)
    _, equal_size = line_costs(pilot, teacher, student)
    caches = {"product": TeacherPasses(pilot.cache_dir, teacher, pilot.batch_size),
              "study": TeacherPasses(Path("outputs/task_cache_photo_plates"), teacher, pilot.batch_size)}
    started, rows = time.perf_counter(), []
    for name, digit_size, count, split, cache in splits(pilot):
        row = {"canvases": name, "digit_size": digit_size, "train": count}
        for line, size in (("dense", pilot.canvas_size), ("equal_flops", equal_size)):
            tokens = caches[cache].get(split, split.key, size)["patches"]
            scores = read(tokens, split.labels, pilot.val, pilot.seed)
            row[line] = {"val_accuracy": scores, "best": max(scores.values())}
        row["gap"] = row["dense"]["best"] - row["equal_flops"]["best"]
        rows.append(row)
        print(f"{name:6s} {digit_size} px, {count} canvases: dense {row['dense']['best']:.3f}, equal FLOPs "
              f"{row['equal_flops']['best']:.3f}, gap {row['gap']:+.3f} ({time.perf_counter() - started:.0f} s)",
              flush=True)
    OUT.write_text(json.dumps({"rows": rows, "validation": pilot.val, "seed": pilot.seed,
                               "equal_flops_size": equal_size,
                               "reader": {"decays": DECAYS, "steps": STEPS, "batch": BATCH, "lr": LR},
                               "total_time_s": time.perf_counter() - started,
                               "command": "python -m experiments.task_calibration.token_reader"}, indent=1))


if __name__ == "__main__":
    main()
