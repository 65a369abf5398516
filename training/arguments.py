"""The command-line arguments both distillation scripts share, and how every training script runs as a command.

Deliberately light (argparse only): the scripts parse their arguments before importing torch, so `--help` answers
at once.
"""

import argparse
import sys

# --map-queries: the teacher queries whose attention is LookWhere's map target (training.teacher's)
MAP_QUERIES = ("patches", "authors", "cls")
SEED_MAX = 2**32 - 1  # the largest seed NumPy's seeding takes (Accelerate's set_seed seeds NumPy too)


def parse_seed(text: str) -> int:
    """The argparse type of every command's --seed: a whole number from 0 to SEED_MAX, checked as it is parsed (torch
    and NumPy refuse larger or negative seeds only once the run has started, in their own words)."""
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or not 0 <= value <= SEED_MAX:
        raise argparse.ArgumentTypeError(f"must be a whole number from 0 to {SEED_MAX} (2**32 - 1), got {text!r}")
    return value


def run_as_command(main) -> None:
    """Calls a training script's `main()`; what it raises ends the process with `corevision_hf.cli.exit_status`'s
    line and status. That module (and so torch) is imported only then, so that `--help` answers at once."""
    try:
        main()
    except (Exception, KeyboardInterrupt) as error:
        from corevision_hf.cli import exit_status

        sys.exit(exit_status(error))


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The module docstring as written, and every argument's default."""


def training_parser(description: str, lr: float, min_lr: float, weight_decay: float) -> argparse.ArgumentParser:
    """A parser holding the arguments of the shared loop (data, optimisation, checkpoints, validation, logging), with
    the method's own optimiser defaults. Each script adds its method's arguments to it; `parse` reads it."""
    parser = argparse.ArgumentParser(description=description, formatter_class=HelpFormatter)
    parser.add_argument("--recipe", default=None,
                        help="the authors' settings from training/recipes/NAME.yaml (veca-pretrain, veca-multires, "
                             "lookwhere-dinov2); any flag given here overrides the recipe's value")
    parser.add_argument("--teacher", required=True, help="hub id, save_pretrained folder, or offline-dinov2-small")
    parser.add_argument("--teacher-cache", type=int, default=0, metavar="CYCLE",
                        help="reuse teacher targets: crops repeat every CYCLE epochs, targets computed once (0: off)")
    parser.add_argument("--teacher-dtype", default="fp32", choices=["fp32", "bf16"],
                        help="the teacher's weights and forward, outside the student's autocast (bf16: half the memory)")
    parser.add_argument("--data", required=True,
                        help="an image folder (labels ignored), a save_to_disk or parquet folder, or a datasets name")
    parser.add_argument("--streaming", action="store_true",
                        help="stream the data instead of reading it whole; each process reads its own shards")
    parser.add_argument("--shuffle-buffer", type=int, default=1000,
                        help="with --streaming: examples held in the shuffle buffer (the shard order is shuffled too)")
    parser.add_argument("--image-column", default="image",
                        help="the column holding the images (webdataset shards: jpg, jpeg, png or webp, found alone)")
    parser.add_argument("--augment", default="simple", choices=["simple", "veca", "lookwhere"],
                        help="training crops: simple (random resized crop 0.25-1 + flip), or the VECA / LookWhere "
                             "authors' pipelines (torchvision / timm: the train extra)")
    parser.add_argument("--output-dir", required=True, help="a new folder, or the folder of the run to --resume")
    parser.add_argument("--batch-size", type=int, default=32, help="images per process per micro-batch")
    parser.add_argument("--max-steps", type=int, required=True, help="optimisation steps")
    parser.add_argument("--optimizer", default="adamw", choices=["adamw", "normuon"],
                        help="normuon: NorMuon on the VECA authors' matrices, AdamW for the rest (VECA only)")
    parser.add_argument("--lr", type=float, default=lr, help="peak learning rate")
    parser.add_argument("--min-lr", type=float, default=min_lr, help="learning rate at the end of the cosine")
    parser.add_argument("--warmup-steps", type=int, default=0, help="linear warm-up, in optimisation steps")
    parser.add_argument("--warmup-start-lr", type=float, default=0.0, help="learning rate of the first warm-up step")
    parser.add_argument("--weight-decay", type=float, default=weight_decay)
    parser.add_argument("--gradient-accumulation-steps", type=int, default=1)
    parser.add_argument("--compile", action="store_true",
                        help="torch.compile the student (inductor; also what accelerate launch --dynamo_backend asks), "
                             "with budgets and image sizes as symbols: one graph, not one per core budget or size")
    parser.add_argument("--gradient-checkpointing", action="store_true",
                        help="recompute each layer's activations in the backward pass: less memory, about a third slower")
    parser.add_argument("--max-grad-norm", type=float, default=1.0, help="gradient clipping; 0: none")
    parser.add_argument("--mixed-precision", default=None, choices=["no", "bf16", "fp16"],
                        help="the student's autocast (default: the accelerate config's, else no)")
    parser.add_argument("--tf32", action=argparse.BooleanOptionalAction, default=True,
                        help="TensorFloat-32 for float32 matmuls on CUDA (no effect elsewhere)")
    parser.add_argument("--checkpoint-every", type=int, default=1000, help="optimisation steps between checkpoints")
    parser.add_argument("--keep-checkpoints", type=int, default=3, help="newest checkpoints kept")
    parser.add_argument("--eval-every", type=int, default=0,
                        help="optimisation steps between validations on --eval-data; the best is kept as OUT/best (0: "
                             "none)")
    parser.add_argument("--eval-data", default=None, help="held-out images for --eval-every (as --data)")
    parser.add_argument("--eval-images", type=int, default=64, help="held-out images used per validation")
    parser.add_argument("--resume", action="store_true",
                        help="continue the run in --output-dir from its last checkpoint")
    parser.add_argument("--overwrite", action="store_true",
                        help="delete the run already in --output-dir (only what a run writes there) and start anew")
    parser.add_argument("--log-every", type=int, default=1,
                        help="steps per line of metrics.jsonl, the means since the last line (also a line at every "
                             "checkpoint, validation and the end): values are read from the device on these steps "
                             "only, so on GPUs a larger value lets the device run ahead")
    parser.add_argument("--log-with", default="auto",
                        help='tracker: "auto" (tensorboard when installed), "none", or any accelerate tracker name')
    parser.add_argument("--collective-timeout", type=int, default=600,
                        help="seconds a process waits for the others at a collective operation before the run stops "
                             "(a stopped, stuck or dead process)")
    parser.add_argument("--num-workers", type=int, default=None,
                        help="DataLoader worker processes per process, kept for the whole run (default: half the CPU "
                             "cores per process, at most 4)")
    parser.add_argument("--seed", type=parse_seed, default=0)
    parser.add_argument("--stop-at-step", type=int, default=None, help=argparse.SUPPRESS)  # simulates a crash (tests)
    return parser


def parse(parser: argparse.ArgumentParser, argv: list[str] | None, script: str) -> argparse.Namespace:
    """Parses `argv`; with `--recipe NAME`, the recipe's values become the defaults first, so that a flag given on the
    command line overrides them. A recipe value of null marks an argument that recipe needs from the command line."""
    first = argparse.ArgumentParser(add_help=False)
    first.add_argument("--recipe", default=None)
    recipe = first.parse_known_args(argv)[0].recipe
    if recipe is None:
        return parser.parse_args(argv)
    values = recipe_defaults(parser, recipe, script)
    for action in parser._actions:  # a value the recipe gives is no longer required on the command line
        if values.get(action.dest) is not None:
            action.required = False
    parser.set_defaults(**{name: value for name, value in values.items() if value is not None})
    args = parser.parse_args(argv)
    for name, value in values.items():
        if value is None and getattr(args, name) is None:
            raise ValueError(f"--recipe {recipe} needs --{name.replace('_', '-')} (see training/recipes/{recipe}.yaml).")
    return args


def recipe_defaults(parser: argparse.ArgumentParser, name: str, script: str) -> dict:
    """Recipe `name`'s values for `script`'s parser, each as its flag would give it (`recipe_value`); raises
    ValueError for another script's recipe, a value the parser does not know or one its flag would refuse (a recipe
    file is reviewed, but checked here too)."""
    from .recipes import load_recipe

    values = load_recipe(name)
    owner = values.pop("script")
    if owner != script:
        raise ValueError(f"--recipe {name} is a recipe of {owner}, not of {script}.")
    actions = {action.dest: action for action in parser._actions}
    unknown = sorted(set(values) - set(actions))
    if unknown:
        raise ValueError(f"training/recipes/{name}.yaml sets {', '.join(unknown)}, which {script} does not take.")
    return {key: recipe_value(actions[key], value, f"training/recipes/{name}.yaml") for key, value in values.items()}


def recipe_value(action: argparse.Action, value, recipe: str):
    """A recipe's `value` for `action`'s argument through the checks its flag goes through (the type, such as a range,
    and the choices), as the flag's text would be: argparse applies neither to a default that is not a string. None
    stays None (needed from the command line); a switch takes true or false."""
    flag = next((option for option in action.option_strings if option.startswith("--")), action.dest)
    if value is None:
        return None
    if action.nargs == 0:  # store_true, BooleanOptionalAction
        if not isinstance(value, bool):
            raise ValueError(f"{recipe} sets {action.dest} to {value!r}: {flag} is a switch, give true or false.")
        return value
    many = action.nargs not in (None, "?")
    values = value if many and isinstance(value, list) else [value]
    if any(isinstance(item, (bool, list, dict)) for item in values) or (many and not isinstance(value, list)):
        wanted = "a list of values" if many else f"one value, as {flag} VALUE takes"
        raise ValueError(f"{recipe} sets {action.dest} to {value!r}: give {wanted}.")
    checked = []
    for item in values:
        try:
            item = str(item) if action.type is None else action.type(str(item))
        except (argparse.ArgumentTypeError, TypeError, ValueError) as error:
            reason = str(error) if isinstance(error, argparse.ArgumentTypeError) else f"not a valid {flag} value"
            raise ValueError(f"{recipe} sets {action.dest} to {value!r}: {reason} ({flag}'s check).") from None
        if action.choices is not None and item not in action.choices:
            raise ValueError(f"{recipe} sets {action.dest} to {value!r}: {flag} takes one of "
                             f"{', '.join(map(str, action.choices))}.")
        checked.append(item)
    return checked if many else checked[0]


def parse_config_overrides(text: str) -> dict:
    """--config-overrides: a JSON object of model config fields; raises ValueError for anything else."""
    import json

    try:
        overrides = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"--config-overrides is not valid JSON ({error}): e.g. '{{\"num_hidden_layers\": 6}}'.") from None
    if not isinstance(overrides, dict):
        raise ValueError(f"--config-overrides must be a JSON object of config fields, got {text!r}.")
    return overrides


def check_positive(args: argparse.Namespace, *names: str) -> None:
    """Raises ValueError naming the first of `names` (argument attributes) that is not a positive number."""
    for name in names:
        if getattr(args, name) <= 0:
            raise ValueError(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}.")
