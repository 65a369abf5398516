"""The distillation loop that training.distill_veca, training.distill_lookwhere and
benchmarks/distill_quality.py share. Each brings its teacher, student, per-step draws and loss; this does the rest.

Per optimisation step: the step's draws (core budget, k, resolution: functions of (seed, step) alone), checked equal
on every process; --gradient-accumulation-steps micro-batches, each process reading its own part of the data (a
micro-batch with no readable image on some process is skipped by all); an update that a non-finite loss or gradient
stops before the weights change; the learning rate set by hand to `lr * warmup_cosine(step)`, so that it is a
function of the step alone (Accelerate's prepared scheduler advances once per process per step); a line of
`metrics.jsonl`; a checkpoint every --checkpoint-every steps. Then the hub-ready export.
"""

import importlib.util
import json
import os
import resource
import sys
import time
from datetime import timedelta

import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState
from accelerate.utils import (
    DistributedType, InitProcessGroupKwargs, ProjectConfiguration, TorchDynamoPlugin, gather_object, set_seed,
)
from tqdm.auto import tqdm

from corevision_hf.cli import RunStopped

from .arguments import check_positive
from .checkpointing import (
    LISTING, best_score, check_output_dir, clear_run, export, finish, load_checkpoint, run_record, save_checkpoint,
    write_json,
)
from .data import BatchStream, build_dataset
from .optim import build_optimizer, describe
from .run_lock import lock_output_dir
from .schedule import reseed_for_step, warmup_cosine


def check_processes_agree(arguments: list[dict]) -> None:
    """Raises ValueError naming the first argument on which the processes' `vars(args)` (one dict per process)
    differ: every process of a run must be started with the same command."""
    for name, value in arguments[0].items():
        values = [process_args.get(name) for process_args in arguments]
        if any(v != value for v in values):
            raise ValueError(
                f"The {len(arguments)} processes of this run were started with different arguments: "
                f"--{name.replace('_', '-')} is {values} on processes 0..{len(arguments) - 1}. Start every process "
                "with the same command (one accelerate launch)."
            )


def start(args, script: str) -> Accelerator:
    """The run's Accelerator, once its arguments are known to be usable: positive sizes and rates, the same on every
    process, and an output folder that is new (or, with --resume, holds a run of `script` with the same arguments;
    with --overwrite, the run it held is deleted here). Nothing is written yet."""
    check_positive(args, "batch_size", "max_steps", "lr", "gradient_accumulation_steps", "checkpoint_every",
                   "keep_checkpoints", "eval_images", "collective_timeout")
    for name in ("min_lr", "warmup_start_lr"):
        if not 0 <= getattr(args, name) <= args.lr:
            raise ValueError(f"Need 0 <= --{name.replace('_', '-')} <= --lr, got {getattr(args, name)} and --lr {args.lr}.")
    for name in ("warmup_steps", "max_grad_norm", "eval_every"):
        if getattr(args, name) < 0:
            raise ValueError(f"--{name.replace('_', '-')} must be 0 or more, got {getattr(args, name)}.")
    if args.warmup_steps >= args.max_steps:
        print(f"warning: --warmup-steps {args.warmup_steps} is not below --max-steps {args.max_steps}: the whole run "
              "warms up (a recipe's steps are the authors'; scale them to your run)", file=sys.stderr)
    if args.streaming and args.shuffle_buffer < 1:
        raise ValueError(f"--shuffle-buffer must be 1 or more with --streaming, got {args.shuffle_buffer} (1: the shard "
                         "order alone is shuffled).")
    if args.num_workers is not None and args.num_workers < 0:
        raise ValueError(f"--num-workers must be 0 or more, got {args.num_workers}.")
    if args.eval_every and not args.eval_data:
        raise ValueError(f"--eval-every {args.eval_every} validates on held-out images: give them with --eval-data, or "
                         "pass --eval-every 0.")
    trackers = {"none": None, "auto": "tensorboard" if importlib.util.find_spec("tensorboard") else None}
    # a run in a process that ran another one (a benchmark, the tests) takes its own mixed precision: accelerate keeps
    # the first run's in a process-wide state otherwise (the process group, in PartialState, stays)
    AcceleratorState._reset_state()
    dynamo = TorchDynamoPlugin(backend="inductor" if args.compile else None)  # else the launch config's, if any
    if dynamo.dynamic is None:
        dynamo.dynamic = True  # a core budget or size is a symbol from the first step on, instead of a recompile
    accelerator = Accelerator(
        kwargs_handlers=[InitProcessGroupKwargs(timeout=timedelta(seconds=args.collective_timeout))],
        dynamo_plugin=dynamo,
        mixed_precision=args.mixed_precision,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        log_with=trackers.get(args.log_with, args.log_with),
        project_config=ProjectConfiguration(project_dir=args.output_dir, logging_dir=f"{args.output_dir}/logs"),
    )
    check_launch(accelerator)
    if args.optimizer == "normuon" and accelerator.distributed_type in (DistributedType.FSDP, DistributedType.DEEPSPEED):
        raise ValueError(
            f"--optimizer normuon orthogonalises whole matrices, and {accelerator.distributed_type.value} shards them: "
            "launch with training/configs/multi_gpu_ddp.yaml, or use --optimizer adamw."
        )
    if args.tf32 and accelerator.device.type == "cuda":
        torch.set_float32_matmul_precision("high")  # TF32, as the VECA authors' configure_backend_precision
    check_processes_agree(gather_object([vars(args)]))
    check_output_dir(args.output_dir, run_record(script, args, accelerator.num_processes))
    if accelerator.is_main_process:  # before --overwrite deletes anything: one live run per folder
        lock_output_dir(args.output_dir)
    if args.overwrite and accelerator.is_main_process:
        clear_run(args.output_dir)
    elif not args.resume and accelerator.is_main_process and os.path.exists(os.path.join(args.output_dir, LISTING)):
        os.remove(os.path.join(args.output_dir, LISTING))  # left by a setup that failed: the folder may have changed
    accelerator.wait_for_everyone()
    set_seed(args.seed)
    return accelerator


def check_launch(accelerator: Accelerator) -> None:
    """Raises ValueError when the launch asked for what accelerate does not do here: FSDP on CPU processes (accelerate
    falls back to plain DDP without a word), or processes that each run alone (a world of one per launched process,
    all writing the same folder)."""
    asked_fsdp = os.environ.get("ACCELERATE_USE_FSDP", "false").lower() in ("1", "true")
    if asked_fsdp and accelerator.distributed_type != DistributedType.FSDP:
        raise ValueError(
            f"The accelerate config asks for FSDP, which accelerate does not do on {accelerator.device.type} processes "
            f"(it would run {accelerator.distributed_type.value} unsharded): launch FSDP on GPUs, or use "
            "training/configs/cpu_2proc.yaml (DDP) on CPUs."
        )
    launched = int(os.environ.get("WORLD_SIZE", "1"))
    if launched != accelerator.num_processes:
        raise ValueError(
            f"{launched} processes were launched but each runs alone (accelerate sees {accelerator.num_processes}): "
            "the config's distributed setting cannot run on this machine (FSDP or multi-GPU without GPUs?); for CPU "
            "processes use ACCELERATE_USE_CPU=1 with training/configs/cpu_2proc.yaml."
        )


def training_data(accelerator: Accelerator, args, image_size: int) -> tuple:
    """This process's training images at `image_size`: training.data.build_dataset with the run's data arguments. The
    main process lists an image folder first, into OUT/image_files.json; the other processes read that listing."""
    if accelerator.is_main_process:
        os.makedirs(args.output_dir, exist_ok=True)
    with accelerator.main_process_first():
        return build_dataset(
            args.data, streaming=args.streaming, image_size=image_size, seed=args.seed, augment=args.augment,
            image_column=args.image_column, shuffle_buffer=args.shuffle_buffer,
            listing=os.path.join(args.output_dir, LISTING), process_index=accelerator.process_index,
            num_processes=accelerator.num_processes,
        )


class TeacherClock:
    """Seconds spent in the teacher's forward passes since `reset`, measured by forward hooks (the device is
    synchronised around each pass, so that GPU time is counted where it is spent)."""

    def __init__(self, teacher: torch.nn.Module, device: torch.device):
        self.seconds, self.calls, self._start = 0.0, 0, 0.0
        self._sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        self._handles = [teacher.register_forward_pre_hook(self._begin), teacher.register_forward_hook(self._end)]

    def _begin(self, module, args):
        self._sync()
        self._start = time.perf_counter()

    def _end(self, module, args, output):
        self._sync()
        self.seconds += time.perf_counter() - self._start
        self.calls += 1

    def reset(self) -> None:
        self.seconds = 0.0

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()


def peak_memory_mib(device: torch.device) -> float:
    """This process's peak memory so far: allocated GPU memory on CUDA, resident memory on the CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def truncate_metrics(path: str, step: int) -> None:
    """Keeps the lines of steps up to `step`, the checkpoint a resume starts from: the lines of later steps (which
    the resumed run computes again) and a last line that a killed run left half-written go, so the file stays one
    readable line per step."""
    with open(path, "rb+") as f:
        lines = f.read().split(b"\n")
        kept = []
        for line in lines[:-1]:  # the last piece has no newline: empty, or cut off by a kill
            try:
                if json.loads(line)["step"] <= step:
                    kept.append(line + b"\n")
            except (ValueError, KeyError, TypeError):
                break  # an unreadable line can only come from a kill, and nothing after it is kept
        f.seek(0)
        f.write(b"".join(kept))
        f.truncate()


def data_workers(asked: int | None) -> int:
    """DataLoader workers per process: `asked`, or half the CPU cores each process of this machine has, at most 4."""
    if asked is not None:
        return asked
    local_processes = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return min(4, (os.cpu_count() or 1) // local_processes // 2)


def process_batches(stream: BatchStream, position: tuple):
    """This process's batches of `stream`, epoch after epoch, from `position` = (epoch, batches already used in it).
    Yields (epoch, batches used in it, batch); batch is None after an epoch that held no readable image (too few
    images for one batch, or none readable), which the caller turns into an error on every process."""
    epoch, used = position
    while True:
        first, readable = used, 0
        for batch in stream.epoch(epoch, used):
            used += 1
            readable += len(batch["pixel_values"])
            yield epoch, used, batch
        if first == 0 and readable == 0:
            yield epoch, used, None
        epoch, used = epoch + 1, 0


def distill(
    accelerator: Accelerator, args, script: str, student, teacher, dataset, stats, draws, loss_fn, validate=None
) -> None:
    """Trains `student` for `args.max_steps` optimisation steps (`args.optimizer`, split as the method's authors do:
    training.optim), resuming with `args.resume`, and exports it to `OUT/final`.

    dataset: the training images, or one dataset per resolution {size: (dataset, batch size)} from which each step
      takes the batch of its drawn "resolution" (each with its own epochs and position, as the VECA authors' one
      loader per resolution).
    draws(step) -> {name: int}: the step's random choices (core budget, k, resolution), a function of the step
      alone; logged, and checked equal on every process.
    loss_fn(student, batch, step_draws) -> (loss, {name: scalar tensor}): runs the teacher (which must be `teacher`,
      whose forward passes are timed) and the student on batch = {"pixel_values": (B, 3, S, S) on the device,
      "index": (B,) sample indices, "epoch": int}. Runs under `accelerator.autocast()`.
    validate(student) -> {"score": float, ...}: the held-out agreement, run every `args.eval_every` steps and at the
      end; the best-scoring student is exported to `OUT/best` with the result as `validation.json`.
    """
    streams = dataset if isinstance(dataset, dict) else {"all": (dataset, args.batch_size)}
    for data, batch_size in streams.values():
        if not isinstance(data, torch.utils.data.IterableDataset) and len(data) < batch_size:
            raise ValueError(
                f"{args.data} holds {len(data)} images per process, fewer than one batch of {batch_size}: lower "
                "--batch-size or add images."
            )
    if args.gradient_checkpointing:
        student.activation_checkpointing_enable({"use_reentrant": False})
    optimizer = build_optimizer(student, args.optimizer, args.lr, args.weight_decay)
    accelerator.print(describe(optimizer))
    student, optimizer = accelerator.prepare(student, optimizer)  # the teacher is not prepared: not in checkpoints
    start_positions = {str(key): (0, 0) for key in streams}
    step, positions = load_checkpoint(accelerator, args.output_dir) if args.resume else (0, start_positions)
    best = best_score(args.output_dir) if args.resume else None
    metrics_path = os.path.join(args.output_dir, "metrics.jsonl")
    for log in (metrics_path, os.path.join(args.output_dir, "validation.jsonl")):
        if accelerator.is_main_process and args.resume and os.path.exists(log):
            truncate_metrics(log, step)
    if accelerator.is_main_process and not args.resume:
        os.makedirs(args.output_dir, exist_ok=True)
        write_json(os.path.join(args.output_dir, "run.json"), run_record(script, args, accelerator.num_processes))
    tracker_config = {name: value for name, value in vars(args).items() if value is not None}
    accelerator.init_trackers(script.rsplit(".", 1)[-1], config=tracker_config)
    stop = (f"The last good checkpoint is intact in {args.output_dir}/checkpoints: --resume with a lower --lr "
            "continues from it.")
    resume = f"The last complete checkpoint in {args.output_dir}/checkpoints is intact: --resume continues from it."
    pin = accelerator.device.type == "cuda"
    workers = data_workers(args.num_workers)
    batches = {str(key): process_batches(BatchStream(data, batch_size, args.seed, workers, pin),
                                         positions[str(key)]) for key, (data, batch_size) in streams.items()}

    def next_batch(step_draws: dict) -> tuple:
        """The next micro-batch that every process can use (from the stream of the step's resolution, when there is
        one per resolution), its image count over all processes and the draws of every process (P, D)."""
        key = str(step_draws["resolution"]) if isinstance(dataset, dict) else "all"
        while True:
            epoch, used, batch = next(batches[key])
            positions[key] = (epoch, used)
            count = -1 if batch is None else len(batch["pixel_values"])
            # one tiny all-gather per micro-batch: the draws are checked, not assumed, to agree; a micro-batch with no
            # readable image on some process is skipped by all, an epoch without any readable image stops all
            shared = accelerator.gather(torch.tensor([[count, *step_draws.values()]], device=accelerator.device))
            counts, all_draws = shared[:, 0].tolist(), shared[:, 1:]
            if -1 in counts:
                raise ValueError(
                    f"Process {counts.index(-1)} found no readable image in a whole epoch of {args.data}: it holds "
                    f"fewer than one batch of {args.batch_size} images per process, or none that can be decoded."
                )
            if (all_draws != all_draws[:1]).any():
                raise ValueError(f"Processes disagree on {list(step_draws)} at step {step}: {all_draws.tolist()}.")
            if 0 not in counts:
                return {**batch, "epoch": epoch}, sum(counts), all_draws

    clock = TeacherClock(teacher, accelerator.device)
    progress = tqdm(total=args.max_steps, initial=step, disable=not accelerator.is_main_process, desc="distill")
    last = time.perf_counter()
    try:
        while step < args.max_steps:
            step_draws = draws(step)
            lr = args.lr * warmup_cosine(step, args.warmup_steps, args.max_steps, args.min_lr / args.lr,
                                         args.warmup_start_lr / args.lr)
            for group in optimizer.param_groups:
                group["lr"] = lr
            clock.reset()
            images, data_seconds, sums = 0, 0.0, {}
            for micro_batch in range(args.gradient_accumulation_steps):
                data_start = time.perf_counter()
                batch, count, all_draws = next_batch(step_draws)
                data_seconds += time.perf_counter() - data_start
                images += count
                batch["pixel_values"] = batch["pixel_values"].to(accelerator.device)
                reseed_for_step(args.seed, step, accelerator.process_index, micro_batch)
                with accelerator.accumulate(student):
                    with accelerator.autocast():
                        loss, terms = loss_fn(student, batch, step_draws)
                    accelerator.backward(loss)
                    # mean over processes: every process sees the same values and stops together
                    values = accelerator.reduce(torch.stack([loss, *terms.values()]).detach().float(), "mean")
                    if not torch.isfinite(values[0]):
                        raise FloatingPointError(f"Loss is {values[0].item()} at step {step + 1}; stopping. {stop}")
                    if accelerator.sync_gradients:
                        # 0: no clipping (an infinite bound scales every gradient by exactly 1); the norm is logged
                        bound = args.max_grad_norm or float("inf")
                        grad_norm = accelerator.clip_grad_norm_(student.parameters(), bound)
                        # fp16's loss scaler skips overflowing steps itself; elsewhere a bad gradient poisons weights
                        if accelerator.mixed_precision != "fp16" and not torch.isfinite(grad_norm):
                            raise FloatingPointError(
                                f"Gradient norm is {grad_norm.item()} at step {step + 1}; stopping before the update. "
                                + stop
                            )
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                for name, value in zip(["loss", *terms], values.tolist()):
                    sums[name] = sums.get(name, 0.0) + value / args.gradient_accumulation_steps
            if not accelerator.sync_gradients:
                raise RuntimeError("Accelerate did not synchronise gradients at the end of an optimisation step.")
            step += 1
            seconds = time.perf_counter() - last
            logs = {
                **sums, **step_draws, "lr": lr, "grad_norm": float(grad_norm),
                "images_per_s": images / seconds, "step_time_s": seconds,
                "teacher_time_share": clock.seconds / seconds, "data_time_share": data_seconds / seconds,
                "peak_memory_mib": peak_memory_mib(accelerator.device),
            }
            accelerator.log(logs, step=step)
            progress.update(1)
            progress.set_postfix(loss=f"{logs['loss']:.4f}", **step_draws)
            if accelerator.is_main_process:
                per_process = {f"{name}_all_processes": all_draws[:, i].tolist() for i, name in enumerate(step_draws)}
                with open(metrics_path, "a") as f:
                    f.write(json.dumps({"step": step, **logs, **per_process}) + "\n")
            if validate is not None and (step % args.eval_every == 0 or step == args.max_steps):
                result = {"step": step, **validate(student)}
                accelerator.print(f"validation at step {step}: score {result['score']:.4f}")
                if accelerator.is_main_process:
                    with open(os.path.join(args.output_dir, "validation.jsonl"), "a") as f:
                        f.write(json.dumps(result) + "\n")
                if best is None or result["score"] > best:
                    best = result["score"]
                    export(accelerator, student, args.output_dir, stats, script, args, "best", result)
            if step % args.checkpoint_every == 0 or step == args.max_steps:
                save_checkpoint(accelerator, args.output_dir, step, positions, args.keep_checkpoints)
            if args.stop_at_step is not None and step >= args.stop_at_step:
                accelerator.print(f"stopping at step {step} as asked (--stop-at-step)")
                break
            last = time.perf_counter()  # a checkpoint's time is not a step's
    except KeyboardInterrupt:
        raise RunStopped(f"interrupted (Ctrl-C) at step {step}. {resume}", 130) from None
    except RuntimeError as error:  # a collective that timed out, or whose peer is gone
        message = str(error).lower()
        if "timed out" in message or "timeout" in message:
            raise RunStopped(f"another process did not answer within --collective-timeout {args.collective_timeout} s "
                             f"(stopped, stuck or dead) at step {step + 1}. {resume}") from None
        if "connection reset" in message or "connection closed" in message or "broken pipe" in message:
            raise RunStopped(f"another process of the run is gone (at step {step + 1}). {resume}") from None
        raise
    finally:
        clock.remove()
        progress.close()
    if step == args.max_steps:
        export(accelerator, student, args.output_dir, stats, script, args)
    del student, optimizer  # see finish: the prepared model must go before the process group
    finish(accelerator)
