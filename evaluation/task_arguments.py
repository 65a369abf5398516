"""The command-line options the task benchmarks share (benchmarks.sparse_recognition, sparse_recognition_veca and
task_pilot): the teacher, the canvases, the readers, fine-tuning, the bootstrap and the timing (`add_task_arguments`),
the --quick / --smoke presets under the options given (`finish_task_arguments`), their checks, and the pilot's choice
of canvases (`apply_pilot`). A bad value ends in parser.error: one line, exit status 2."""

import argparse
import json
import math
import os
import sys
import tempfile
from pathlib import Path

from corevision_hf.cli import error_line
from evaluation.sparse_digits import CELL, PHOTO_SUFFIXES, ROOT
from training.arguments import parse_seed

GCOMPRIS_PHOTOS = ROOT / "outputs" / "gcompris_photos"  # examples/gcompris_photos.py's folder


def add_task_arguments(parser: argparse.ArgumentParser, *, digit_size: int = 28, strokes: int = 50) -> None:
    """The options benchmarks.sparse_recognition and sparse_recognition_veca share: the teacher, the canvases, the
    probe, fine-tuning, the bootstrap and the timing. `finish_task_arguments` checks them."""
    parser.add_argument("--teacher", default="offline-dinov2-small",
                        help="offline-dinov2-small, or a DINOv2 save_pretrained folder")
    parser.add_argument("--train", type=int, default=160, help="training canvases per variant (validation included)")
    parser.add_argument("--val", type=int, default=40, help="of those, the last ones held out to choose settings")
    parser.add_argument("--test", type=int, default=100, help="test canvases per variant")
    parser.add_argument("--seed", type=parse_seed, default=0,
                        help="canvases, initialisation, training order, random draws, bootstrap")
    parser.add_argument("--background", default="black", choices=["black", "photo"],
                        help="under the digits: black, or crops of photos (training and test canvases from disjoint "
                             "photo pools: evaluation.sparse_digits' photo_paths)")
    parser.add_argument("--extra-photos", type=Path, default=GCOMPRIS_PHOTOS,
                        help="with --background photo (and the photos a student distils on): a folder of more photos, "
                             "each in the training or the test pool by a hash of its name (python "
                             "examples/gcompris_photos.py writes the default)")
    parser.add_argument("--digit-size", type=int, default=digit_size, help="digit height and width in px (28: MNIST's)")
    parser.add_argument("--strokes", type=int, default=strokes, help="scribble strokes per canvas")
    parser.add_argument("--canvas-size", type=int, default=518, help="canvas side in px, a multiple of 14")
    parser.add_argument("--batch-size", type=int, default=8, help="canvases per step and per forward")
    parser.add_argument("--probe-decays", type=float, nargs="+", default=[1e-4, 1e-3, 1e-2, 1e-1],
                        help="the linear probe's weight decays, one chosen on the validation canvases")
    parser.add_argument("--attentive-decays", type=float, nargs="+", default=[1e-3, 1e-1],
                        help="the attentive probe's weight decays, one chosen on the validation canvases")
    parser.add_argument("--finetune-epochs", type=int, default=2,
                        help="fine-tuning's epochs at most (its cosine schedule spans them)")
    parser.add_argument("--finetune-patience", type=int, default=None,
                        help="stop fine-tuning once this many epochs in a row have not raised the best validation "
                             "accuracy (default: run every epoch)")
    parser.add_argument("--finetune-lr", type=float, default=1e-5, help="backbone learning rate (the head's: x 10)")
    parser.add_argument("--bootstrap", type=int, default=2000, help="bootstrap resamples of the test canvases")
    parser.add_argument("--latency-runs", type=int, default=5, help="timed batch-1 runs per line (alternated)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads (default: OMP_NUM_THREADS if set, else every core)")


def finish_task_arguments(parser: argparse.ArgumentParser, argv, presets: dict, counts: tuple[str, ...] = ()):
    """Parses `argv`, applies the preset of --quick / --smoke ({flag: settings}) to every option left at its default
    (an option given on the command line wins), and checks the shared options and the whole numbers `counts` (each
    at least 1); a bad value ends in parser.error."""
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    given = given_options(parser, args.argv)
    for flag, settings in presets.items():
        if getattr(args, flag):
            for name, value in settings.items():
                if name not in given:
                    setattr(args, name, value)
    for name in ("train", "test", "batch_size", "finetune_epochs", "bootstrap", "latency_runs", *counts):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1.")
    for name in ("probe_decays", "attentive_decays"):
        if bad := [value for value in getattr(args, name) if not math.isfinite(value) or value <= 0]:
            parser.error(f"--{name.replace('_', '-')} {bad[0]}: weight decays must be positive finite numbers.")
    if args.finetune_patience is not None and args.finetune_patience < 1:
        parser.error(f"--finetune-patience {args.finetune_patience} must be at least 1 (leave it out to run every "
                     "epoch).")
    if not math.isfinite(args.finetune_lr) or args.finetune_lr <= 0:
        parser.error(f"--finetune-lr {args.finetune_lr} must be a positive finite number.")
    check_canvas_arguments(parser, args)
    check_canvas_setting(parser, args.canvas_size, args.digit_size, args.strokes)
    check_folders(parser, args)
    if args.background == "photo":
        check_extra_photos(parser, args.extra_photos)
    return args


def check_extra_photos(parser: argparse.ArgumentParser, folder: Path) -> None:
    """--extra-photos is a folder holding photos, else parser.error naming the command that makes the default."""
    if not folder.is_dir() or not any(path.suffix.lower() in PHOTO_SUFFIXES for path in folder.iterdir()):
        parser.error(f"--extra-photos {folder} holds no photos: python examples/gcompris_photos.py writes "
                     f"{GCOMPRIS_PHOTOS.relative_to(ROOT)} (121 photos, from a Debian package), or give another "
                     "folder.")


def check_folders(parser: argparse.ArgumentParser, args) -> None:
    """--out-dir, --scratch-dir and --cache-dir (those the command has) are folders or can be made, and the folders a
    run writes into (--out-dir, --scratch-dir) can be written, so that a run never finds out after all its work; else
    parser.error."""
    for name in ("out_dir", "scratch_dir", "cache_dir"):
        folder = getattr(args, name, None)
        if folder is None:
            continue
        flag = f"--{name.replace('_', '-')}"
        existing = Path(os.path.abspath(folder))
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        if not existing.is_dir():
            parser.error(f"{flag} {folder}{' is' if existing == Path(os.path.abspath(folder)) else f': {existing} is'} "
                         "a file: give a folder (made if missing).")
        if name == "cache_dir":  # kept between runs: one whose passes are all there may be read-only
            continue
        try:
            handle, probe = tempfile.mkstemp(prefix=".write-check.", dir=existing)
            os.close(handle)
            os.remove(probe)
        except OSError as error:
            parser.error(f"{flag} {folder} cannot be written ({error.strerror or error} in {existing}): choose a "
                         "folder you can write to.")


def given_options(parser: argparse.ArgumentParser, argv: list[str]) -> set[str]:
    """The destinations of the options `argv` gives, even at their default value (`--steps 0`): argparse leaves a
    destination the namespace already holds alone unless an option sets it."""
    unset = object()
    start = argparse.Namespace(**{name: unset for name in vars(parser.parse_args(argv))})
    return {name for name, value in vars(parser.parse_args(argv, start)).items() if value is not unset}


def check_canvas_arguments(parser: argparse.ArgumentParser, args) -> None:
    """--canvas-size, --val against --train and --threads, as every benchmark of this task takes them
    (benchmarks.task_pilot too); a bad value ends in parser.error."""
    if args.canvas_size <= 0 or args.canvas_size % CELL:
        parser.error(f"--canvas-size {args.canvas_size} is not a positive multiple of {CELL}.")
    if not 1 <= args.val < args.train:
        parser.error(f"--val {args.val} must lie in 1..--train - 1 ({args.train - 1}).")
    if args.threads is not None and args.threads < 1:
        parser.error(f"--threads {args.threads} must be at least 1.")


def check_canvas_setting(parser: argparse.ArgumentParser, canvas_size: int, digit_size: int, strokes: int) -> None:
    """A digit size that fits the canvas and a number of scribbles that is not negative, else parser.error."""
    if not 1 <= digit_size <= canvas_size:
        parser.error(f"--digit-size {digit_size} must lie in 1..--canvas-size ({canvas_size}).")
    if strokes < 0:
        parser.error(f"--strokes {strokes} must be 0 or more.")


def apply_pilot(parser: argparse.ArgumentParser, args) -> dict:
    """The --pilot JSON's choice applied to --digit-size and --strokes where the command line left them; returns what
    the results keep of it. A file that is no pilot, a pilot without a choice or of another canvas size: one line."""
    try:
        pilot = json.loads(args.pilot.read_text())
        chosen, canvas_size = pilot["choice"]["chosen"], pilot["canvas_size"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        parser.error(f"--pilot {args.pilot}: not a benchmarks.task_pilot JSON ({error_line(error)}); run "
                     "python -m benchmarks.task_pilot first.")
    if chosen is None:
        parser.error(f"--pilot {args.pilot}: no setting met the pilot's rule ({pilot['choice']['rule']}); give "
                     "--digit-size and --strokes, or pilot other settings.")
    if canvas_size != args.canvas_size:
        parser.error(f"--pilot {args.pilot} calibrated {canvas_size} px canvases, not --canvas-size "
                     f"{args.canvas_size}.")
    background = pilot.get("background", "black")  # the pilots before the photo canvases were all on black
    if background != args.background:
        parser.error(f"--pilot {args.pilot} calibrated canvases on {background}, not --background {args.background}: "
                     f"give the pilot of {args.background} canvases (python -m benchmarks.task_pilot --background "
                     f"{args.background}).")
    for name in ("digit_size", "strokes"):  # a JSON's 14.5, "14" or null would fail only after the teacher's passes
        if type(chosen.get(name)) is not int:
            parser.error(f"--pilot {args.pilot}: its chosen {name} is {chosen.get(name)!r}, not a whole number; run "
                         "python -m benchmarks.task_pilot again, or give --digit-size and --strokes.")
    given = {word.split("=")[0] for word in args.argv}
    if "--digit-size" not in given:
        args.digit_size = chosen["digit_size"]
    if "--strokes" not in given:
        args.strokes = chosen["strokes"]
    check_canvas_setting(parser, args.canvas_size, args.digit_size, args.strokes)
    return {"file": str(args.pilot), **{key: pilot.get(key) for key in ("choice", "rows", "command", "teacher",
                                                                        "seed", "train", "validation")},
            "background": background}
