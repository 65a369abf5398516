"""Accelerate checkpoints with the step they were taken at (for `--resume`), the guard that keeps the last one good,
the final export and the end of a run."""

import json
import os
import re
import shlex

import torch
from accelerate import Accelerator


def last_checkpoint(output_dir: str) -> str | None:
    """The newest `OUT/checkpoints/checkpoint_<n>` folder, or None."""
    folder = os.path.join(output_dir, "checkpoints")
    names = [n for n in os.listdir(folder) if re.fullmatch(r"checkpoint_\d+", n)] if os.path.isdir(folder) else []
    return os.path.join(folder, max(names, key=lambda n: int(n.split("_")[1]))) if names else None


def save_checkpoint(accelerator: Accelerator, output_dir: str, step: int) -> None:
    """`save_state` (model, optimiser, scheduler, sampler and RNG states) plus the step it was taken at."""
    accelerator.save_state()
    if accelerator.is_main_process:
        with open(os.path.join(last_checkpoint(output_dir), "step.json"), "w") as f:
            json.dump({"step": step}, f)


def resume(accelerator: Accelerator, output_dir: str) -> int:
    """Loads the newest checkpoint under `output_dir`; returns the step to continue from."""
    checkpoint = last_checkpoint(output_dir)
    if checkpoint is None:
        raise FileNotFoundError(f"--resume: no checkpoint under {output_dir}/checkpoints.")
    accelerator.load_state(checkpoint)
    # continue the automatic checkpoint numbering after the one we resumed from
    accelerator.project_configuration.iteration = int(checkpoint.rsplit("_", 1)[1]) + 1
    with open(os.path.join(checkpoint, "step.json")) as f:
        step = json.load(f)["step"]
    accelerator.print(f"resumed from {checkpoint} at step {step}")
    return step


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


def export(accelerator: Accelerator, model, output_dir: str, stats, script: str, args) -> None:
    """The hub-ready `OUT/final` folder (weights gathered from every process), the recipe that produced it
    (`training_recipe.json`, which the model card quotes) and the run's data counts."""
    accelerator.wait_for_everyone()
    final = os.path.join(output_dir, "final")
    accelerator.unwrap_model(model).save_pretrained(
        final, is_main_process=accelerator.is_main_process, state_dict=accelerator.get_state_dict(model)
    )
    if accelerator.is_main_process:
        with open(os.path.join(final, "training_recipe.json"), "w") as f:
            json.dump(training_recipe(accelerator, script, args), f, indent=2)
    accelerator.print(f"data: {stats.summary(accelerator.reduce(stats.as_tensor().to(accelerator.device), 'sum'))}")
    accelerator.print(f"exported {final}: AutoModel.from_pretrained({final!r}, trust_remote_code=True)")


def training_recipe(accelerator: Accelerator, script: str, args) -> dict:
    """What a model card needs to say how a checkpoint was made: the command (rebuilt from the parsed arguments, so
    it is the same however the script was called) and every argument."""
    arguments = {name: value for name, value in vars(args).items() if name not in ("stop_at_step", "resume")}
    flags = []
    for name, value in arguments.items():
        if value is None or value is False:
            continue
        flags.append("--" + name.replace("_", "-"))
        if value is not True:
            flags.append(shlex.quote(str(value)))
    launcher = "accelerate launch" if accelerator.num_processes > 1 else "python"
    return {
        "script": script,
        "method": "veca" if "veca" in script else "lookwhere",
        "command": " ".join([launcher, script, *flags]),
        "teacher": args.teacher,
        "data": args.data,
        "steps": args.max_steps,
        "num_processes": accelerator.num_processes,
        "global_batch_size": args.batch_size * accelerator.num_processes * args.gradient_accumulation_steps,
        "mixed_precision": args.mixed_precision,
        "args": arguments,
    }


def finish(accelerator: Accelerator) -> None:
    """Ends trackers and takes the process group down while every process is still there: a gloo group left to the
    garbage collector can hang in its destructor once its peer has exited."""
    accelerator.wait_for_everyone()
    accelerator.end_training()
    accelerator.state.destroy_process_group()


def guarded_update(accelerator: Accelerator, model, optimizer, scheduler, loss, max_grad_norm: float, step: int,
                   output_dir: str) -> None:
    """backward, clip, step, zero_grad; a non-finite loss or gradient stops the run before the weights change, so
    the last checkpoint stays good."""
    stop = f"The last good checkpoint is intact in {output_dir}/checkpoints (resume with --resume after lowering --lr)."
    if not torch.isfinite(loss):
        raise FloatingPointError(f"Loss is {loss.item()} at step {step}; stopping. {stop}")
    accelerator.backward(loss)
    if accelerator.sync_gradients:
        grad_norm = accelerator.clip_grad_norm_(model.parameters(), max_grad_norm)
        # fp16's loss scaler skips overflowing steps itself; elsewhere a bad gradient would poison the weights
        if accelerator.mixed_precision != "fp16" and not torch.isfinite(grad_norm):
            raise FloatingPointError(f"Gradient norm is {grad_norm.item()} at step {step}; stopping before the update. {stop}")
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()
