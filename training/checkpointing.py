"""The run's record (`run.json`: script, arguments, processes), Accelerate checkpoints with the step and data position
they were taken at (for `--resume`), the final export and the end of a run, and what --overwrite may delete: only the
run's own files, each marked as it is written (`unmarked_run_files`)."""

import contextlib
import gc
import hashlib
import json
import os
import pickle
import re
import shlex
import shutil
import sys

import torch
from accelerate import Accelerator
from accelerate.utils import broadcast_object_list, gather_object, load
from accelerate.utils.constants import RNG_STATE_NAME
from safetensors import SafetensorError

from corevision_hf.atomic import write_text_atomically
from corevision_hf.cli import RunStopped
from corevision_hf.outputs import MANIFEST as RUN_MANIFEST
from corevision_hf.outputs import files_under, is_ours, read_manifest, record, running_sha256, sha256
from corevision_hf.saving import save_model_folder

from .run_lock import release_output_dirs
from .teacher_mean import load_state, save_state

# Arguments a resumed run may change: where and how often things are written, how (not what) is computed, and the step
# size (a run that diverged
# continues from its last good checkpoint with a lower learning rate or tighter clipping).
RESUMABLE = ("resume", "overwrite", "stop_at_step", "checkpoint_every", "keep_checkpoints", "log_every", "log_with",
             "output_dir", "lr", "min_lr", "max_grad_norm", "compile", "gradient_checkpointing", "collective_timeout")
# What a run writes into its --output-dir: what makes a folder "used", and all that --overwrite deletes.
RUN_FILES = ("run.json", "metrics.jsonl", "validation.jsonl", "checkpoints", "final", "best", "teacher_cache", "logs")
MANIFEST = "manifest.json"
# The run's image-folder listing (training.data.cached_image_files): made once, read by every process and by a resume.
# Alone it does not make a folder used (a setup that failed after listing leaves it); a new run lists anew.
LISTING = "image_files.json"
# How --overwrite knows each entry for the run's own, by a mark no user writes by accident: run.json, the logs
# (metrics.jsonl, validation.jsonl, logs/) and the listing are listed with their sha256 in OUT's manifest
# (corevision_hf.outputs.MANIFEST, `RUN_MANIFEST` here); every file of best/ and final/ in the export's own; every file
# of a checkpoint in its manifest.json; the teacher cache's files by their names (training.teacher_cache's, and the
# temporaries corevision_hf.atomic makes of them). A `.partial` folder is an export or checkpoint cut short, the run's
# own scratch, which it deletes itself before writing that export or checkpoint again.
TEACHER_CACHE_NAME = r"(\d+_\d+\.safetensors|cache_info\.json)"
TEACHER_CACHE_FILE = re.compile(rf"{TEACHER_CACHE_NAME}|\.{TEACHER_CACHE_NAME}\.\w+\.tmp")


def write_json(path: str, value) -> None:
    """Writes `value` as JSON through `atomic.write_text_atomically`: a reader never sees half a file, and no link at
    the path or beside it is written through."""
    write_text_atomically(path, json.dumps(value, indent=1))


def run_record(script: str, args, num_processes: int) -> dict:
    """What `run.json` holds: the script's module (training.distill_veca), every argument and the number of
    processes."""
    return {"script": script, "args": vars(args), "num_processes": num_processes}


# Every argument added to the scripts after their first version (git log -S add_argument -- training/), with the
# value that gives the run as it was before the argument existed: a run.json that lacks one resumes at that value, and
# at no other. A missing argument not named here (--shuffle-buffer: streams were not shuffled before it) is refused.
BEFORE_IT_EXISTED = {
    # the recipes, validation and VECA stage 2 (#25)
    "recipe": None, "augment": "simple", "optimizer": "adamw", "warmup_start_lr": 0.0, "eval_every": 0,
    "eval_data": None, "eval_images": 64, "eval_budgets": None, "eval_resolutions": None, "teacher_microbatch": None,
    "init_from": None, "patch_embed_from_teacher": False, "batch_sizes": None,
    # training at scale (#27): TF32 was torch's default, off; one image column was read, "image"
    "teacher_dtype": "fp32", "tf32": False, "image_column": "image",
    # LookWhere: the teacher cache, the authors' step (#36), the extractor's warm-up
    "teacher_cache": 0, "k_slots": None, "config_overrides": "{}", "map_queries": "patches",
    "freeze_extractor_steps": 0, "extractor_warmup_steps": None,
    # VECA from its teacher's weights (#47)
    "init_from_teacher": False,
}


def check_new_or_resumed_run(output_dir: str, record: dict) -> None:
    """Raises ValueError, before anything is written, unless `output_dir` can take the run `record` describes: a new
    run into a folder that holds none of `RUN_FILES` (with --overwrite, one that does; other files may sit beside
    them), or a resume of the run there by the same script, with the same arguments (but `RESUMABLE`) and number of
    processes."""
    path = os.path.join(output_dir, "run.json")
    script, args = record["script"], record["args"]
    if args.get("resume") and args.get("overwrite"):
        raise ValueError("--resume continues the run in --output-dir, --overwrite deletes it: choose one.")
    if not args.get("resume"):
        used = [name for name in RUN_FILES if os.path.exists(os.path.join(output_dir, name))]
        if used and not args.get("overwrite"):
            raise ValueError(
                f"{output_dir} already holds a run ({', '.join(used)}): continue it with --resume, replace it with "
                "--overwrite, or choose a new --output-dir."
            )
        return
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"--resume: {output_dir} holds no run to resume (no run.json); drop --resume to start one."
        )
    previous = read_run_record(path)
    previous_script = previous["script"]
    if previous_script != script:
        raise ValueError(
            f"--resume: {output_dir} holds a run of {previous_script}, not {script}: resume it with "
            f"python -m {previous_script}, or choose a new --output-dir."
        )
    for name, value in args.items():
        if name in RESUMABLE:
            continue
        if name not in previous["args"] and name not in BEFORE_IT_EXISTED:
            raise ValueError(
                f"--resume: the run in {output_dir} was made before --{name.replace('_', '-')} existed, and no value "
                "of it gives that run again; start a new run (or choose a new --output-dir)."
            )
        before = previous["args"].get(name, BEFORE_IT_EXISTED.get(name))  # the run as it was made
        if before != value:
            hidden = ("resume", "overwrite", "stop_at_step")
            changeable = ", ".join("--" + n.replace("_", "-") for n in RESUMABLE if n not in hidden)
            raise ValueError(
                f"--resume: --{name.replace('_', '-')} was {before!r} in the run in {output_dir}, "
                f"now {value!r}; resume with the same arguments (only {changeable} may change), or choose a new "
                "--output-dir."
            )
    if previous["num_processes"] != record["num_processes"]:
        raise ValueError(
            f"--resume: the run in {output_dir} ran on {previous['num_processes']} processes, this one on "
            f"{record['num_processes']}; the data each process reads would change. Resume on "
            f"{previous['num_processes']} processes, or choose a new --output-dir."
        )


def read_run_record(path: str) -> dict:
    """The run record `path` (run.json: "script", "args", "num_processes", as `run_record` writes it); a ValueError in
    one line naming the file when it is no JSON or lacks one of those."""
    try:
        with open(path) as f:
            record = json.load(f)
    except (ValueError, UnicodeDecodeError) as error:
        problem = f"not valid JSON: {error}"
    else:
        fields = {"script": str, "args": dict, "num_processes": int}
        wrong = [name for name, kind in fields.items() if not isinstance(record, dict) or
                 not isinstance(record.get(name), kind)]
        if not wrong:
            return record
        problem = f"no {' or '.join(wrong)} of the kind a run writes"
    raise ValueError(f"--resume: {path} is not a run record ({problem}): restore the run.json the run wrote, or start "
                     "again with --overwrite.")


def delete_run_files(output_dir: str) -> None:
    """--overwrite, once `check_new_or_resumed_run` allowed it: deletes what an earlier run wrote into `output_dir`
    (`RUN_FILES`, `LISTING`), nothing else; a ValueError, before anything is deleted, when they hold anything that is
    not the run's own (`overwrite_problem`)."""
    if problem := overwrite_problem(output_dir, (*RUN_FILES, LISTING)):
        raise ValueError(problem)
    delete_entries(output_dir, (*RUN_FILES, LISTING))


def overwrite_problem(output_dir: str, names) -> str | None:
    """Why --overwrite may not delete `names` in `output_dir` (one line naming what is not the run's own), or None."""
    theirs = unmarked_run_files(output_dir, names)
    if not theirs:
        return None
    shown = ", ".join(theirs[:3]) + (f" and {len(theirs) - 3} more" if len(theirs) > 3 else "")
    return (f"{output_dir} holds {shown}, which no run wrote there (or which changed since): a run deletes or replaces "
            f"only a run's own files (--overwrite too), each listed with its sha256 (in {RUN_MANIFEST}, in each "
            "export's own and in each checkpoint's manifest.json; a run stopped before its end leaves its logs/ "
            "unlisted). Nothing was deleted: move them, or choose a new --output-dir.")


def unmarked_run_files(output_dir: str, names) -> list[str]:
    """The files and links among `names` in `output_dir`, and in those of them that are folders, that no mark of the
    run vouches for (relative paths; see TEACHER_CACHE_FILE): what --overwrite must not delete."""
    manifest, found = read_manifest(output_dir), []
    for name in names:
        path = os.path.join(output_dir, name)
        folder = os.path.isdir(path) and not os.path.islink(path)
        if not os.path.lexists(path) or folder and name.endswith(".partial"):
            continue
        if not folder:
            found += [] if not os.path.islink(path) and is_ours(output_dir, name, manifest) else [name]
        elif name in ("best", "final"):
            found += [f"{name}/{entry}" for entry in unmarked(path, read_manifest(path), RUN_MANIFEST)]
        elif name == "checkpoints":
            found += [f"{name}/{entry}" for entry in unmarked_checkpoints(path)]
        elif name == "teacher_cache":
            found += [f"{name}/{entry}" for entry in sorted(os.listdir(path)) if not TEACHER_CACHE_FILE.fullmatch(entry)
                      or os.path.islink(os.path.join(path, entry)) or not os.path.isfile(os.path.join(path, entry))]
        else:  # logs/: listed in OUT's manifest
            listed = {key[len(name) + 1:]: digest for key, digest in manifest.items() if key.startswith(f"{name}/")}
            found += [f"{name}/{entry}" for entry in unmarked(path, listed)]
    return found


def unmarked(folder: str, manifest: dict[str, str], seal: str | None = None) -> list[str]:
    """The files and links under `folder` (relative POSIX paths) that `manifest` ({relative path: sha256}) does not
    list with their content; `seal`, the manifest's own file, left out."""
    found = []
    for root, folders, files in os.walk(folder):
        for entry in [*folders, *files]:
            path = os.path.join(root, entry)
            relative = os.path.relpath(path, folder).replace(os.sep, "/")
            if relative == seal:
                continue
            if os.path.islink(path) or entry in files and not is_ours(folder, relative, manifest):
                found.append(relative)
    return sorted(found)


def unmarked_checkpoints(folder: str) -> list[str]:
    """What `unmarked_run_files` finds in OUT/checkpoints: anything but checkpoint_<step> folders holding the files
    their manifest.json lists, unchanged (and `.partial` ones)."""
    found = []
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if os.path.islink(path) or not os.path.isdir(path) or not re.fullmatch(r"checkpoint_\d+(\.partial)?", name):
            found.append(name)
        elif not name.endswith(".partial"):
            found += [f"{name}/{entry}" for entry in unmarked(path, checkpoint_manifest(path) or {}, MANIFEST)]
    return found


class RunLog:
    """A log the run appends to in OUT (metrics.jsonl, validation.jsonl), marked as the run's in OUT's manifest after
    each line: its sha256 is carried along (the file read once, at the first line), so a line costs its own length."""

    def __init__(self, output_dir: str, name: str):
        self.output_dir, self.name, self.digest = output_dir, name, None

    def append(self, line: dict) -> None:
        """`line` as one line of JSON at the end of the log (opened without following a link), then marked."""
        path = os.path.join(self.output_dir, self.name)
        if self.digest is None:
            self.digest = running_sha256(path) if os.path.isfile(path) else hashlib.sha256()
        data = (json.dumps(line) + "\n").encode()
        with os.fdopen(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o666), "ab") as f:
            f.write(data)
        self.digest.update(data)
        record(self.output_dir, [self.name], keep=True, digests={self.name: self.digest.hexdigest()})


def delete_entries(folder: str, names) -> None:
    """Deletes each of `names` that `folder` holds (a folder with all it holds), a link as a link: never what it
    points to."""
    for name in names:
        path = os.path.join(folder, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        elif os.path.lexists(path):
            os.remove(path)


def checkpoints(output_dir: str) -> list[str]:
    """The `OUT/checkpoints/checkpoint_<step>` folders, oldest first (unfinished `.partial` ones left out)."""
    folder = os.path.join(output_dir, "checkpoints")
    names = [n for n in os.listdir(folder) if re.fullmatch(r"checkpoint_\d+", n)] if os.path.isdir(folder) else []
    return [os.path.join(folder, n) for n in sorted(names, key=lambda n: int(n.split("_")[1]))]


def file_digests(folder: str) -> dict[str, str]:
    """sha256 of every file under `folder` by relative path, the manifest left out."""
    digests = {}
    for root, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            relative = os.path.relpath(path, folder)
            if relative == MANIFEST:
                continue
            digests[relative] = sha256(path)
    return digests


def checkpoint_manifest(folder: str) -> dict | None:
    """{relative path: sha256} of the checkpoint `folder`'s manifest.json, or None when it has no readable one."""
    try:
        with open(os.path.join(folder, MANIFEST)) as f:
            expected = json.load(f)
    except (OSError, ValueError):
        return None
    return expected if isinstance(expected, dict) else None


def checkpoint_problem(folder: str) -> str | None:
    """None when `folder` holds the files its manifest lists, each with its sha256; else what is wrong."""
    expected = checkpoint_manifest(folder)
    if expected is None:
        return "no readable manifest.json (the save did not finish)"
    found = file_digests(folder)
    missing = sorted(set(expected) - set(found))
    changed = sorted(name for name in expected if name in found and found[name] != expected[name])
    if missing:
        return f"missing {', '.join(missing)}"
    if changed:
        return f"sha256 differs from the manifest for {', '.join(changed)}"
    return None


def save_checkpoint(accelerator: Accelerator, output_dir: str, step: int, data_positions: dict, keep: int,
                    teacher_mean=None) -> None:
    """`save_state` (model, optimiser, RNG states), the step, every process's data positions ({stream: (epoch,
    batches used in it)}) and sums of the teacher's tokens (`teacher_mean`, a training.teacher_mean.TeacherMean) into
    `OUT/checkpoints/checkpoint_<step>`: written under a temporary name, sealed with a
    manifest of sha256 per file and renamed when complete; only then are all but the `keep` newest deleted."""
    folder = os.path.join(output_dir, "checkpoints", f"checkpoint_{step}")
    partial = folder + ".partial"
    positions = gather_object([{stream: list(position) for stream, position in data_positions.items()}])
    if accelerator.is_main_process and os.path.exists(partial):
        shutil.rmtree(partial)  # left by a run that died while saving
    accelerator.wait_for_everyone()
    failed = (partial, f"checkpoint_{step}", f"The earlier checkpoints in {output_dir}/checkpoints are intact: free "
              "some space, then --resume continues from the newest.")
    with unwritable(*failed):
        accelerator.save_state(partial)
        if teacher_mean is not None:
            save_state(teacher_mean, partial, accelerator.process_index)
    accelerator.wait_for_everyone()  # outside: a collective's failure is the loop's to report, not a write's
    if accelerator.is_main_process:
        with unwritable(*failed):
            write_json(os.path.join(partial, "state.json"), {"step": step, "data_positions": positions})
            write_json(os.path.join(partial, MANIFEST), file_digests(partial))
            if os.path.exists(folder):  # the same step of this run, saved before a resume from an earlier checkpoint
                shutil.rmtree(folder)
            os.replace(partial, folder)
            for old in checkpoints(output_dir)[:-keep]:
                shutil.rmtree(old)
    accelerator.wait_for_everyone()


@contextlib.contextmanager
def unwritable(partial: str, what: str, continuation: str):
    """Turns a failed write under `partial` (a full disk, an I/O error: OSError, or torch's zip writer's RuntimeError,
    "file write failed" or "unexpected pos") into a RunStopped naming `what`, after deleting the half-written
    `partial`. A collective's failure (a DistError) passes through."""
    try:
        yield
    except (OSError, RuntimeError) as error:
        if isinstance(error, torch.distributed.DistError):
            raise
        shutil.rmtree(partial, ignore_errors=True)
        raise RunStopped(f"could not write {what} ({' '.join(str(error).split())[:200]}): is the disk full? "
                         f"{continuation}") from None


# What a damaged checkpoint file raises as it loads: a cut pickle or zip, a cut safetensors file, JSON, a missing key.
UNLOADABLE = (pickle.UnpicklingError, EOFError, SafetensorError, RuntimeError, ValueError, KeyError, OSError)


def load_checkpoint(accelerator: Accelerator, output_dir: str, teacher_mean=None) -> tuple[int, dict]:
    """Loads the newest checkpoint under `output_dir` whose files match its manifest and load (weights only: a file
    that would run code when unpickled does not), saying which newer ones were skipped and why, with this process's
    sums of the teacher's tokens into `teacher_mean`; returns the step to continue from and this process's data
    positions ({stream: (epoch, batches already used in it)})."""
    intact = []
    if accelerator.is_main_process:  # one process checks the manifests, all try the same checkpoints in order
        for folder in reversed(checkpoints(output_dir)):
            problem = checkpoint_problem(folder)
            if problem is None:
                intact.append(folder)
            else:
                print(f"--resume: skipping {folder}: {problem}")
    for folder in broadcast_object_list([intact])[0]:
        try:
            accelerator.load_state(folder)
            with open(os.path.join(folder, "state.json")) as f:
                state = json.load(f)
            if teacher_mean is not None and not load_state(teacher_mean, folder, accelerator.process_index):
                accelerator.print(f"warning: --resume: {folder} holds no teacher mean (made before it was recorded); "
                                  "the exported teacher_mean.safetensors averages the crops from here on only")
            failure = None
        except UNLOADABLE as error:
            failure = f"{type(error).__name__}: {' '.join(str(error).split()).split('. ')[0]}"
        failures = [f for f in gather_object([failure]) if f]
        if not failures:
            break
        accelerator.print(f"--resume: skipping {folder}: it does not load ({failures[0]})")
    else:
        raise FileNotFoundError(
            f"--resume: no complete checkpoint under {output_dir}/checkpoints; start again with --overwrite, or in a "
            "new --output-dir."
        )
    accelerator.print(f"resumed from {folder} at step {state['step']}")
    if problem := rng_state_problem(folder, accelerator.process_index):  # accelerate logs it at info level only
        print(f"warning: --resume: the RNG state of {folder} was not restored ({problem}); the run continues (each "
              "step reseeds from --seed and the step, so its draws and crops are the same).", file=sys.stderr)
    positions = state["data_positions"][accelerator.process_index]
    return state["step"], {stream: tuple(position) for stream, position in positions.items()}


def rng_state_problem(folder: str, process_index: int) -> str | None:
    """Why `load_state` could not restore this process's RNG states from the checkpoint `folder` (a missing, replaced
    or code-running file, read as accelerate reads it: weights only), or None."""
    path = os.path.join(folder, f"{RNG_STATE_NAME}_{process_index}.pkl")
    try:
        states = load(path)
    except (pickle.UnpicklingError, RuntimeError, ValueError, EOFError, OSError) as error:
        return f"{os.path.basename(path)}: {type(error).__name__}"
    if not isinstance(states, dict) or "torch_manual_seed" not in states:
        return f"{os.path.basename(path)} holds no RNG state"
    return None


WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")


def check_export(folder: str) -> None:
    """Raises unless `folder` is what `save_pretrained` writes (config.json and weights), e.g. OUT/final."""
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"Checkpoint folder {folder} does not exist: pass a save_pretrained folder.")
    if not os.path.isfile(os.path.join(folder, "config.json")):
        raise FileNotFoundError(f"{folder} has no config.json: pass a save_pretrained folder (OUT/final).")
    if not any(os.path.isfile(os.path.join(folder, name)) for name in WEIGHT_FILES):
        raise FileNotFoundError(
            f"{folder} holds no weights (looked for {', '.join(WEIGHT_FILES)}): pass the folder save_pretrained "
            "wrote, e.g. OUT/final, not OUT, an Accelerate checkpoint or an unfinished export."
        )


def export(
    accelerator: Accelerator, model, output_dir: str, stats, script: str, args, name: str = "final",
    validation: dict | None = None, teacher_mean=None, processor=None,
) -> None:
    """The hub-ready `OUT/<name>` folder (`final`, or `best` with its `validation.json`; weights gathered from every
    process), the recipe that produced it (`training_recipe.json`, which the model card quotes), the teacher's mean
    tokens over the training crops so far (`teacher_mean.safetensors`, from `teacher_mean`) and the run's data
    counts. Written under a temporary name and renamed when complete. `processor`: the image processor saved beside
    the weights (default: the model's own, corevision_hf.saving.image_processor_for)."""
    accelerator.wait_for_everyone()
    final = os.path.join(output_dir, name)
    partial = final + ".partial"
    if accelerator.is_main_process and os.path.exists(partial):
        shutil.rmtree(partial)  # left by a run that died while exporting
    accelerator.wait_for_everyone()  # else another process's save_pretrained could create it just before the rmtree
    state_dict = accelerator.get_state_dict(model)  # every process takes part (FSDP, DeepSpeed gather here)
    save_model_folder(accelerator.unwrap_model(model), partial, processor, is_main_process=accelerator.is_main_process,
                      state_dict=state_dict)
    accelerator.wait_for_everyone()  # every process is done with the folder before it is renamed
    if teacher_mean is not None:
        teacher_mean.save(partial, accelerator)  # a collective: the sums of every process
    if accelerator.is_main_process:
        with open(os.path.join(partial, "training_recipe.json"), "w") as f:
            model_type = accelerator.unwrap_model(model).config.model_type
            json.dump(training_recipe(accelerator, script, args, model_type), f, indent=2)
        if validation is not None:
            write_json(os.path.join(partial, "validation.json"), validation)
        record(partial, files_under(partial))  # the folder's files, as --overwrite (and --force elsewhere) knows them
        if os.path.exists(final):  # this run's own export, made before a resume
            shutil.rmtree(final)
        os.replace(partial, final)
    accelerator.wait_for_everyone()
    if name == "final" and stats is not None:  # training.finetune counts no data
        stats = stats if isinstance(stats, list) else [stats]  # one per resolution of a multi-resolution run
        counts = accelerator.reduce(sum(s.as_tensor() for s in stats).to(accelerator.device), "sum")
        accelerator.print(f"data: {stats[0].summary(counts)}")
    accelerator.print(f"exported {final}: AutoModel.from_pretrained({final!r}, trust_remote_code=True)")


def best_score(output_dir: str) -> tuple[float, str] | None:
    """The validation score of `OUT/best` and what it measures ("score_measure"; "cosine" before it was recorded):
    what a resumed run must beat. None when there is none yet."""
    try:
        with open(os.path.join(output_dir, "best", "validation.json")) as f:
            result = json.load(f)
        return result["score"], result.get("score_measure", "cosine")
    except (OSError, ValueError, KeyError):
        return None


def training_recipe(accelerator: Accelerator, script: str, args, model_type: str) -> dict:
    """What a model card needs to say how a checkpoint was made: the model type, the command (rebuilt from the
    parsed arguments, so it is the same however the script was called), every argument, and with `--recipe` the
    recipe's name and the values that differ from it (`recipe_overrides`: {name: {"recipe", "used"}})."""
    from .recipes import load_recipe

    left_out = ("stop_at_step", "resume", "overwrite")
    arguments = {name: value for name, value in vars(args).items() if name not in left_out}
    recipe = load_recipe(args.recipe) if getattr(args, "recipe", None) else {}
    flags = []
    for name, value in arguments.items():
        flag = "--" + name.replace("_", "-")
        if value is False and recipe.get(name) is True:  # a recipe's switch turned off
            flags.append(flag.replace("--", "--no-", 1))
        if value is None or value is False:
            continue
        flags.append(flag)
        if value is not True:
            flags.append(shlex.quote(str(value)))
    launcher = "accelerate launch" if accelerator.num_processes > 1 else "python"
    return {
        "script": script,
        "method": model_type,
        "command": " ".join([launcher, "-m", script, *flags]),
        "teacher": getattr(args, "teacher", None),  # None: training.finetune
        "data": args.data,
        "steps": getattr(args, "max_steps", None),
        "num_processes": accelerator.num_processes,
        "global_batch_size": (args.batch_size * accelerator.num_processes
                              * getattr(args, "gradient_accumulation_steps", 1)),
        "mixed_precision": accelerator.mixed_precision,  # the effective one: the flag's, else the config's
        "recipe": arguments.get("recipe"),
        "recipe_overrides": {name: {"recipe": value, "used": arguments[name]} for name, value in recipe.items()
                             if name in arguments and value is not None and arguments[name] != value},
        "args": arguments,
    }


def finish(accelerator: Accelerator, output_dir: str | None = None) -> None:
    """Ends trackers, takes the process group down (`end_training`) while every process is still there, marks the
    trackers' files in `output_dir`/logs as the run's (OUT's manifest) and releases the run's lock (training.run_lock).
    The prepared model and optimiser are released first (callers drop their own references too): a DDP model holds the
    gloo group, and a group whose last reference goes after its peer has exited can hang in its destructor."""
    accelerator.free_memory()
    gc.collect()
    accelerator.wait_for_everyone()
    accelerator.end_training()
    logs = os.path.join(output_dir or "", "logs")
    if output_dir is not None and accelerator.is_main_process and os.path.isdir(logs) and not os.path.islink(logs):
        written = [name for name in files_under(logs) if not os.path.islink(os.path.join(logs, name))]
        record(output_dir, [f"logs/{name}" for name in written], keep=True)
    release_output_dirs()
