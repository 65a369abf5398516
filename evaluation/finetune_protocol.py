"""The task benchmarks' fine-tuning protocol: a backbone's features and a linear head started from the line's linear
probe (`FineTuned`), trained end to end with labels (`finetune`: AdamW, cosine, the epoch chosen on the validation
canvases, 0 being the probe's head, stopped early after --finetune-patience epochs without a better one; with a
`Resume`, each finished epoch kept on disk so that a killed run goes on from there), and its test predictions
(`predict`).

The cosine schedule spans --finetune-epochs, the most a run may take, and is not shortened when patience stops a run
early: how many epochs a run takes is known only as validation is read, so no schedule fixed in advance can end at
the stop, and a schedule that changes as validation is read would let validation steer the learning rate too. A run
stopped early therefore ends before its learning rate has annealed; `finetune` reports how far (its "schedule")."""

import copy
import hashlib
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from corevision_hf.atomic import atomic_path
from evaluation.canvases import Split


class FineTuned(torch.nn.Module):
    """A backbone's [CLS ; mean patch] features and a linear head (started from the probe's)."""

    def __init__(self, features_of, backbone: torch.nn.Module, head: torch.nn.Module):
        super().__init__()
        self.features_of, self.backbone, self.head = features_of, backbone, copy.deepcopy(head).requires_grad_(True)

    def forward(self, rows: torch.Tensor, pixels: torch.Tensor, seed: int) -> torch.Tensor:
        """Logits of canvases `rows` (their random cells, if any, drawn with `seed`)."""
        return self.head(self.features_of(self.backbone, rows, pixels, seed))


@dataclass
class Resume:
    """Where a fine-tuning run keeps its last finished epoch (`path`, one file), and what names the run (`identity`:
    the canvases, the line; `finetune` adds its settings and a digest of the starting weights). A file of another run
    is not resumed: the run starts over and replaces it."""

    path: Path
    identity: dict


def cosine_factor(step: int, total: int) -> float:
    """The learning rate of step `step` (from 0) over its peak: a cosine from 1 at step 0 towards 0 at `total`."""
    return 0.5 * (1 + math.cos(math.pi * step / total))


def finetune(model: FineTuned, train: Split, test: Split, args, val: int, resume: Resume | None = None) -> dict:
    """Trains the backbone and head on the training canvases but the last `val` (AdamW, the backbone at
    --finetune-lr, the head at 10x, cosine over --finetune-epochs, batch --batch-size, order from --seed), stopping
    early once --finetune-patience epochs in a row have not raised the best validation accuracy. The best of the start
    (epoch 0: the probe's head on the frozen backbone) and each epoch run on the validation canvases (ties: the
    earliest) is measured on the test canvases. With `resume`, the state after each epoch is written to its file, and
    a run that finds its own file there goes on after that epoch, to the same bits as one never stopped. Returns
    {"predictions", "val_accuracy" per epoch run from 0, "epoch", "stopped_early", "train_time_s", "schedule",
    "resumed_after_epoch"}."""
    fit, held = len(train) - val, range(len(train) - val, len(train))
    backbone = [p for p in model.backbone.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW([{"params": backbone, "lr": args.finetune_lr},
                                   {"params": model.head.parameters(), "lr": 10 * args.finetune_lr}], weight_decay=0.05)
    peaks = [group["lr"] for group in optimizer.param_groups]
    total = math.ceil(fit / args.batch_size) * args.finetune_epochs
    generator = torch.Generator().manual_seed(args.seed)
    started = time.perf_counter()

    def validation_accuracy() -> float:
        return float((predict(model, train, held, args.batch_size, args.seed) == train.labels[fit:]).float().mean())

    key = run_key(model, args, val, resume)
    run = read_run(resume, key, model, optimizer, generator)
    resumed_after = None if run is None else len(run["history"]) - 1
    if run is None:
        run = {"history": [validation_accuracy()], "best": 0, "best_state": copy.deepcopy(model.state_dict()),
               "step": 0, "train_time_s": 0.0}
        print(f"      start (the probe's head): validation accuracy {run['history'][0]:.3f}", flush=True)
    else:
        print(f"      resumed after epoch {resumed_after} ({resume.path})", flush=True)
    while not finished(run, args):
        model.train()
        order = torch.randperm(fit, generator=generator)
        for first in range(0, fit, args.batch_size):
            rows = order[first : first + args.batch_size].sort().values
            for group, peak in zip(optimizer.param_groups, peaks):
                group["lr"] = peak * cosine_factor(run["step"], total)
            loss = F.cross_entropy(model(rows, train.pixels(rows), args.seed), train.labels[rows])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            run["step"] += 1
        run["history"].append(validation_accuracy())
        epoch = len(run["history"]) - 1
        print(f"      epoch {epoch}/{args.finetune_epochs}: validation accuracy {run['history'][-1]:.3f}", flush=True)
        if run["history"][-1] > run["history"][run["best"]]:
            run["best"], run["best_state"] = epoch, copy.deepcopy(model.state_dict())
        if resume is not None:
            write_run(resume, key, run, model, optimizer, generator, time.perf_counter() - started)
    train_time = run["train_time_s"] + time.perf_counter() - started
    model.load_state_dict(run["best_state"])
    return {"predictions": predict(model, test, range(len(test)), args.batch_size, args.seed + 1),
            "val_accuracy": run["history"], "epoch": run["best"],
            "stopped_early": len(run["history"]) - 1 < args.finetune_epochs, "train_time_s": train_time,
            "schedule": schedule_record(run["step"], total, args.finetune_epochs), "resumed_after_epoch": resumed_after}


def finished(run: dict, args) -> bool:
    """Whether the run has taken --finetune-epochs epochs, or --finetune-patience in a row without a better one."""
    epoch = len(run["history"]) - 1
    return epoch >= args.finetune_epochs or (args.finetune_patience is not None
                                             and epoch - run["best"] >= args.finetune_patience)


def schedule_record(steps_run: int, total: int, epochs: int) -> dict:
    """What the JSON says of the schedule: a cosine over --finetune-epochs, and the learning rate of the last step
    taken over its peak (near 0 where the run took every epoch; higher where patience stopped it)."""
    return {"kind": "cosine over the most epochs a run may take, not shortened by an early stop",
            "over_epochs": epochs, "over_steps": total, "steps_run": steps_run,
            "last_lr_over_peak": cosine_factor(max(steps_run - 1, 0), total)}


def run_key(model: FineTuned, args, val: int, resume: Resume | None) -> str | None:
    """SHA-256 of what makes a run (its `resume` identity, the protocol's settings and every starting weight, in
    order), or None without `resume`."""
    if resume is None:
        return None
    settings = {name: getattr(args, name) for name in ("finetune_lr", "finetune_epochs", "finetune_patience",
                                                       "batch_size", "seed")}
    digest = hashlib.sha256(repr(sorted({**resume.identity, **settings, "val": val}.items())).encode())
    for name, tensor in model.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().float().contiguous().numpy().tobytes())
    return digest.hexdigest()


def read_run(resume: Resume | None, key: str | None, model, optimizer, generator) -> dict | None:
    """The run kept in `resume`'s file, restored into the model, optimizer, order generator and torch's random state;
    None when there is none, or it is another run's or unreadable (said; the run starts over)."""
    if resume is None or not resume.path.is_file():
        return None
    try:
        saved = torch.load(resume.path, weights_only=True)
    except (OSError, RuntimeError, ValueError, EOFError) as error:
        print(f"      {resume.path} cannot be read ({type(error).__name__}): fine-tuning starts over", flush=True)
        return None
    if saved.get("key") != key:
        print(f"      {resume.path} is another run's (other canvases, settings or start): fine-tuning starts over",
              flush=True)
        return None
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    generator.set_state(saved["generator"])
    torch.set_rng_state(saved["torch_rng"])
    return saved["run"]


def write_run(resume: Resume, key: str, run: dict, model, optimizer, generator, elapsed: float) -> None:
    """The state after an epoch, written whole (corevision_hf.atomic): what `read_run` restores."""
    resume.path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(resume.path) as temporary:
        torch.save({"key": key, "run": {**run, "train_time_s": run["train_time_s"] + elapsed},
                    "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "generator": generator.get_state(), "torch_rng": torch.get_rng_state()}, temporary)


@torch.inference_mode()
def predict(model: FineTuned, split: Split, rows, batch_size: int, seed: int) -> torch.Tensor:
    """(len(rows),) predicted classes of canvases `rows` of `split`, a batch at a time (random cells from `seed`)."""
    model.eval()
    rows = torch.as_tensor(list(rows))
    return torch.cat([model(part, split.pixels(part), seed).argmax(-1) for part in rows.split(batch_size)])
