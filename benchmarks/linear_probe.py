"""Linear probe on real labels: the teacher, a dense student and every budget of a VECA or LookWhere student, from
frozen image-level features, beside the two rows that say whether the probe can rank features at all: raw pixels and
the student's architecture untrained; accuracy with its standard error.

    python -m benchmarks.linear_probe --model outputs/demo/run/final                  # the make-demo student
    python -m benchmarks.linear_probe --model STUDENT --dense DENSE_VIT --budgets 32 16 8 4

1. Data: --data, train/<class>/ and val/<class>/ images (default assets/probe/fashion_mnist: Fashion-MNIST product
   photos, 10 classes, 30 train + 20 val each, MIT; see its LICENSE.md), each resized to --resolution (a multiple
   of every model's patch size) and normalised as the training photos are (training/probes.py `load_image`).
2. Features: the image-level token after the final norm, `pooler_output` (the teacher's and a dense ViT's CLS,
   VECA's core 0, LookWhere's CLS), frozen; the teacher (--teacher, as in the training scripts), the optional dense
   student (--dense, any save_pretrained ViT folder), and the student (--model) at each budget: --budgets, default
   VECA's config.training_budgets or LookWhere's k_ratio 0.1 / 0.25 / 0.5 / 1.0. Beside them: raw pixels (each
   image area-averaged to 16 x 16, flattened) and the student's architecture with random weights (seed 0) at each
   budget. A probe on which raw pixels or random weights match the teacher cannot rank features (Fashion-MNIST's
   28 x 28 thumbnails, for one: raw pixels beat the teacher there).
3. Head: multinomial logistic regression on the standardised train features (training/probes.py
   `fit_linear_classifier`, deterministic). Accuracy on val, with the binomial standard error sqrt(p (1 - p) / n):
   the spread from which val images happened to be drawn.

Prints a table and writes --output (default outputs/benchmarks/linear_probe.json).
"""

import argparse
import json
import math
import os
from pathlib import Path

import torch

from transformers import AutoModel

from corevision_hf.atomic import write_text_atomically
from corevision_hf.cli import HelpFormatter
import corevision_hf  # noqa: F401  (registers VECA and LookWhere with the Auto classes)
from evaluation.probes import classification_folder, fit_linear_classifier, load_image
from evaluation.teacher_free import pixel_features
from training.teacher import load_teacher

ROOT = Path(__file__).resolve().parents[1]

LOOKWHERE_K_RATIOS = [0.1, 0.25, 0.5, 1.0]


def pooled_features(model, images: torch.Tensor, batch_size: int, **budget) -> torch.Tensor:
    """(N, D) `pooler_output` of `model` on `images` (N, 3, S, S), in batches."""
    with torch.inference_mode():
        return torch.cat([model(images[i : i + batch_size], **budget).pooler_output.float()
                          for i in range(0, len(images), batch_size)])


def probe(train: tuple, val: tuple, num_classes: int) -> dict:
    """train / val: (features (N, D), labels (N,)) -> val accuracy of a linear head fitted on train, its standard
    error and the number of val images."""
    head = fit_linear_classifier(*train, num_classes)
    accuracy = int((head(val[0]).argmax(-1) == val[1]).sum()) / len(val[1])
    return {"accuracy": accuracy, "standard_error": math.sqrt(accuracy * (1 - accuracy) / len(val[1])),
            "val_images": len(val[1])}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--model", required=True, help="a VECA or LookWhere save_pretrained folder (the student)")
    parser.add_argument("--dense", default=None, help="a dense ViT student's save_pretrained folder (optional)")
    parser.add_argument("--teacher", default="offline-dinov2-small", help="hub id, folder, or offline-dinov2-small")
    parser.add_argument("--data", default=str(ROOT / "assets" / "probe" / "fashion_mnist"))
    parser.add_argument("--budgets", type=float, nargs="+", default=None,
                        help="VECA core counts or LookWhere k_ratios (default: see above)")
    parser.add_argument("--resolution", type=int, default=224)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--output", default=str(ROOT / "outputs" / "benchmarks" / "linear_probe.json"))
    args = parser.parse_args(argv)

    splits, classes = classification_folder(args.data)
    images = {s: torch.stack([load_image(path, args.resolution) for path, _ in pairs]) for s, pairs in splits.items()}
    labels = {s: torch.tensor([label for _, label in pairs]) for s, pairs in splits.items()}

    def row(name: str, model, **budget) -> dict:
        """`model` None: raw pixels."""
        features = {s: pixel_features(images[s]) if model is None else
                    pooled_features(model, images[s], args.batch_size, **budget) for s in images}
        result = {"name": name, **budget, **probe((features["train"], labels["train"]),
                                                  (features["val"], labels["val"]), len(classes))}
        print(f"{name:<32} {result['accuracy']:.3f} +- {result['standard_error']:.3f}", flush=True)
        return result

    print(f"linear probe on {Path(args.data).name}: {len(classes)} classes, {len(labels['train'])} train / "
          f"{len(labels['val'])} val images at {args.resolution} px; val accuracy +- standard error")
    rows = [row("raw pixels", None), row(f"teacher ({args.teacher})", load_teacher(args.teacher))]
    if args.dense:
        rows.append(row("dense student", AutoModel.from_pretrained(args.dense).eval()))
    student = AutoModel.from_pretrained(args.model).eval()
    torch.manual_seed(0)
    untrained = AutoModel.from_config(student.config).eval()
    model_type = student.config.model_type
    if model_type == "veca":
        budgets = [{"num_cores": int(b)} for b in sorted(args.budgets or student.config.training_budgets)]
    else:
        budgets = [{"k_ratio": r} for r in sorted(args.budgets or LOOKWHERE_K_RATIOS)]
    for budget in budgets:
        setting = ", ".join(f"{name}={value:g}" for name, value in budget.items())
        rows += [row(f"{model_type}, {setting}", student, **budget),
                 row(f"{model_type} untrained, {setting}", untrained, **budget)]

    report = {"data": Path(args.data).name, "classes": classes, "resolution": args.resolution,
              "train_images": len(labels["train"]), "teacher": args.teacher, "dense": args.dense,
              "model": args.model, "rows": rows}
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    write_text_atomically(args.output, json.dumps(report, indent=2))  # a finished file or none
    return report


if __name__ == "__main__":
    main()
