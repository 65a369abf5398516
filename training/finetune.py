"""Image-classification fine-tuning of a VECA or LookWhere checkpoint on an ImageFolder, head first (LP-FT).

    python -m training.finetune outputs/demo/lookwhere --data photos/train --eval-data photos/heldout \\
        --output-dir outputs/finetune --k-ratio 0.1:0.5 --eval-k-ratio 0.25

--recipe finetune-guarded sets the recommended recipe's flags (training/recipes/finetune-guarded.yaml; a flag given on
the command line wins): 224 px, 10 epochs, crops, the probe fitted on augmented views too (--probe-views 4) and best/
the probe unless a candidate beats it beyond validation's noise (--choose paired); with --epochs 0 it is that probe
alone. --recipe finetune-final: the rotation result's flags, final/ (the last epoch) scored on --eval-data.
--data, --val-data and --eval-data are ImageFolders: one sub-folder per class (hidden ones skipped, none a link, none
empty), its images at any depth below it.
--val-data chooses the best epoch; without it a seeded --val-fraction of --data is kept apart for that (per class;
with --val-groups, whole groups of images, such as the crops of one photo, so that no group is on both sides).
--eval-data is read once, at the end, to report the held-out accuracy of that best model (never to choose anything);
with --evaluate final, of the last epoch instead: a recipe fixed in advance, for when validation is too small to
choose (docs/fine-tuning.md). Every image of --eval-data is opened before training starts.
Images are resized to --image-size squared; the processor saved with the model does the same.

The recipe, as for a DINOv2 backbone (LP-FT: a fine-tuned random head first distorts the features it reads):
  1. linear probe: the classifier is fitted on the frozen features (L-BFGS logistic regression,
     evaluation.probes.fit_linear_classifier; training.head_probe) and folded into the model's head; with
     --probe-views N, on the features of N augmented views of each training image too (the changes and budgets that
     fine-tuning draws, from the seed, the view and the batch alone: --epochs 0 fits the probe fine-tuning starts from);
  2. fine-tuning: the backbone and the head, AdamW at a small --lr (warm-up, then cosine), optionally with layer-wise
     decay (--layer-decay: block i of L trains at lr * decay ** (L + 1 - i)), for --epochs epochs, the training
     images flipped (--hflip), cropped (--crop-scale) and made grey (--grayscale) at random on the way (printed at the
     start and on the card: turn off what changes your labels).
--probe-weight-decay may list several penalties: the probe of the best validation accuracy is kept.
--wise-ft 0.25,0.5,0.75 also mixes the last epoch's weights with the probe's, (1 - a) * probe + a * fine-tuned for
each a (WiSE-FT, Wortsman et al. 2022: fine-tuning's gains on data like the training set keep better on other data),
and lets each mix compete with the epochs on validation for best/ (none: no mixes).
--choose paired: best/ is the probe unless the last epoch or a mix beats it on validation beyond the paired bootstrap's
noise over whole --val-groups groups (training.final_choice); OUT/choice.json records every candidate and why.
LookWhere's selector stays frozen (the heads keep it so). Each step draws its budget: a LookWhere k_ratio uniform in
--k-ratio LOW:HIGH (or one value), a VECA core count from --num-cores (default: the config's training budgets); every
evaluation runs at --eval-k-ratio / --eval-num-cores, the budget you deploy. One line per epoch (loss, train and
validation accuracy); OUT/best (chosen on validation, the probe included) and OUT/final are model folders with
the head, id2label, the processor and a card (README.md) with the recipe and the accuracies.
--output-dir must be new or empty; --overwrite replaces a run of this command there (its run.json says so), and
refuses a folder holding anything such a run did not write: each file a run writes is listed with its sha256 in
OUT/.corevision_hf.json (run.json, metrics.jsonl) or in its folder's (best/, final/), and a file listed nowhere, or
changed since, is a user's (notes, an ONNX export under final/onnx/), never deleted.
"""

import argparse
import math
import os
import re
import sys

from .arguments import HelpFormatter, parse_seed, run_as_command
from .finetune_augment import augment, describe
from .finetune_card import card, recipe_summary
from .finetune_output import SCRIPT, open_output_dir, write_json
from .head_probe import choose_probe, fold_probe, head_features, to_device
from .labelled_folders import check_images_open, labelled_files, loader, other_folder, source_groups, training_split

VIEW_STEP = 2**40  # the draws of --probe-views start here: steps no fine-tuning reaches, whatever --epochs


class Parser(argparse.ArgumentParser):
    """argparse's parser, its errors (a flag's bad value, a missing argument) raised as ValueError: one line on
    stderr and exit status 2, as every other bad input (corevision_hf.cli.exit_status), not the usage text."""

    def error(self, message: str):
        raise ValueError(f"{message} ({self.prog} --help lists the arguments).")


def number(condition: str, test, kind=float):
    """An argparse type: a finite `kind` for which `test` holds; else an error naming the flag and `condition`."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {condition}, got {text!r}") from None
        if not (math.isfinite(value) and test(value)):
            raise argparse.ArgumentTypeError(f"must be {condition}, got {text!r}")
        return value
    return parse


POSITIVE = number("a finite number above 0", lambda value: value > 0)
NON_NEGATIVE = number("a finite number, 0 or more", lambda value: value >= 0)
FRACTION = number("a number in (0, 1]", lambda value: 0 < value <= 1)
COUNT = number("a whole number, 0 or more", lambda value: value >= 0, int)
POSITIVE_COUNT = number("a whole number, 1 or more", lambda value: value >= 1, int)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog=f"python -m {SCRIPT}", description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("checkpoint", help="a VECA or LookWhere save_pretrained folder or hub id")
    parser.add_argument("--recipe", default=None,
                        help="a preset of flags, training/recipes/NAME.yaml: finetune-final, the recommended recipe "
                             "(docs/fine-tuning.md); any flag given here overrides the recipe's value")
    add_data_arguments(parser)
    add_training_arguments(parser)
    add_augmentation_arguments(parser)
    parser.add_argument("--num-workers", type=COUNT, default=0, help="DataLoader workers")
    parser.add_argument("--threads", type=POSITIVE_COUNT, default=None,
                        help="CPU threads of torch (torch.set_num_threads; default: torch's own choice)")
    parser.add_argument("--seed", type=parse_seed, default=0)
    return parser


def add_data_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", required=True, help="training ImageFolder: one sub-folder per class")
    parser.add_argument("--eval-data", default=None,
                        help="held-out ImageFolder with the same classes, evaluated once at the end (of best/, or of "
                             "--evaluate's folder)")
    parser.add_argument("--evaluate", choices=("best", "final"), default=None,
                        help="the folder --eval-data scores, once: best/ (chosen on validation; the default) or final/ "
                             "(the last epoch, fixed in advance: for a validation set too small to choose)")
    parser.add_argument("--output-dir", required=True, help="a new or empty folder (outside the data folders)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the run of this command already in --output-dir (only what it wrote there)")
    parser.add_argument("--val-data", default=None,
                        help="validation ImageFolder with the same classes, to choose the best epoch (default: a "
                             "share of --data, --val-fraction)")
    parser.add_argument("--val-fraction", type=number("a number strictly between 0 and 1", lambda v: 0 < v < 1),
                        default=None, help="share of --data per class kept apart to choose the best epoch, without "
                                           "--val-data (default 0.2)")
    parser.add_argument("--val-groups", default=None, metavar="REGEX",
                        help="groups of images (the crops of one photo): kept on one side of the validation split, "
                             "and resampled whole by --choose paired; the group of an image is the first group (or "
                             "the whole match) of REGEX in its file name without suffix, in any class folder; e.g. "
                             r"'(.+)_\d+$' groups photo_0.png, photo_1.png, ... (default: each image its own)")
    parser.add_argument("--image-size", type=POSITIVE_COUNT, default=None,
                        help="square side in pixels (default: the config's)")


def add_training_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--epochs", type=COUNT, default=5,
                        help="fine-tuning epochs after the probe (0: the probe only)")
    parser.add_argument("--batch-size", type=POSITIVE_COUNT, default=8)
    parser.add_argument("--lr", type=POSITIVE, default=1e-5, help="peak learning rate of fine-tuning (the head's)")
    parser.add_argument("--layer-decay", type=number("a number in (0, 1] (lower layers train slower)",
                                                     lambda value: 0 < value <= 1),
                        default=1.0, help="layer-wise learning-rate decay (1: none)")
    parser.add_argument("--weight-decay", type=NON_NEGATIVE, default=0.05, help="AdamW's, on weight matrices only")
    parser.add_argument("--max-grad-norm", type=NON_NEGATIVE, default=1.0, help="gradient clipping (0: none)")
    parser.add_argument("--warmup-epochs", type=NON_NEGATIVE, default=1.0)
    parser.add_argument("--probe-weight-decay", default="1e-2", metavar="PENALTY[,PENALTY...]",
                        help="L2 penalty of the linear probe; several (comma-separated): the one of the best "
                             "validation accuracy is kept")
    parser.add_argument("--probe-views", type=COUNT, default=0, metavar="N",
                        help="also fit the probe on N augmented views of each training image (the crops, flips, greys "
                             "and budgets fine-tuning draws), so that fine-tuning starts on the inputs it trains on")
    parser.add_argument("--wise-ft", default=None, metavar="A[,A...]",
                        help="after the last epoch, mix its weights with the probe's, (1 - A) probe + A fine-tuned, "
                             "for each A in (0, 1); each mix is a candidate for best/ (WiSE-FT); none: no mixes")
    parser.add_argument("--choose", choices=("accuracy", "paired"), default="accuracy",
                        help="how best/ is chosen on validation: accuracy, the highest accuracy of the probe, every "
                             "epoch and mix; paired, the probe unless the last epoch or a mix beats it beyond the "
                             "paired bootstrap's noise over --val-groups (training.final_choice; OUT/choice.json)")
    parser.add_argument("--k-ratio", default="0.1:0.5", help="LookWhere: k_ratio per step, LOW:HIGH or one value")
    parser.add_argument("--eval-k-ratio", type=FRACTION, default=0.25, help="LookWhere: k_ratio of every evaluation")
    parser.add_argument("--num-cores", default=None,
                        help="VECA: core counts drawn per step, comma-separated (default: config.training_budgets)")
    parser.add_argument("--eval-num-cores", type=int, default=None,
                        help="VECA: core count of every evaluation (default: the model's default budget)")


def add_augmentation_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--hflip", action=argparse.BooleanOptionalAction, default=True,
                        help="flip half the training images left to right (--no-hflip where a mirror image changes "
                             "the label: orientation, handedness, text)")
    parser.add_argument("--crop-scale", default="1", metavar="LOW:HIGH",
                        help="random square crops of each training image, their side a fraction in [LOW, HIGH] of "
                             "the image's, resized back (1: none; e.g. 0.5:1)")
    parser.add_argument("--grayscale", type=number("a probability in [0, 1]", lambda value: 0 <= value <= 1),
                        default=0.0, metavar="P",
                        help="make each training image grey (its luma in all three channels) with probability P, "
                             "as DINO's and SimCLR's augmentations do (0.2): for held-out photos that may be "
                             "grayscale when the training ones are not")


def parse_args(argv=None) -> argparse.Namespace:
    """The command's arguments; with --recipe NAME, the recipe's values are the defaults that flags override."""
    from .arguments import parse

    return parse(build_parser(), argv, SCRIPT)


def give_way(args) -> None:
    """With --epochs 0, a recipe's --wise-ft gives way (there are no fine-tuned weights to mix), as if --wise-ft none
    were given: `--recipe NAME --epochs 0` is that recipe's probe. A --wise-ft of the command line does not."""
    from .recipes import load_recipe

    if args.epochs == 0 and args.recipe and wise_ft_mixes(args.wise_ft) and (
            args.wise_ft == load_recipe(args.recipe).get("wise_ft")):
        print(f"--epochs 0: the recipe's --wise-ft {args.wise_ft} gives way (no fine-tuned weights to mix): --wise-ft "
              "none, the recipe's probe alone")
        args.wise_ft = "none"


def check_arguments(args) -> None:
    """Raises ValueError on the first argument that cannot work, before anything is loaded or written."""
    probe_penalties(args.probe_weight_decay)
    crop_scale(args.crop_scale)
    k_ratio_range(args.k_ratio)
    if args.evaluate is not None and args.eval_data is None:
        raise ValueError(f"--evaluate {args.evaluate} names the folder --eval-data scores: give --eval-data too.")
    if wise_ft_mixes(args.wise_ft) and args.epochs == 0:
        raise ValueError("--wise-ft mixes the last epoch's weights with the probe's: give --epochs 1 or more, or "
                         "--wise-ft none.")
    if args.val_data is not None and args.val_fraction is not None:
        raise ValueError("--val-data is the validation set: --val-fraction (which carves one from --data) does not go "
                         "with it; give one or the other.")
    if args.val_groups is not None:
        try:
            re.compile(args.val_groups)
        except re.error as error:
            raise ValueError(f"--val-groups is no regular expression ({error}): got {args.val_groups!r}.") from None
    check_checkpoint(args.checkpoint)
    check_output_apart(args)


def check_checkpoint(name: str) -> None:
    """A ValueError when `name` is neither a folder here nor a hub id (NAME or ORG/NAME that is no path here)."""
    from .data import is_local

    if os.path.isdir(name):
        return
    if os.path.lexists(name):
        raise ValueError(f"The checkpoint {name} is a file: give a save_pretrained folder (config.json and the "
                         "weights) or a hub id.")
    if is_local(name):
        raise ValueError(f"The checkpoint folder {name} does not exist: give a save_pretrained folder or a hub id "
                         "(NAME or ORG/NAME).")


def check_output_apart(args) -> None:
    """A ValueError when --output-dir is a file, or the same as or inside a data folder (whose next run would read the
    run's folders as classes)."""
    if os.path.lexists(args.output_dir) and not os.path.isdir(args.output_dir):
        raise ValueError(f"--output-dir {args.output_dir} is a file: give a new or empty folder.")
    output = os.path.realpath(args.output_dir)
    for flag, folder in (("--data", args.data), ("--val-data", args.val_data), ("--eval-data", args.eval_data)):
        if folder is None:
            continue
        data = os.path.realpath(folder)
        if output == data or output.startswith(data.rstrip(os.sep) + os.sep):
            raise ValueError(f"--output-dir {args.output_dir} is inside {flag} {folder}: its best/ and final/ would "
                             "become classes of the next run on that data; choose an --output-dir outside it.")


def fraction_range(text: str, flag: str, example: str) -> tuple[float, float]:
    """`flag`'s "LOW:HIGH" (or one value) as (low, high), with 0 < low <= high <= 1."""
    try:
        low, high = (float(part) for part in (text.split(":") if ":" in text else (text, text)))
    except ValueError:
        raise ValueError(f"{flag} takes LOW:HIGH or one value (e.g. {example}), got {text!r}.") from None
    if not 0 < low <= high <= 1:
        raise ValueError(f"{flag} needs 0 < LOW <= HIGH <= 1, got {text!r}.")
    return low, high


def k_ratio_range(text: str) -> tuple[float, float]:
    """--k-ratio "LOW:HIGH" (or one value) as (low, high), each in (0, 1]."""
    return fraction_range(text, "--k-ratio", "0.1:0.5 or 0.25")


def crop_scale(text: str) -> tuple[float, float] | None:
    """--crop-scale "LOW:HIGH" as (low, high); None for "1" (no cropping)."""
    scale = fraction_range(text, "--crop-scale", "0.5:1 or 1")
    return None if scale == (1.0, 1.0) else scale


def float_list(text: str, flag: str, kind: str, example: str) -> list[float]:
    """`flag`'s "X" or "X,Y,..." as a list of floats (one-line error naming `flag` when a part is no number)."""
    try:
        return [float(part) for part in text.split(",")]
    except ValueError:
        raise ValueError(f"{flag} takes one {kind} or several, comma-separated (e.g. {example}), "
                         f"got {text!r}.") from None


def probe_penalties(text: str, flag: str = "--probe-weight-decay") -> list[float]:
    """`flag`'s "1e-2" or "1e-2,1e-1,1" as a list of positive floats."""
    penalties = float_list(text, flag, "penalty", "1e-2 or 1e-2,1e-1,1")
    if not all(0 < penalty < float("inf") for penalty in penalties):
        raise ValueError(f"{flag} must be positive and finite, got {text!r}.")
    return penalties


def wise_ft_mixes(text: str | None) -> list[float]:
    """--wise-ft "0.5" or "0.25,0.5,0.75" as a list of floats in (0, 1); [] when not given or "none"."""
    if text is None or text == "none":
        return []
    mixes = float_list(text, "--wise-ft", "mix", "0.5 or 0.25,0.5,0.75")
    if not all(0 < mix < 1 for mix in mixes):
        raise ValueError(f"--wise-ft mixes must be in (0, 1) (0 is the probe, 1 the last epoch: both are candidates "
                         f"already), got {text!r}.")
    return mixes


def cpu_copy(model) -> dict:
    """A copy of `model`'s state dict on the CPU (the GPU's memory is the optimiser's)."""
    return {name: tensor.detach().to("cpu", copy=True) for name, tensor in model.state_dict().items()}


def mix_weights(model, probe: dict, fine_tuned: dict, mix: float) -> None:
    """Loads (1 - mix) * probe + mix * fine_tuned (two state dicts of `model`) into `model`; tensors that are not
    floating point (counters, indices) are taken from `fine_tuned`."""
    import torch

    model.load_state_dict({name: torch.lerp(probe[name], tensor, mix) if tensor.is_floating_point() else tensor
                           for name, tensor in fine_tuned.items()})


def budgets(args, config) -> tuple:
    """(draw(step) -> the training call's budget kwargs, the evaluation's budget kwargs) for `config`'s model."""
    from .schedule import draw, draw_uniform

    if config.model_type == "lookwhere":
        if args.num_cores is not None or args.eval_num_cores is not None:
            raise ValueError("--num-cores and --eval-num-cores are VECA's budgets: give LookWhere --k-ratio and "
                             "--eval-k-ratio.")
        low, high = k_ratio_range(args.k_ratio)
        return (lambda step: {"k_ratio": draw_uniform(low, high, args.seed, step)}), {"k_ratio": args.eval_k_ratio}
    cores = parse_cores(args.num_cores, config) if args.num_cores else config.training_budgets or [config.num_cores]
    if args.eval_num_cores is not None and not 1 <= args.eval_num_cores <= config.num_cores:
        raise ValueError(f"--eval-num-cores must be in [1, {config.num_cores}] (the model's cores), "
                         f"got {args.eval_num_cores}.")
    evaluation = {} if args.eval_num_cores is None else {"num_cores": args.eval_num_cores}
    return (lambda step: {"num_cores": draw(cores, [1] * len(cores), args.seed, step)}), evaluation


def parse_cores(text: str, config) -> list[int]:
    """--num-cores "8,16,32" as a list, each in [1, config.num_cores]."""
    try:
        cores = [int(part) for part in text.split(",")]
    except ValueError:
        raise ValueError(f"--num-cores takes comma-separated core counts (e.g. 8,16,32), got {text!r}.") from None
    if not all(1 <= c <= config.num_cores for c in cores):
        raise ValueError(f"--num-cores must lie in [1, {config.num_cores}] (the model's cores), got {text!r}.")
    return cores


def evaluate(model, batches, budget: dict, device, outcomes: bool = False) -> dict:
    """{"loss", "accuracy", "images"} of `model` over `batches` (dicts of its inputs with "labels") at `budget`, in
    eval mode; with `outcomes`, also "correct": (images,) bool on the CPU, each image right or not, in batch order."""
    import torch

    model.eval()
    loss, right = torch.zeros((), device=device), []
    with torch.no_grad():
        for batch in batches:
            batch = to_device(batch, device)
            output = model(**batch, **budget)
            loss += output.loss * len(batch["labels"])
            right.append(output.logits.argmax(-1) == batch["labels"])
    right = torch.cat(right)
    result = {"loss": loss.item() / len(right), "accuracy": right.sum().item() / len(right), "images": len(right)}
    return {**result, "correct": right.cpu()} if outcomes else result


def probe_features(run: dict) -> tuple:
    """(features (N, D), labels (N,)) the probe is fitted on: those of the training images as they are, at the
    evaluation budget, then of --probe-views augmented views of each (fine-tuning's crops, flips and greys, each batch
    at a budget drawn as a training step draws it): the inputs fine-tuning trains on. View v's batch b is drawn from
    (--seed, VIEW_STEP + v * batches + b) alone: --epochs 0 fits the probe that fine-tuning starts from."""
    import torch

    from .schedule import reseed_for_step

    args, model, batches, device = run["args"], run["model"], run["fixed"], run["device"]
    scale = crop_scale(args.crop_scale)
    read = [head_features(model, batches, run["eval_budget"], device, "linear probe, training features")]
    for number in range(args.probe_views):
        def view(index, inputs, step=VIEW_STEP + number * len(batches)):
            reseed_for_step(args.seed, step + index, 0)
            pixel_values = augment(inputs.pop("pixel_values"), args.hflip, scale, args.grayscale)
            return {**inputs, "pixel_values": pixel_values}, run["draw_budget"](step + index)

        desc = f"linear probe, training view {number + 1}/{args.probe_views}"
        read.append(head_features(model, batches, run["eval_budget"], device, desc, view))
    return torch.cat([features for features, _ in read]), torch.cat([labels for _, labels in read])


def layer_indices(model) -> dict[str, int]:
    """BEiT's layer of every parameter: i + 1 for block i and for VECA's coordinate head that moves the cores block i
    attends with (coordinate_heads.j feeds block j + 1), num_layers + 1 for what is registered after the last block
    (final norm, projection, head), 0 for the rest (embeddings, core bank, LookWhere's selector)."""
    names = [name for name, _ in model.named_parameters()]
    blocks = {name: int(match.group(1)) + 1 for name in names if (match := re.search(r"\.layers\.(\d+)\.", name))}
    heads = {name: int(match.group(1)) + 2 for name in names
             if (match := re.search(r"\.coordinate_heads\.(\d+)\.", name))}
    last_block = max(names.index(name) for name in blocks)
    after = model.config.num_hidden_layers + 1
    return {name: blocks.get(name, heads.get(name, after if index > last_block else 0))
            for index, name in enumerate(names)}


def parameter_groups(model, lr: float, weight_decay: float, layer_decay: float) -> list[dict]:
    """AdamW groups of the trainable parameters: weight decay on matrices only (nanoGPT), and with `layer_decay` < 1
    a learning rate of lr * layer_decay ** (num_layers + 1 - layer) ("lr_scale", which the schedule multiplies)."""
    top, layers, groups = model.config.num_hidden_layers + 1, layer_indices(model), {}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue  # LookWhere's selector
        layer, decayed = layers[name], param.ndim >= 2
        group = groups.setdefault((layer, decayed), {
            "params": [], "weight_decay": weight_decay if decayed else 0.0, "lr_scale": layer_decay ** (top - layer),
        })
        group["params"].append(param)
    return list(groups.values())


def augmentations(args) -> str:
    """The random changes made to the training images, each with the flag that turns it off and when to."""
    return describe(args.hflip, crop_scale(args.crop_scale), args.grayscale)


def train_epoch(model, optimizer, batches, args, draw_budget, first_step: int, total_steps: int, device, desc: str):
    """One epoch of fine-tuning, its budget drawn per step and the learning rate `args.lr * warmup_cosine(step)`
    (times each group's lr_scale); returns the sums of the loss and of the correct predictions, on the device (read
    back once per epoch, not per step)."""
    import torch
    from tqdm.auto import tqdm

    from .schedule import reseed_for_step, warmup_cosine

    scale = crop_scale(args.crop_scale)
    model.train()  # LookWhere's heads keep the selector frozen and in eval mode through train()
    loss_sum, correct = torch.zeros((), device=device), torch.zeros((), device=device)
    warmup = round(args.warmup_epochs * len(batches))
    for step, batch in enumerate(tqdm(batches, desc=desc, leave=False), start=first_step):
        reseed_for_step(args.seed, step, 0)
        for group in optimizer.param_groups:
            group["lr"] = args.lr * warmup_cosine(step, warmup, total_steps, 0.0) * group["lr_scale"]
        pixel_values, labels = batch["pixel_values"].to(device), batch["labels"].to(device)
        pixel_values = augment(pixel_values, args.hflip, scale, args.grayscale)  # drawn after reseed_for_step
        output = model(pixel_values, labels=labels, **draw_budget(step))
        optimizer.zero_grad(set_to_none=True)
        output.loss.backward()
        if args.max_grad_norm:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
        optimizer.step()
        loss_sum += output.loss.detach() * len(labels)
        correct += (output.logits.detach().argmax(-1) == labels).sum()
    return loss_sum, correct


def load_model(args, classes: list[str], device):
    """(the checkpoint's AutoModelForImageClassification with a new head for `classes`, the image processor that gives
    the pixels training and evaluation use: --image-size squared). transformers' load report, which lists the new head
    as "MISSING" (it is: the probe fits it next), is replaced by one line; any other weight the checkpoint lacks, or
    holds unused, is named in a warning."""
    import torch
    from transformers import AutoModelForImageClassification
    from transformers.utils import logging as hf_logging

    from corevision_hf.cli import reading_weights
    from corevision_hf.loading import check_loaded_weights
    from corevision_hf.saving import PROCESSORS

    torch.manual_seed(args.seed)
    labels = {"id2label": dict(enumerate(classes)), "label2id": {name: i for i, name in enumerate(classes)}}
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with reading_weights(args.checkpoint):
            model, report = AutoModelForImageClassification.from_pretrained(
                args.checkpoint, num_labels=len(classes), ignore_mismatched_sizes=True, output_loading_info=True,
                **labels)
    finally:
        hf_logging.set_verbosity(verbosity)
    check_loaded_weights(model, args.checkpoint)
    print(f"a new head for the {len(classes)} classes ({', '.join(classes)}): the linear probe fits it next")
    unmatched = {"missing": report["missing_keys"], "unused": report["unexpected_keys"],
                 "of another shape": {key for key, *_ in report["mismatched_keys"]}}
    for kind, keys in unmatched.items():
        if others := sorted(key for key in keys if not key.startswith("classifier.")):
            print(f"warning: {len(others)} weights {kind} in {args.checkpoint} (newly initialised or ignored), e.g. "
                  f"{', '.join(others[:3])}: is it a {model.config.model_type} checkpoint of this version?")
    # evaluation.probes.load_image's pixels (the loader's): squashed to a square, bicubic, ImageNet-normalised
    processor = PROCESSORS[model.config.model_type](size={"height": args.image_size, "width": args.image_size},
                                                    patch_size=model.config.patch_size)
    return model.to(device), processor


def log_epoch(args, epoch: int, loss: float, train_accuracy: float, validation: dict, **extra) -> None:
    """The epoch's line, printed and appended to OUT/metrics.jsonl (with `extra`, such as the probe's penalty)."""
    print(f"epoch {epoch}/{args.epochs}{' (linear probe)' if epoch == 0 else ''}: loss {loss:.4f}, train accuracy "
          f"{train_accuracy:.4f}, validation accuracy {validation['accuracy']:.4f}")
    append_metrics(args, {"epoch": epoch, "loss": loss, "train_accuracy": train_accuracy, "validation": validation,
                          **extra})


def log_mix(args, mix: float, validation: dict) -> None:
    """A WiSE-FT mix's line (it has no training pass of its own), printed and appended to OUT/metrics.jsonl."""
    print(f"WiSE-FT {mix:g} (epoch {args.epochs}'s weights mixed with the probe's, {1 - mix:g} : {mix:g}): validation "
          f"accuracy {validation['accuracy']:.4f}")
    append_metrics(args, {"epoch": args.epochs, "wise_ft": mix, "validation": validation})


def append_metrics(args, line: dict) -> None:
    """`line` appended to OUT/metrics.jsonl (opened without following a link), marked as the run's."""
    from .checkpointing import RunLog

    RunLog(args.output_dir, "metrics.jsonl").append(line)


def read_folders(args) -> dict:
    """{"train", "validation", "heldout" (None without --eval-data): [(path, label)], "validation_groups" (a key per
    validation image), "classes"} of the run's ImageFolders, checked (the same classes, no image shared, every
    held-out image readable) and printed."""
    examples, classes = labelled_files(args.data, train=True)
    heldout = other_folder(args.eval_data, "--eval-data", classes, {"--data": examples},
                           "held-out images must be ones the model never trains on")
    validation = other_folder(args.val_data, "--val-data", classes, {"--data": examples, "--eval-data": heldout or []},
                              "validation images must be ones the model never trains on and the held-out score "
                              "never chose")
    train, validation = training_split(args, examples, validation)
    if args.val_data:
        print(f"validation: {len(validation)} images of --val-data {args.val_data}; all {len(train)} of --data train")
    # the group of each validation image, which --choose paired resamples whole (without --val-groups: the image)
    groups = source_groups(validation, args.val_groups) if args.val_groups else [path for path, _ in validation]
    if args.val_groups:
        of_all = "" if args.val_data else f" of {len(examples)}"
        total = "" if args.val_data else f" of {len(set(source_groups(examples, args.val_groups)))}"
        print(f"validation: {len(validation)}{of_all} images, {len(set(groups))}{total} groups by --val-groups "
              f"'{args.val_groups}'")
    if heldout:
        check_images_open(heldout, "--eval-data")
    return {"train": train, "validation": validation, "validation_groups": groups, "heldout": heldout,
            "classes": classes}


def checked_config(args):
    """The checkpoint's config, a VECA or LookWhere one; sets args.image_size (default: the config's)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(args.checkpoint)
    if config.model_type not in ("veca", "lookwhere"):
        raise ValueError(f"{args.checkpoint} is a {config.model_type} model: give a VECA or LookWhere checkpoint.")
    args.image_size = args.image_size or config.image_size
    if args.image_size % config.patch_size:
        raise ValueError(f"--image-size {args.image_size} is no multiple of the patch size {config.patch_size}.")
    return config


def keep_if_best(run: dict, epoch: int, result: dict, best, wise_ft: float | None = None):
    """(epoch, validation result, WiSE-FT mix) of the better of the model now and `best` (None: none yet), exporting
    the model as OUT/best when it is the better one (higher accuracy, then lower loss)."""
    from .checkpointing import export

    args = run["args"]
    if best is None or (result["accuracy"], -result["loss"]) > (best[1]["accuracy"], -best[1]["loss"]):
        mixed = {} if wise_ft is None else {"wise_ft": wise_ft}
        export(run["accelerator"], run["model"], args.output_dir, None, SCRIPT, args, "best",
               {"epoch": epoch, **mixed, **result}, processor=run["processor"])
        return epoch, result, wise_ft
    return best


def probe_stage(run: dict) -> tuple:
    """Stage 1, the linear probe (the penalty chosen on validation when several are given), logged as epoch 0 and
    kept as best/ (--choose paired: the first candidate); returns (the penalty, best)."""
    from evaluation.probes import fit_linear_classifier

    args, model, budget, device = run["args"], run["model"], run["eval_budget"], run["device"]
    penalties = probe_penalties(args.probe_weight_decay)
    features, labels = probe_features(run)
    penalty = penalties[0]
    if len(penalties) == 1:
        fold_probe(model, fit_linear_classifier(features, labels, model.config.num_labels, penalty, per_feature=False))
    else:
        held = head_features(model, run["validation"], budget, device, "linear probe, validation features")
        chosen = choose_probe(model, features, labels, *held, penalties)
        print("probe penalty (--probe-weight-decay) chosen on validation: " + ", ".join(
            f"{value:g}{' (kept)' if value == chosen['weight_decay'] else ''}: {accuracy:.4f}"
            for value, accuracy in chosen["validation"].items()))
        penalty = chosen["weight_decay"]
    probe = evaluate(model, run["fixed"], budget, device)
    result = evaluate(model, run["validation"], budget, device, outcomes=args.choose == "paired")
    correct = result.pop("correct", None)
    log_epoch(args, 0, probe["loss"], probe["accuracy"], result, probe_weight_decay=penalty)
    if correct is None:
        return penalty, keep_if_best(run, 0, result, None)
    run["candidates"] = [{"name": "probe", "epoch": 0, "wise_ft": None, "correct": correct, "result": result}]
    return penalty, (0, result, None)


def fine_tune_stage(run: dict, best) -> tuple:
    """Stage 2: --epochs epochs of fine-tuning, each logged and a candidate for best/, the last exported as final/;
    then each --wise-ft mix, a candidate too. With --choose paired the candidates are the probe, the mixes and the last
    epoch alone, and best/ is kept at the end (`keep_chosen`). Returns (best, the last epoch's validation result)."""
    import torch

    from .checkpointing import export

    args, model, device = run["args"], run["model"], run["device"]
    mixes, paired = wise_ft_mixes(args.wise_ft), args.choose == "paired"
    probe_weights = cpu_copy(model) if mixes or paired else None
    optimizer = torch.optim.AdamW(parameter_groups(model, args.lr, args.weight_decay, args.layer_decay))
    batches, result, correct = run["train"], None, None
    for epoch in range(1, args.epochs + 1):
        loss_sum, right = train_epoch(model, optimizer, batches, args, run["draw_budget"], (epoch - 1) * len(batches),
                                      args.epochs * len(batches), device, f"epoch {epoch}")
        if not torch.isfinite(loss_sum):
            raise FloatingPointError(f"The training loss is no longer finite at epoch {epoch}: lower --lr.")
        result = evaluate(model, run["validation"], run["eval_budget"], device, paired and epoch == args.epochs)
        correct = result.pop("correct", None)
        images = run["train_images"]
        log_epoch(args, epoch, loss_sum.item() / images, right.item() / images, result)
        best = best if paired else keep_if_best(run, epoch, result, best)
    result = result or best[1]  # --epochs 0: final/ is the probe
    export(run["accelerator"], model, args.output_dir, None, SCRIPT, args, "final", {"epoch": args.epochs, **result},
           processor=run["processor"])
    weights = {"probe": probe_weights, "fine_tuned": cpu_copy(model) if mixes or paired else None}
    last = [{"name": f"epoch {args.epochs}", "epoch": args.epochs, "wise_ft": None, "correct": correct,
             "result": result}] if correct is not None else []
    for mix in mixes:
        mix_weights(model, weights["probe"], weights["fine_tuned"], mix)
        mixed = evaluate(model, run["validation"], run["eval_budget"], device, paired)
        outcome = mixed.pop("correct", None)
        log_mix(args, mix, mixed)
        if paired:
            run["candidates"].append({"name": f"WiSE-FT {mix:g}", "epoch": args.epochs, "wise_ft": mix,
                                      "correct": outcome, "result": mixed})
        else:
            best = keep_if_best(run, args.epochs, mixed, best, mix)
    if not paired:
        return best, result
    mixed = sorted(run["candidates"][1:], key=lambda candidate: candidate["wise_ft"])  # nearest the probe first
    return keep_chosen(run, run["candidates"][:1] + mixed + last, weights), result


def keep_chosen(run: dict, candidates: list[dict], weights: dict) -> tuple:
    """--choose paired: exports as best/ the candidate training.final_choice keeps, its weights rebuilt from
    `weights` ({"probe", "fine_tuned"}: state dicts on the CPU); prints each candidate's numbers and the reason, and
    writes them to OUT/choice.json. Returns best: (epoch, validation result with "chosen_by", WiSE-FT mix)."""
    from corevision_hf.outputs import record

    from .checkpointing import export
    from .final_choice import choose, difference

    args, model = run["args"], run["model"]
    choice = choose(candidates, run["validation_groups"], args.seed)
    for row in choice["candidates"]:
        versus = f", minus the probe {difference(row['minus_probe'])}" if "minus_probe" in row else ""
        print(f"candidate for best/, {row['name']}: validation accuracy {row['validation_accuracy']:.4f}{versus}")
    print(f"best/ (--choose paired) keeps {'the probe' if choice['kept'] == 'probe' else choice['kept']}: "
          f"{choice['why']}")
    kept = next(candidate for candidate in candidates if candidate["name"] == choice["kept"])
    if kept["wise_ft"] is not None:
        mix_weights(model, weights["probe"], weights["fine_tuned"], kept["wise_ft"])
    else:
        model.load_state_dict(weights["probe"] if kept["epoch"] == 0 else weights["fine_tuned"])
    result = {**kept["result"], "chosen_by": choice["why"]}
    record_of_best = {"epoch": kept["epoch"], **({} if kept["wise_ft"] is None else {"wise_ft": kept["wise_ft"]}),
                      **result}
    export(run["accelerator"], model, args.output_dir, None, SCRIPT, args, "best", record_of_best,
           processor=run["processor"])
    write_json(os.path.join(args.output_dir, "choice.json"), choice)
    record(args.output_dir, ["choice.json"], keep=True)
    return kept["epoch"], result, kept["wise_ft"]


def score_heldout(run: dict, heldout: list, best) -> dict:
    """The held-out result of the folder --evaluate names (best/ by default), measured once on --eval-data, written
    into its heldout.json and printed."""
    from transformers import AutoModelForImageClassification

    from corevision_hf.loading import load_checked
    from corevision_hf.outputs import record_file

    args, device = run["args"], run["device"]
    evaluated = args.evaluate or "best"
    folder = os.path.join(args.output_dir, evaluated)
    scored = load_checked(AutoModelForImageClassification, folder).to(device)
    batches = loader(heldout, args.image_size, args.batch_size, args.num_workers)
    result = evaluate(scored, batches, run["eval_budget"], device)
    write_json(os.path.join(folder, "heldout.json"), {"data": args.eval_data, **result})
    record_file(os.path.join(folder, "heldout.json"))  # in the folder's manifest, beside the export's files
    chosen = f"epoch {best[0]}" + (f", WiSE-FT {best[2]:g}" if best[2] is not None else "")
    print(f"held-out accuracy of {evaluated}/ ({chosen if evaluated == 'best' else f'epoch {args.epochs}'}) on "
          f"{args.eval_data}: {result['accuracy']:.4f} ({result['images']} images)")
    return result


def write_cards(run: dict, argv: list[str], probe_penalty: float, best, final_result: dict, heldout: dict | None):
    """best/README.md and final/README.md; `heldout` (the score of --evaluate's folder) on that folder's card."""
    import shlex

    from corevision_hf.atomic import write_text_atomically
    from corevision_hf.outputs import record_file

    args = run["args"]
    command = " ".join(["python", "-m", SCRIPT, *map(shlex.quote, argv)])
    for name, (epoch, result, wise_ft) in (("best", best), ("final", (args.epochs, final_result, None))):
        scored = heldout if (args.evaluate or "best") == name else None
        text = card(args, command, augmentations(args), run["classes"], run["model_type"], epoch, result, scored,
                    probe_penalty, wise_ft)
        write_text_atomically(os.path.join(args.output_dir, name, "README.md"), text)
        record_file(os.path.join(args.output_dir, name, "README.md"))


def announce(args) -> None:
    """The lines a run starts with: the recipe preset and the augmentations in effect."""
    if recipe := recipe_summary(args):
        print(f"recipe: {recipe}")
    print(f"augmentations of the training images: {augmentations(args)}")


def main(argv=None) -> dict:
    """Runs the command; returns {"best_epoch", "wise_ft", "validation", "heldout", "evaluated"} (heldout None without
    --eval-data)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    give_way(args)
    check_arguments(args)
    import torch

    import corevision_hf  # noqa: F401  (registers VECA and LookWhere with the Auto classes)

    from .run_lock import release_output_dirs

    if args.threads:
        torch.set_num_threads(args.threads)
    announce(args)
    folders = read_folders(args)
    config = checked_config(args)
    draw_budget, eval_budget = budgets(args, config)
    accelerator = open_output_dir(args)
    device = accelerator.device
    model, processor = load_model(args, folders["classes"], device)
    run = {"args": args, "accelerator": accelerator, "model": model, "processor": processor, "device": device,
           "classes": folders["classes"], "model_type": config.model_type,
           "draw_budget": draw_budget, "eval_budget": eval_budget, "train_images": len(folders["train"]),
           "train": loader(folders["train"], args.image_size, args.batch_size, args.num_workers, seed=args.seed),
           "fixed": loader(folders["train"], args.image_size, args.batch_size, args.num_workers),
           "validation": loader(folders["validation"], args.image_size, args.batch_size, args.num_workers),
           "validation_groups": folders["validation_groups"]}
    probe_penalty, best = probe_stage(run)
    best, final_result = fine_tune_stage(run, best)
    write_cards(run, argv, probe_penalty, best, final_result, None)  # before scoring: no folder lacks its card
    heldout = score_heldout(run, folders["heldout"], best) if folders["heldout"] else None
    if heldout:
        write_cards(run, argv, probe_penalty, best, final_result, heldout)
    release_output_dirs()
    return {"best_epoch": best[0], "wise_ft": best[2], "validation": best[1], "heldout": heldout,
            "evaluated": args.evaluate or "best"}


if __name__ == "__main__":
    run_as_command(main)
