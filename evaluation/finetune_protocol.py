"""The task benchmarks' fine-tuning protocol: a backbone's features and a linear head started from the line's linear
probe (`FineTuned`), trained end to end with labels (`finetune`: AdamW, cosine, the epoch chosen on the validation
canvases, 0 being the probe's head, stopped early after --finetune-patience epochs without a better one), and its
test predictions (`predict`)."""

import copy
import math
import time

import torch
import torch.nn.functional as F

from evaluation.canvases import Split


class FineTuned(torch.nn.Module):
    """A backbone's [CLS ; mean patch] features and a linear head (started from the probe's)."""

    def __init__(self, features_of, backbone: torch.nn.Module, head: torch.nn.Module):
        super().__init__()
        self.features_of, self.backbone, self.head = features_of, backbone, copy.deepcopy(head).requires_grad_(True)

    def forward(self, rows: torch.Tensor, pixels: torch.Tensor, seed: int) -> torch.Tensor:
        """Logits of canvases `rows` (their random cells, if any, drawn with `seed`)."""
        return self.head(self.features_of(self.backbone, rows, pixels, seed))


def finetune(model: FineTuned, train: Split, test: Split, args, val: int) -> dict:
    """Trains the backbone and head on the training canvases but the last `val` (AdamW, the backbone at
    --finetune-lr, the head at 10x, cosine over --finetune-epochs, batch --batch-size, order from --seed), stopping
    early once --finetune-patience epochs in a row have not raised the best validation accuracy. The best of the start
    (epoch 0: the probe's head on the frozen backbone) and each epoch run on the validation canvases (ties: the
    earliest) is measured on the test canvases. Returns {"predictions", "val_accuracy" per epoch run from 0, "epoch",
    "stopped_early", "train_time_s"}."""
    fit, held = len(train) - val, range(len(train) - val, len(train))
    backbone = [p for p in model.backbone.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW([{"params": backbone, "lr": args.finetune_lr},
                                   {"params": model.head.parameters(), "lr": 10 * args.finetune_lr}], weight_decay=0.05)
    peaks = [group["lr"] for group in optimizer.param_groups]
    total = math.ceil(fit / args.batch_size) * args.finetune_epochs
    generator = torch.Generator().manual_seed(args.seed)
    started, step = time.perf_counter(), 0

    def validation_accuracy() -> float:
        return float((predict(model, train, held, args.batch_size, args.seed) == train.labels[fit:]).float().mean())

    history = [validation_accuracy()]
    best, state = 0, copy.deepcopy(model.state_dict())
    print(f"      start (the probe's head): validation accuracy {history[0]:.3f}", flush=True)
    for epoch in range(1, args.finetune_epochs + 1):
        model.train()
        order = torch.randperm(fit, generator=generator)
        for first in range(0, fit, args.batch_size):
            rows = order[first : first + args.batch_size].sort().values
            for group, peak in zip(optimizer.param_groups, peaks):
                group["lr"] = peak * 0.5 * (1 + math.cos(math.pi * step / total))
            loss = F.cross_entropy(model(rows, train.pixels(rows), args.seed), train.labels[rows])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step += 1
        history.append(validation_accuracy())
        print(f"      epoch {epoch}/{args.finetune_epochs}: validation accuracy {history[-1]:.3f}", flush=True)
        if history[-1] > history[best]:
            best, state = epoch, copy.deepcopy(model.state_dict())
        if args.finetune_patience is not None and epoch - best >= args.finetune_patience:
            break
    train_time = time.perf_counter() - started
    model.load_state_dict(state)
    return {"predictions": predict(model, test, range(len(test)), args.batch_size, args.seed + 1),
            "val_accuracy": history, "epoch": best, "stopped_early": len(history) - 1 < args.finetune_epochs,
            "train_time_s": train_time}


@torch.inference_mode()
def predict(model: FineTuned, split: Split, rows, batch_size: int, seed: int) -> torch.Tensor:
    """(len(rows),) predicted classes of canvases `rows` of `split`, a batch at a time (random cells from `seed`)."""
    model.eval()
    rows = torch.as_tensor(list(rows))
    return torch.cat([model(part, split.pixels(part), seed).argmax(-1) for part in rows.split(batch_size)])
