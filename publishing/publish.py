"""Publish a distilled checkpoint, or a classifier fine-tuned from one, to the Hugging Face Hub with its model card.

    python -m publishing.publish outputs/run/final --evaluation outputs/eval/evaluation.json --repo-id org/veca-small
    python -m publishing.publish outputs/finetune/best --repo-id org/veca-small-pets

Stages one folder: the weights (safetensors), config.json with `auto_map`, the hub code files, preprocessor_config.json
(the checkpoint's own wins), training_recipe.json (if the checkpoint has one), evaluation.json, the plot (evaluation.png
next to the evaluation JSON, if present; the pictures it names, files inside its folder only) and README.md (the card
rendered by publishing.model_card) and, with `--onnx-elastic`, the elastic ONNX graph as `onnx/model_elastic.onnx`
(`python -m corevision_hf.export --elastic`, checked against PyTorch with onnxruntime; the card shows how to run it);
then uploads it with `HfApi.upload_folder`. An image classifier that `python -m training.finetune` wrote (best/ or
final/, the folder --eval-data scored) takes no --evaluation: it is staged with its heldout.json and validation.json
and a classifier's card (`publishing.model_card.render_classifier_card`). `--dry-run` lists the files and sends
nothing. A repo whose code, config or weights differ from ours holds another model (or another version of this one):
its files of the names we send are only overwritten with `--force` (the repo's history keeps them); no file of the
repo is ever deleted, and those we do not send are named. `--create-pr` proposes the upload as a pull request.

With `--code-repo org/corevision-code`, many weight repos share one code repo: the weight repo gets no code files, its
config's `auto_map`, `custom_pipelines` and processor `auto_map` name `org/corevision-code--modeling_veca.VecaModel`
(transformers' form for code in another repo), and the card's usage pins the code repo's commit (`code_revision=`,
the one way transformers takes a code revision; `--code-revision`, default: the code repo's current commit). The code
repo must hold this package's hub files of the model, byte for byte, at that commit.
"""

import argparse
import contextlib
import hashlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from huggingface_hub import HfApi, constants
from huggingface_hub.errors import HfHubHTTPError, HFValidationError, RepositoryNotFoundError, RevisionNotFoundError
from huggingface_hub.utils import validate_repo_id
from huggingface_hub.utils.sha import git_hash
from transformers import AutoConfig, AutoModel

from corevision_hf.cli import HelpFormatter
import corevision_hf
from corevision_hf import export
from corevision_hf.atomic import write_text_atomically
from corevision_hf.cli import reading_weights, run
from corevision_hf.loading import load_checked
from corevision_hf.offline import use_hub_timeouts
from corevision_hf.outputs import refuse_overlap
from corevision_hf.saving import image_processor_for, save_model_folder
from training.checkpointing import check_export

from .model_card import (
    EVALUATION_FORMAT,
    HELDOUT_FILE,
    RECIPE_FILE,
    VALIDATION_FILE,
    check_classifier,
    existing_pictures,
    is_classifier,
    public_recipe,
    read_classifier_results,
    read_recipe,
    render_card,
    render_classifier_card,
    teacher_on_the_hub,
)


MODEL_TYPES = ("veca", "lookwhere")
ELASTIC_ONNX = "onnx/model_elastic.onnx"  # where onnx-community repos keep their graphs, under onnx/


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("checkpoint", help="a save_pretrained folder, e.g. OUT/final of a distillation run or OUT/best "
                                           "of training.finetune")
    parser.add_argument("--evaluation", default=None,
                        help="evaluation.json written by evaluation.evaluate_budgets (a distilled checkpoint; a "
                             "fine-tuned classifier's card quotes its own heldout.json instead)")
    parser.add_argument("--repo-id", required=True, help='hub repo to publish to, "org/name"')
    parser.add_argument("--private", action="store_true", help="make a new repo private")
    parser.add_argument("--revision", default=None, help="branch to commit to (made if missing)")
    parser.add_argument("--create-pr", action="store_true", help="open a pull request against the default branch")
    parser.add_argument("--force", action="store_true",
                        help="overwrite the files of a repo that holds another model (none is deleted)")
    parser.add_argument("--dry-run", action="store_true", help="stage and list the files, send nothing")
    parser.add_argument("--staging-dir", default=None, help="an empty or new folder to stage in, kept afterwards")
    parser.add_argument("--commit-message", default=None,
                        help='default: "Upload <model type> checkpoint, evaluation and model card"')
    parser.add_argument("--code-repo", default=None,
                        help="a hub repo holding this package's code files, which the weight repo's auto_map then "
                             "names instead of code files of its own (default: none, the code ships with the weights)")
    parser.add_argument("--code-revision", default=None,
                        help="with --code-repo: the commit, branch or tag whose code to pin (default: the code repo's "
                             "current commit; needed with --dry-run, which asks the hub nothing)")
    parser.add_argument("--onnx-elastic", action="store_true",
                        help=f"also export the model as one ONNX graph for every budget to {ELASTIC_ONNX} (VECA's "
                             "num_cores, LookWhere's k_ratio an input of the graph), which the card shows how to run")
    return parser.parse_args(argv)


def check_repo_id(option: str, repo_id: str) -> None:
    try:
        validate_repo_id(repo_id)
        if "/" not in repo_id:
            raise HFValidationError("no namespace")
    except HFValidationError as e:
        raise ValueError(
            f"{option} {repo_id!r} is not a hub repo id ({e}). Expected 'org/name' with letters, digits, '-', "
            "'_' or '.', e.g. my-org/veca-small."
        ) from None


def check_inputs(args: argparse.Namespace) -> tuple:
    """Every check that needs no model: returns (config, parsed evaluation or None for a classifier, plot path or
    None)."""
    check_options(args)
    config = read_config(args.checkpoint)
    if is_classifier(config):
        check_classifier_inputs(args)
        return config, None, None
    if args.evaluation is None:
        raise ValueError(f"{args.checkpoint} is a distilled {config.model_type} checkpoint, whose card is built from "
                         "its evaluation: pass --evaluation, the evaluation.json of evaluation.evaluate_budgets.")
    evaluation = read_evaluation(args.evaluation, config.model_type, args.checkpoint)
    folder = os.path.dirname(os.path.abspath(args.evaluation))
    plot = os.path.join(folder, "evaluation.png")
    pictures = [os.path.join(folder, file) for file in existing_pictures(evaluation, args.evaluation).values()]
    refuse_links([*checkpoint_files(args.checkpoint), args.evaluation, plot, *pictures])
    return config, evaluation, plot if os.path.isfile(plot) else None


def check_options(args: argparse.Namespace) -> None:
    """The checks of the command's options alone."""
    check_repo_id("--repo-id", args.repo_id)
    if args.code_repo:
        check_repo_id("--code-repo", args.code_repo)
    if args.code_revision and not args.code_repo:
        raise ValueError("--code-revision pins the code of --code-repo: add --code-repo, or leave --code-revision out.")
    if args.code_repo and args.dry_run and not args.code_revision:
        raise ValueError("--dry-run asks the hub nothing, so it cannot look up the commit of --code-repo: give "
                         "--code-revision.")
    if args.create_pr and args.revision not in (None, constants.DEFAULT_REVISION):
        raise ValueError(
            f"--create-pr opens a pull request against the default branch; it cannot target --revision "
            f"{args.revision!r}. Drop one of the two."
        )
    if not args.dry_run and constants.is_offline_mode():
        raise RuntimeError("HF_HUB_OFFLINE is set, so nothing can be uploaded: unset it, or pass --dry-run.")
    if args.staging_dir and os.path.isdir(args.staging_dir) and os.listdir(args.staging_dir):
        raise ValueError(
            f"--staging-dir {args.staging_dir} is not empty and everything in it would be uploaded: give a new or "
            "empty folder."
        )
    if args.staging_dir:
        refuse_overlap(args.staging_dir, args.checkpoint, *([args.evaluation] if args.evaluation else []))
    if args.onnx_elastic and not all(importlib.util.find_spec(name) for name in ("onnx", "onnxruntime")):
        raise ValueError("--onnx-elastic writes the graph with onnx and checks it with onnxruntime: pip install onnx "
                         "onnxruntime, or leave --onnx-elastic out.")


def read_config(checkpoint: str):
    """The checkpoint's config, checked to be a VECA or LookWhere of classes corevision_hf has."""
    check_export(checkpoint)
    config_path = os.path.join(checkpoint, "config.json")
    try:
        with open(config_path) as f:
            model_type = json.load(f).get("model_type")
        config = AutoConfig.from_pretrained(checkpoint) if model_type in MODEL_TYPES else None
    except (ValueError, TypeError, AttributeError) as error:  # not JSON, no object, or fields a config refuses
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise ValueError(f"{config_path} is not a valid model config ({reason[:200]}): pass the folder "
                         "save_pretrained wrote.") from None
    if model_type not in MODEL_TYPES:
        raise ValueError(f"{checkpoint} holds a {model_type!r} model; publish.py publishes {' or '.join(MODEL_TYPES)}.")
    for name in config.architectures or []:
        if name not in corevision_hf.__all__:
            raise ValueError(f"{checkpoint}/config.json names architecture {name!r}, which corevision_hf lacks.")
    return config


def check_classifier_inputs(args: argparse.Namespace) -> None:
    """A fine-tuned classifier: no --evaluation or --onnx-elastic, and the recipe and held-out result its card needs."""
    if args.evaluation is not None:
        raise ValueError(f"{args.checkpoint} is an image classifier: its card quotes its own {HELDOUT_FILE}, not a "
                         "feature evaluation; leave --evaluation out.")
    if args.onnx_elastic:
        raise ValueError(f"{args.checkpoint} is an image classifier and the elastic graph is the feature extractor's "
                         "alone: leave --onnx-elastic out.")
    refuse_links(checkpoint_files(args.checkpoint))
    check_classifier(read_recipe(args.checkpoint), read_classifier_results(args.checkpoint)[0])


def read_evaluation(path: str, model_type: str, checkpoint: str) -> dict:
    """The parsed evaluation JSON at `path`, checked to be of the format evaluate_budgets writes and of `model_type`."""
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"Evaluation file {path} does not exist: run python -m evaluation.evaluate_budgets on the checkpoint."
        )
    try:
        with open(path) as f:
            evaluation = json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON ({e}): pass what evaluate_budgets.py wrote.") from None
    if not isinstance(evaluation, dict) or evaluation.get("format") != EVALUATION_FORMAT:
        raise ValueError(
            f"{path} is not a {EVALUATION_FORMAT!r} evaluation: pass the evaluation.json that "
            "evaluation.evaluate_budgets wrote."
        )
    if evaluation.get("model_type") != model_type:
        raise ValueError(
            f"{path} evaluates a {evaluation.get('model_type')!r} model but {checkpoint} holds a "
            f"{model_type!r} one: pass the evaluation of this checkpoint."
        )
    return evaluation


# The checkpoint's files that publishing reads and stages, beside its weights (any safetensors or PyTorch file, index).
CHECKPOINT_FILES = ("config.json", "preprocessor_config.json", RECIPE_FILE, HELDOUT_FILE, VALIDATION_FILE)


def checkpoint_files(checkpoint: str) -> list[str]:
    """The paths of the files of `checkpoint` whose content the staged folder carries."""
    return [os.path.join(checkpoint, name) for name in sorted(os.listdir(checkpoint))
            if name in CHECKPOINT_FILES or name.endswith((".safetensors", ".bin", ".index.json"))]


def refuse_links(paths: list[str]) -> None:
    """Raises ValueError naming the first of `paths` that is a symbolic link: what it points at (any file, a secret)
    would be published under its name."""
    for path in paths:
        if os.path.islink(path):
            raise ValueError(f"{path} is a symbolic link: publish stages files, never what a link points to; put the "
                             "file itself there.")


def stage(checkpoint: str, evaluation_path: str | None, plot: str | None, config, card, folder: str,
          repo_id: str) -> None:
    """Writes everything the hub repo gets into `folder`: the model re-saved by the package (safetensors, config with
    auto_map, hub code, preprocessor config), the training recipe if any, the evaluation and the plot (a classifier,
    `evaluation_path` None: its held-out and validation results) and the card. The recipe and the results are the
    public versions: no path of this machine is published."""
    model_class = getattr(corevision_hf, config.architectures[0]) if config.architectures else AutoModel
    with reading_weights(checkpoint):
        model = load_checked(model_class, checkpoint, dtype="auto")  # keeps the checkpoint's dtype
    save_model_folder(model, folder, image_processor_for(config, checkpoint))  # the checkpoint's own processor wins
    recipe = read_recipe(checkpoint)
    if recipe is not None:
        write_json(os.path.join(folder, RECIPE_FILE), public_recipe(recipe))
    card.save(os.path.join(folder, "README.md"))
    if evaluation_path is None:
        for name, result in zip((HELDOUT_FILE, VALIDATION_FILE), read_classifier_results(checkpoint)):
            if result is not None:
                write_json(os.path.join(folder, name), public_result(result))
        return
    with open(evaluation_path) as f:
        evaluation = json.load(f)
    write_json(os.path.join(folder, "evaluation.json"), public_evaluation(evaluation, repo_id))
    if plot is not None:
        shutil.copy(plot, os.path.join(folder, "evaluation.png"))
    for picture in existing_pictures(evaluation, evaluation_path).values():  # files inside the evaluation's folder
        os.makedirs(os.path.dirname(os.path.join(folder, picture)), exist_ok=True)
        shutil.copy(os.path.join(os.path.dirname(os.path.abspath(evaluation_path)), picture),
                    os.path.join(folder, picture))


def stage_elastic_graph(checkpoint: str, folder: str) -> None:
    """Writes the checkpoint's elastic graph (float32; VECA's num_cores, LookWhere's k_ratio an input) to
    `folder`/onnx/model_elastic.onnx and prints how far onnxruntime is from PyTorch at its budgets, as
    `python -m corevision_hf.export --elastic` does."""
    config = export.load_config(checkpoint)
    budget = export.budget_for(config, elastic="")
    with reading_weights(checkpoint):
        model = export.load_model(checkpoint, config)
    path = os.path.join(folder, ELASTIC_ONNX)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    export.export_onnx(model, path, budget)
    export.report_checks(model, path, budget)


def code_files(model_type: str) -> dict[str, bytes]:
    """The hub files of a model as this package holds them (what save_pretrained copies): name -> bytes."""
    folder = Path(corevision_hf.__file__).parent / model_type
    return {path.name: path.read_bytes() for path in sorted(folder.glob(f"*_{model_type}.py"))}


def code_commit(api: HfApi, code_repo: str, revision: str | None, model_type: str) -> str:
    """The commit of `code_repo` at `revision` (default: its default branch), after checking that it holds this
    package's hub files of the model, byte for byte; a RuntimeError in one line otherwise."""
    try:
        info = api.model_info(code_repo, revision=revision, files_metadata=True)
    except RepositoryNotFoundError:
        raise RuntimeError(f"--code-repo {code_repo} does not exist on the hub: create it and upload this package's "
                           f"code files there first, or leave --code-repo out to ship the code with the weights.") from None
    except RevisionNotFoundError:
        raise RuntimeError(f"--code-repo {code_repo} has no revision {revision!r}: give --code-revision a commit, "
                           "branch or tag it has.") from None
    held = {sibling.rfilename: sibling.blob_id for sibling in info.siblings or []}
    differ = sorted(name for name, data in code_files(model_type).items() if held.get(name) != git_hash(data))
    if differ:
        raise RuntimeError(f"{code_repo} at {info.sha} lacks this package's {', '.join(differ)} (missing or other "
                           "code): upload them there first (docs/evaluation-and-publishing.md), or pin another "
                           "--code-revision.")
    return info.sha


def point_at_code_repo(folder: str, code_repo: str) -> None:
    """Turns a staged folder into one that uses `code_repo`'s code: its code files are removed, and every class
    reference of config.json (auto_map, custom_pipelines) and preprocessor_config.json (auto_map) names the repo."""
    for name in os.listdir(folder):
        if name.endswith(".py"):
            os.remove(os.path.join(folder, name))
    for name in ("config.json", "preprocessor_config.json"):
        path = os.path.join(folder, name)
        with open(path) as f:
            content = json.load(f)
        content["auto_map"] = {key: f"{code_repo}--{value}" for key, value in content.get("auto_map", {}).items()}
        for task in (content.get("custom_pipelines") or {}).values():
            task["impl"] = f"{code_repo}--{task['impl']}"
        write_json(path, content)


def write_json(path: str, value: dict) -> None:
    write_text_atomically(path, json.dumps(value, indent=2))  # never through a link at `path`


def public_evaluation(evaluation: dict, repo_id: str) -> dict:
    """The evaluation as it may be published: it names the repo instead of the local checkpoint folder, and the
    teacher by its hub id (or a placeholder when it is a local folder of no known hub model)."""
    teacher = evaluation.get("teacher")
    if teacher:
        hub_id = teacher_on_the_hub(teacher)[0]
        teacher = hub_id or public_recipe({"teacher": teacher})["teacher"]
    return {**evaluation, "checkpoint": repo_id, "teacher": teacher}


def public_result(result: dict) -> dict:
    """A classifier's heldout.json or validation.json as it may be published: its data named without a local path."""
    return {**result, "data": public_recipe({"data": result["data"]})["data"]} if result.get("data") else result


def staged_files(folder: str) -> dict[str, int]:
    """Path in the repo -> size in bytes, for every file under `folder`."""
    files = {}
    for root, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(root, name)
            files[os.path.relpath(path, folder).replace(os.sep, "/")] = os.path.getsize(path)
    return dict(sorted(files.items()))


# Files that make a repo hold a particular model: its code, its config and its weights.
MODEL_FILE_SUFFIXES = (".py", ".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".onnx", ".index.json")


def is_model_file(path: str) -> bool:
    return path == "config.json" or path.endswith(MODEL_FILE_SUFFIXES)


def model_conflicts(info, folder: str) -> list[str]:
    """The repo's code, config and weight files whose content differs from the staged file of that name: a repo with
    any of them holds another model (or another version of this one). Contents are compared by git blob id, or by
    sha256 for files stored with LFS. `info` is a ModelInfo with files metadata."""
    conflicts = []
    for sibling in info.siblings or []:
        local = os.path.join(folder, sibling.rfilename)
        if not is_model_file(sibling.rfilename) or not os.path.isfile(local):
            continue
        with open(local, "rb") as f:
            data = f.read()
        same = hashlib.sha256(data).hexdigest() == sibling.lfs.sha256 if sibling.lfs else git_hash(data) == sibling.blob_id
        if not same:
            conflicts.append(sibling.rfilename)
    return sorted(conflicts)


def remote_info(api: HfApi, repo_id: str, revision: str | None):
    """The repo at the revision we would commit to (a missing branch starts from the default one), or None when
    the repo does not exist."""
    try:
        return api.model_info(repo_id, revision=revision, files_metadata=True)
    except RevisionNotFoundError:
        return api.model_info(repo_id, files_metadata=True)
    except RepositoryNotFoundError:
        return None


def human_size(size: int) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000


@contextlib.contextmanager
def reaching_the_hub(repo_id: str):
    """Hub calls with connect and read timeouts, their failures as one RuntimeError line."""
    use_hub_timeouts()
    try:
        yield
    except HfHubHTTPError as error:  # the hub answered, and said no
        raise RuntimeError(f"The hub refused the upload to {repo_id}: {str(error).splitlines()[0]}") from None
    except RuntimeError:
        raise
    except Exception as error:  # no network, DNS, proxy, TLS: each means the hub was not reached
        raise RuntimeError(
            f"Could not reach the hub ({type(error).__name__}: {error}): check the network and your token "
            "(huggingface-cli login), or pass --dry-run to stage the files without sending them."
        ) from None


def main(argv=None) -> None:
    args = parse_args(argv)
    config, evaluation, plot = check_inputs(args)
    code_revision = args.code_revision
    if args.code_repo and not args.dry_run:  # before any work: a code repo that cannot serve is one line
        with reaching_the_hub(args.repo_id):
            code_revision = code_commit(HfApi(), args.code_repo, args.code_revision, config.model_type)
    # the card needs only the config and the evaluation, so an evaluation it cannot use fails before the model loads
    card = make_card(args, config, evaluation, plot, code_revision)
    revision = args.revision or constants.DEFAULT_REVISION
    target = (
        f"{args.repo_id} ({'pull request against ' if args.create_pr else ''}{revision}, "
        f"{'private' if args.private else 'default visibility'})"
    )

    if args.staging_dir:
        os.makedirs(args.staging_dir, exist_ok=True)
        staging = contextlib.nullcontext(args.staging_dir)
    else:
        staging = tempfile.TemporaryDirectory(prefix="publish-")
    with staging as folder:
        print(f"staging {args.checkpoint} for {args.repo_id} in {folder}")
        stage(args.checkpoint, args.evaluation, plot, config, card, folder, args.repo_id)
        if args.onnx_elastic:
            stage_elastic_graph(args.checkpoint, folder)
        if args.code_repo:
            point_at_code_repo(folder, args.code_repo)
        files = staged_files(folder)
        listing = "\n".join(f"  {path:<32} {human_size(size):>10}" for path, size in files.items())
        if args.dry_run:
            print(f"Would upload {len(files)} files to {target}:\n{listing}")
            print("Dry run: nothing was sent." + (f" Staged in {folder}." if args.staging_dir else ""))
            return

        with reaching_the_hub(args.repo_id):
            upload(args, config, folder, files, target, listing)


def make_card(args: argparse.Namespace, config, evaluation: dict | None, plot: str | None, code_revision: str | None):
    """The checkpoint's card: a classifier's (`evaluation` None) from its recipe and results, else the feature
    extractor's from its evaluation."""
    if evaluation is None:
        heldout, validation = read_classifier_results(args.checkpoint)
        return render_classifier_card(config, read_recipe(args.checkpoint), heldout, validation, repo_id=args.repo_id,
                                      code_repo=args.code_repo, code_revision=code_revision)
    return render_card(
        config, evaluation, read_recipe(args.checkpoint), repo_id=args.repo_id,
        plot_filename="evaluation.png" if plot is not None else None,
        pictures=existing_pictures(evaluation, args.evaluation), code_repo=args.code_repo, code_revision=code_revision,
        elastic_onnx=ELASTIC_ONNX if args.onnx_elastic else None,
    )


def upload(args, config, folder: str, files: dict, target: str, listing: str) -> None:
    """Checks the remote repo (another model there needs --force) and sends the staged folder in one commit."""
    api = HfApi()
    info = None if args.create_pr else remote_info(api, args.repo_id, args.revision)
    conflicts = model_conflicts(info, folder) if info is not None else []
    if conflicts and not args.force:
        raise RuntimeError(
            f"{args.repo_id} already holds another model (its {', '.join(conflicts)} differ from this checkpoint's): "
            "another model, or another version of this one, lives there. Pass --force to overwrite it, use a new "
            "--repo-id, or --create-pr to propose the change."
        )
    if conflicts:
        print(f"--force: overwriting the model in {args.repo_id} ({', '.join(conflicts)}).")
        # nothing is deleted: a file we do not send may be the user's own (an ONNX export, say)
        kept = sorted(sibling.rfilename for sibling in info.siblings or []
                      if is_model_file(sibling.rfilename) and sibling.rfilename not in files)
        if kept:
            print(f"Kept in {args.repo_id}, not ours to delete: {', '.join(kept)} (delete them on the hub if they "
                  "belong to the old model).")
    if info is not None and args.private and not info.private:
        print(f"{args.repo_id} already exists and is public; --private only applies to new repos.")

    # private=None leaves a new repo at its namespace's default visibility
    api.create_repo(args.repo_id, private=args.private or None, exist_ok=True)
    if (args.revision or constants.DEFAULT_REVISION) != constants.DEFAULT_REVISION:
        api.create_branch(args.repo_id, branch=args.revision, exist_ok=True)
    print(f"Uploading {len(files)} files to {target}:\n{listing}")
    commit = api.upload_folder(
        repo_id=args.repo_id,
        folder_path=folder,
        revision=args.revision,
        create_pr=args.create_pr,
        commit_message=args.commit_message or f"Upload {config.model_type} checkpoint, evaluation and model card",
    )
    print(f"Published: {commit.pr_url or commit.commit_url}")


def cli(argv=None) -> int:
    """The command line: a bad input or an unreachable hub ends in one line on stderr and exit status 2."""
    return run(main, argv, errors=(ValueError, FileNotFoundError, FileExistsError, RuntimeError))


if __name__ == "__main__":
    sys.exit(cli())
