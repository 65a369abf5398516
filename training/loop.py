"""The distillation loop that training.distill_veca, training.distill_lookwhere and
benchmarks/distill_quality.py share. Each brings its teacher, student, per-step draws and loss; this does the rest.

Per optimisation step: the step's draws (core budget, k, resolution: functions of (seed, step) alone);
--gradient-accumulation-steps micro-batches, each process reading its own part of the data (a micro-batch with no
readable image is skipped); the learning rate set by hand to `lr * warmup_cosine(step)`, so that it is a function of
the step alone (Accelerate's prepared scheduler advances once per process per step); the update. Values are read
back to the host only on logging steps (--log-every, and every step that checkpoints, validates or ends the run), as
nanoGPT does: there a line of `metrics.jsonl` (the means since the last line), the draws checked equal on every
process, and a non-finite loss or gradient norm stops the run before that step's update and its checkpoint. Then the
hub-ready export.
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
    DistributedType, InitProcessGroupKwargs, ProjectConfiguration, TorchDynamoPlugin, broadcast_object_list,
    gather_object, set_seed,
)
from tqdm.auto import tqdm

from corevision_hf.cli import RunStopped

from .arguments import check_positive
from corevision_hf.outputs import record

from .checkpointing import (
    LISTING, RUN_FILES, RunLog, best_score, check_new_or_resumed_run, delete_entries, export, finish, load_checkpoint,
    overwrite_problem, run_record, save_checkpoint, write_json,
)
from .data import BatchStream, build_dataset
from .extractor_warmup import ExtractorWarmup, split_extractor_groups
from .optim import build_optimizer, describe
from .run_lock import lock_output_dir
from .schedule import reseed_for_step, warmup_cosine

RESUME = "The last complete checkpoint in {}/checkpoints is intact: --resume continues from it."


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
    with --overwrite, the run it held is deleted here, when all of it is the run's own:
    checkpointing.overwrite_problem). Nothing is written yet."""
    check_positive(args, "batch_size", "max_steps", "lr", "gradient_accumulation_steps", "checkpoint_every",
                   "keep_checkpoints", "eval_images", "collective_timeout", "log_every")
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
    check_new_or_resumed_run(args.output_dir, run_record(script, args, accelerator.num_processes))
    # what a new run replaces: with --overwrite the earlier run's files, else a listing left by a setup that failed (the
    # folder may have changed); the main process checks they are the run's own, and every process stops if not
    replaced = () if args.resume else (*RUN_FILES, LISTING) if args.overwrite else (LISTING,)
    problem = None
    if accelerator.is_main_process:  # before --overwrite deletes anything: one live run per folder
        lock_output_dir(args.output_dir)
        problem = overwrite_problem(args.output_dir, replaced)
    if problem := broadcast_object_list([problem])[0]:
        raise ValueError(problem)
    if accelerator.is_main_process:
        delete_entries(args.output_dir, replaced)
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
    listing = os.path.join(args.output_dir, LISTING)
    with accelerator.main_process_first():
        data = build_dataset(
            args.data, streaming=args.streaming, image_size=image_size, seed=args.seed, augment=args.augment,
            image_column=args.image_column, shuffle_buffer=args.shuffle_buffer, listing=listing,
            process_index=accelerator.process_index, num_processes=accelerator.num_processes,
        )
    if accelerator.is_main_process and os.path.isfile(listing):
        record(args.output_dir, [LISTING], keep=True)  # the run's own, for a later --overwrite
    return data


class TeacherClock:
    """Seconds spent in the teacher's forward passes since `reset`, measured by forward hooks: on CUDA by events on the
    device's stream, read at a logging step (so that timing the teacher never makes the host wait for the device), on
    the CPU by the host's clock."""

    def __init__(self, teacher: torch.nn.Module, device: torch.device):
        self.cuda = device.type == "cuda"
        self.spans = []
        self._handles = [teacher.register_forward_pre_hook(self._begin), teacher.register_forward_hook(self._end)]

    def _now(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def _begin(self, module, args):
        self._start = self._now()

    def _end(self, module, args, output):
        self.spans.append((self._start, self._now()))

    @property
    def seconds(self) -> float:
        if not self.cuda:
            return sum(end - start for start, end in self.spans)
        if self.spans:
            self.spans[-1][1].synchronize()
        return sum(start.elapsed_time(end) for start, end in self.spans) / 1000  # ms

    def reset(self) -> None:
        self.spans = []

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


class MicroBatches:
    """This process's micro-batches, on the device: from the stream of the step's drawn resolution (one stream per
    resolution) or from the one stream, each stream epoch after epoch from its position (`positions`, kept up to date
    for the checkpoints). A micro-batch without a readable image is skipped by this process alone: each process keeps
    its own positions, so no process waits for another to learn it; an epoch without any stops the run."""

    def __init__(self, accelerator: Accelerator, args, streams: dict, positions: dict, per_resolution: bool):
        pin = accelerator.device.type == "cuda"
        workers = data_workers(args.num_workers)
        self.streams = {
            str(key): process_batches(BatchStream(data, batch_size, args.seed, workers, pin), positions[str(key)])
            for key, (data, batch_size) in streams.items()
        }
        self.positions, self.per_resolution = positions, per_resolution
        self.accelerator, self.args = accelerator, args

    def next(self, step_draws: dict) -> dict:
        """{"pixel_values" (B, 3, S, S) on the device, "index" (B,), "epoch"} with B >= 1."""
        key = str(step_draws["resolution"]) if self.per_resolution else "all"
        while True:
            epoch, used, batch = next(self.streams[key])
            self.positions[key] = (epoch, used)
            if batch is None:
                raise ValueError(
                    f"Process {self.accelerator.process_index} found no readable image in a whole epoch of "
                    f"{self.args.data}: it holds fewer than one batch of {self.args.batch_size} images per process, or "
                    "none that can be decoded."
                )
            if len(batch["pixel_values"]):  # pinned on a GPU: the copy does not make the host wait
                pixel_values = batch["pixel_values"].to(self.accelerator.device, non_blocking=True)
                return {**batch, "pixel_values": pixel_values, "epoch": epoch}


class StepLog:
    """What the lines of metrics.jsonl hold, gathered between them. On the device, so that only a logging step waits
    for it: the loss and its terms summed over micro-batches, the gradient norm summed over steps, and the first
    non-finite loss or gradient norm (step, which, value; a gradient norm only outside fp16, whose loss scaler skips
    such steps itself). On the host: images, each step's draws, data and teacher time. `read` gathers every process's
    values and reads them on the host, once per line."""

    def __init__(self, accelerator: Accelerator, args, teacher: torch.nn.Module):
        self.accelerator, self.args = accelerator, args
        self.clock = TeacherClock(teacher, accelerator.device)
        self.check_grad_norm = accelerator.mixed_precision != "fp16"
        self.start_sums()
        self.start_clocks()

    def start_sums(self) -> None:
        device = self.accelerator.device
        self.sums, self.names, self.micro_batches, self.images = None, [], 0, 0
        self.grad_norm, self.draws = torch.zeros((), device=device), []
        self.first_bad = torch.full((3,), -1.0, device=device)  # (1-based step, 0 loss / 1 gradient norm, value)

    def start_clocks(self) -> None:
        """The time of the next line starts now (a checkpoint's or a validation's time is not a step's)."""
        self.start, self.data_seconds = time.perf_counter(), 0.0
        self.clock.reset()

    def add_batch(self, images: int, data_seconds: float) -> None:
        self.images += images
        self.data_seconds += data_seconds

    def add_loss(self, loss: torch.Tensor, terms: dict, step: int) -> None:
        values = torch.stack([loss, *terms.values()]).detach().float()
        self.sums = values if self.sums is None else self.sums + values
        self.names, self.micro_batches = ["loss", *terms], self.micro_batches + 1
        self.note_if_not_finite(values[0], 0, step)

    def add_update(self, grad_norm: torch.Tensor, step: int, step_draws: dict) -> None:
        grad_norm = grad_norm.detach().float()
        self.grad_norm = self.grad_norm + grad_norm
        self.draws.append((step + 1, step_draws))
        if self.check_grad_norm:
            self.note_if_not_finite(grad_norm, 1, step)

    def note_if_not_finite(self, value: torch.Tensor, which: int, step: int) -> None:
        first = (self.first_bad[0] < 0) & ~torch.isfinite(value)
        noted = torch.stack([torch.full_like(value, step + 1), torch.full_like(value, which), value])
        self.first_bad = torch.where(first, noted, self.first_bad)

    def read(self, step: int) -> dict:
        """The values since the last read, over all processes: the loss and its terms (means over micro-batches and
        processes), "grad_norm" (mean over steps), "images" and "steps" (counts), "all_processes" (each process's
        draws at the last step). Raises FloatingPointError for a non-finite loss or gradient norm, ValueError when the
        processes drew differently at some step. The sums start again."""
        host = [self.images, *(value for _, draws in self.draws for value in draws.values())]
        vector = torch.cat([self.sums, self.grad_norm[None], self.first_bad,
                            torch.tensor(host, dtype=torch.float32).to(self.accelerator.device)])
        rows = self.accelerator.gather(vector[None]).tolist()  # (processes, values): the line's one read
        n, steps, names = len(self.names), len(self.draws), list(self.draws[-1][1])
        bad = [row[n + 1 : n + 4] for row in rows if row[n + 1] >= 0]
        if bad:
            self.stop_at(min(bad), step)
        per_process = [row[n + 5 :] for row in rows]  # each step's draws, step after step
        for index, (drawn_at, _) in enumerate(self.draws):
            at_step = [[int(v) for v in draws[index * len(names) : (index + 1) * len(names)]] for draws in per_process]
            if any(draws != at_step[0] for draws in at_step):
                raise ValueError(f"Processes disagree on {names} at step {drawn_at}: {at_step}.")
        processes = len(rows)
        values = {name: sum(row[i] for row in rows) / processes / self.micro_batches
                  for i, name in enumerate(self.names)}
        values.update(grad_norm=sum(row[n] for row in rows) / processes / steps, steps=steps,
                      images=int(sum(row[n + 4] for row in rows)),
                      all_processes={f"{name}_all_processes": [draws[i] for draws in at_step]
                                     for i, name in enumerate(names)})
        self.start_sums()
        return values

    def stop_at(self, first_bad: list, step: int) -> None:
        bad_step, which, value = first_bad
        seen = ("before the update" if bad_step == step + 1 else
                f"at step {step + 1}, the next that reads values (--log-every {self.args.log_every})")
        raise FloatingPointError(
            f"{('Loss', 'Gradient norm')[int(which)]} is {value} at step {int(bad_step)}; stopping {seen}. The last "
            f"good checkpoint is intact in {self.args.output_dir}/checkpoints: --resume with a lower --lr continues "
            "from it."
        )

    def line(self, values: dict, lr: float, step_draws: dict) -> tuple[dict, dict]:
        """(the logged values, each process's draws) of a logging step, from `read`'s `values`: per image and step
        over the time since the last line."""
        seconds = time.perf_counter() - self.start
        logs = {name: value for name, value in values.items() if name not in ("steps", "images", "all_processes")}
        logs.update(step_draws, lr=lr, images_per_s=values["images"] / seconds, step_time_s=seconds / values["steps"],
                    teacher_time_share=self.clock.seconds / seconds, data_time_share=self.data_seconds / seconds,
                    peak_memory_mib=peak_memory_mib(self.accelerator.device))
        return logs, values["all_processes"]

    def close(self) -> None:
        self.clock.remove()


def logs_at(args, step: int, validate) -> bool:
    """Whether step `step` (1-based) reads its values back to the host and writes a line: every --log-every steps, and
    every step that validates, checkpoints or ends the run, so that none of those follows a non-finite loss unseen and
    a line's sums start where a checkpoint's run resumes."""
    return (step % args.log_every == 0 or step % args.checkpoint_every == 0 or step == args.max_steps
            or (validate is not None and step % args.eval_every == 0)
            or (args.stop_at_step is not None and step >= args.stop_at_step))


def train_step(accelerator, args, student, optimizer, batches, loss_fn, log, step, step_draws, logging,
               warmup=None) -> dict | None:
    """Optimisation step `step` (0-based): --gradient-accumulation-steps micro-batches forward and backward, the
    gradient clipped (a frozen extractor's dropped first: `warmup`), the update. Its values stay on the device, in
    `log`; when `logging`, every value since the last line is read back after the last backward and before the update
    (`StepLog.read`, which stops the run on a non-finite loss or gradient norm before the weights change) and
    returned."""
    values = None
    for micro_batch in range(args.gradient_accumulation_steps):
        data_start = time.perf_counter()
        batch = batches.next(step_draws)
        log.add_batch(len(batch["pixel_values"]), time.perf_counter() - data_start)
        reseed_for_step(args.seed, step, accelerator.process_index, micro_batch)
        with accelerator.accumulate(student):
            with accelerator.autocast():
                loss, terms = loss_fn(student, batch, step_draws)
            accelerator.backward(loss)
            log.add_loss(loss, terms, step)
            if accelerator.sync_gradients:
                if warmup is not None:
                    warmup.drop_frozen_gradients(optimizer)
                # 0: no clipping (an infinite bound scales every gradient by exactly 1); the norm is logged
                bound = args.max_grad_norm or float("inf")
                log.add_update(accelerator.clip_grad_norm_(student.parameters(), bound), step, step_draws)
                if logging:
                    values = log.read(step)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    if not accelerator.sync_gradients:
        raise RuntimeError("Accelerate did not synchronise gradients at the end of an optimisation step.")
    return values


def open_logs(accelerator: Accelerator, args, script: str, step: int) -> RunLog:
    """OUT/metrics.jsonl, with the run's logs started: a resumed run's lines after `step` dropped (in validation.jsonl
    too), a new run's run.json written, each marked as the run's (OUT's manifest), the trackers started."""
    for name in ("metrics.jsonl", "validation.jsonl"):
        log = os.path.join(args.output_dir, name)
        if accelerator.is_main_process and args.resume and os.path.exists(log):
            truncate_metrics(log, step)
            record(args.output_dir, [name], keep=True)
    if accelerator.is_main_process and not args.resume:
        os.makedirs(args.output_dir, exist_ok=True)
        write_json(os.path.join(args.output_dir, "run.json"), run_record(script, args, accelerator.num_processes))
        record(args.output_dir, ["run.json"], keep=True)
    tracker_config = {name: value for name, value in vars(args).items() if value is not None}
    accelerator.init_trackers(script.rsplit(".", 1)[-1], config=tracker_config)
    return RunLog(args.output_dir, "metrics.jsonl")


def write_line(accelerator: Accelerator, metrics: RunLog, step: int, logs: dict, per_process: dict) -> None:
    """The line of logging step `step`: to the trackers, and (with every process's draws) to OUT/metrics.jsonl."""
    accelerator.log(logs, step=step)
    if accelerator.is_main_process:
        metrics.append({"step": step, **logs, **per_process})


def validate_and_keep_best(accelerator, args, script, student, validate, stats, step: int, best, teacher_mean=None):
    """Runs `validate` at `step`, appends its result to OUT/validation.jsonl and exports a new best to OUT/best;
    returns the best (score, score measure) so far. A score of another measure than the best's (a run resumed from
    before the centred score) is not comparable: it becomes the best."""
    result = {"step": step, **validate(student)}
    accelerator.print(f"validation at step {step}: score {result['score']:.4f}")
    if accelerator.is_main_process:
        RunLog(args.output_dir, "validation.jsonl").append(result)
    measure = result.get("score_measure", "cosine")
    if best is None or best[1] != measure or result["score"] > best[0]:
        best = result["score"], measure
        export(accelerator, student, args.output_dir, stats, script, args, "best", result, teacher_mean)
    return best


def processes_answer(accelerator: Accelerator, name: str, timeout: int) -> bool:
    """A roll call after a failure: whether every process of the run reaches it within `timeout` seconds (each sets
    its key `name/RANK` in the process group's store and waits for the others'). One that is stopped, stuck or gone
    never does, which the store says by type (a DistError), where gloo's own errors are untyped RuntimeErrors. A
    process that failed on its own waits until the others' collectives time out and they answer: it says so first."""
    if accelerator.num_processes == 1:
        return True
    print(f"process {accelerator.process_index} failed; waiting up to {timeout} s (--collective-timeout) for the "
          "other processes to answer, to tell a stopped or dead process from an error of its own", file=sys.stderr,
          flush=True)
    store = torch.distributed.distributed_c10d._get_default_store()  # the store the process group was set up with
    store.set(f"{name}/{accelerator.process_index}", "here")
    try:
        store.wait([f"{name}/{rank}" for rank in range(accelerator.num_processes)], timedelta(seconds=timeout))
    except torch.distributed.DistError:
        return False
    return True


def check_streams_fill_a_batch(args, streams: dict) -> None:
    """Raises ValueError when a stream of a sized dataset holds fewer images per process than one of its batches."""
    for data, batch_size in streams.values():
        if not isinstance(data, torch.utils.data.IterableDataset) and len(data) < batch_size:
            raise ValueError(
                f"{args.data} holds {len(data)} images per process, fewer than one batch of {batch_size}: lower "
                "--batch-size or add images."
            )


def prepare_student(accelerator: Accelerator, args, student) -> tuple:
    """(student, optimizer, extractor warmup or None), the student and its optimizer prepared by `accelerator`."""
    if args.gradient_checkpointing:
        student.activation_checkpointing_enable({"use_reentrant": False})
    optimizer = build_optimizer(student, args.optimizer, args.lr, args.weight_decay)
    warmup = ExtractorWarmup.from_args(args, single_process=accelerator.distributed_type == DistributedType.NO)
    if warmup is not None:
        optimizer = split_extractor_groups(optimizer, student)
    accelerator.print(describe(optimizer))
    student, optimizer = accelerator.prepare(student, optimizer)  # the teacher is not prepared: not in checkpoints
    return student, optimizer, warmup


def set_learning_rate(args, optimizer, warmup, step: int) -> float:
    """Sets step `step`'s learning rate, `lr * warmup_cosine(step)` (through the extractor warmup if any), returned."""
    lr = args.lr * warmup_cosine(step, args.warmup_steps, args.max_steps, args.min_lr / args.lr,
                                 args.warmup_start_lr / args.lr)
    if warmup is not None:
        warmup.apply(optimizer, step, lr)
    else:
        for group in optimizer.param_groups:
            group["lr"] = lr
    return lr


def distill(
    accelerator: Accelerator, args, script: str, student, teacher, dataset, stats, draws, loss_fn, validate=None,
    teacher_mean=None,
) -> None:
    """Trains `student` for `args.max_steps` optimisation steps (`args.optimizer`, split as the method's authors do:
    training.optim), resuming with `args.resume`, and exports it to `OUT/final`. Values are read back to the host on
    logging steps only (`logs_at`): between them, losses, counters and the non-finite guard stay on the device.

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
    teacher_mean: a training.teacher_mean.TeacherMean that loss_fn updates with the teacher's targets: kept in the
      checkpoints and saved into every export (`teacher_mean.safetensors`), the centre of the centred measures.
    run_args.freeze_extractor_steps / extractor_warmup_steps (LookWhere; training.extractor_warmup): the extractor
      stays frozen for that many steps, then its learning rate ramps up from 0.
    """
    streams = dataset if isinstance(dataset, dict) else {"all": (dataset, args.batch_size)}
    check_streams_fill_a_batch(args, streams)
    student, optimizer, warmup = prepare_student(accelerator, args, student)
    start_positions = {str(key): (0, 0) for key in streams}
    step, positions = (load_checkpoint(accelerator, args.output_dir, teacher_mean) if args.resume
                       else (0, start_positions))
    best = best_score(args.output_dir) if args.resume else None
    metrics = open_logs(accelerator, args, script, step)
    batches = MicroBatches(accelerator, args, streams, positions, per_resolution=isinstance(dataset, dict))
    log = StepLog(accelerator, args, teacher)
    progress = tqdm(total=args.max_steps, initial=step, disable=not accelerator.is_main_process, desc="distill")
    try:
        while step < args.max_steps:
            step_draws = draws(step)
            lr = set_learning_rate(args, optimizer, warmup, step)
            logging = logs_at(args, step + 1, validate)
            values = train_step(accelerator, args, student, optimizer, batches, loss_fn, log, step, step_draws, logging,
                                warmup)
            step += 1
            progress.update(1)
            if not logging:
                continue
            logs, per_process = log.line(values, lr, step_draws)
            progress.set_postfix(loss=f"{logs['loss']:.4f}", **step_draws)
            write_line(accelerator, metrics, step, logs, per_process)
            if validate is not None and (step % args.eval_every == 0 or step == args.max_steps):
                best = validate_and_keep_best(accelerator, args, script, student, validate, stats, step, best,
                                              teacher_mean)
            if step % args.checkpoint_every == 0 or step == args.max_steps:
                save_checkpoint(accelerator, args.output_dir, step, positions, args.keep_checkpoints, teacher_mean)
            if args.stop_at_step is not None and step >= args.stop_at_step:
                accelerator.print(f"stopping at step {step} as asked (--stop-at-step)")
                break
            log.start_clocks()
    except KeyboardInterrupt:
        raise RunStopped(f"interrupted (Ctrl-C) at step {step}. {RESUME.format(args.output_dir)}", 130) from None
    except RuntimeError:  # a collective that timed out, or whose peer is gone, if the others do not answer either
        if not processes_answer(accelerator, f"failure_at_step_{step + 1}", args.collective_timeout):
            raise RunStopped(f"another process did not answer within --collective-timeout {args.collective_timeout} s "
                             f"(stopped, stuck or dead) at step {step + 1}. {RESUME.format(args.output_dir)}") from None
        raise
    finally:
        log.close()
        progress.close()
    if step == args.max_steps:
        export(accelerator, student, args.output_dir, stats, script, args, teacher_mean=teacher_mean)
    del student, optimizer  # see finish: the prepared model must go before the process group
    finish(accelerator, args.output_dir)
