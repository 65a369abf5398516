"""Attentive-probe settings on the pilot's cached teacher passes (seed 1's training canvases, 28 px digits, no
scribbles): validation accuracy of a few fits. A study, not a product: its log is LOG.md beside this file."""

import sys
import time
import types

import torch

from evaluation.attentive_probe import fit_attentive_classifier, predict_tokens
from evaluation.canvases import task_splits
from evaluation.teacher_passes import TeacherPasses, pass_record, tokens_of
from evaluation.teachers import load_teacher_model

torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
teacher, _ = load_teacher_model("offline-dinov2-small")
canvases = types.SimpleNamespace(canvas_size=518, seed=1, background="black", digit_size=28, strokes=0, train=240,
                                 test=1)
split = task_splits(canvases, "single")["train"]
passes = TeacherPasses("outputs/task_cache", teacher, 8)
val = 60
for size in (518, 168):
    tokens = tokens_of(pass_record(passes.get(split, split.key, size)))
    labels = split.labels
    for settings in (dict(), dict(steps=400), dict(heads=1), dict(heads=8), dict(lr=1e-2), dict(batch_size=32),
                     dict(steps=400, lr=1e-2, weight_decay=1e-2)):
        started = time.perf_counter()
        probe = fit_attentive_classifier(tokens[:-val], labels[:-val], 10, **{"weight_decay": 1e-3, **settings})
        accuracy = float((predict_tokens(probe, tokens[-val:]) == labels[-val:]).float().mean())
        print(f"{size} px {settings}: {accuracy:.3f} ({time.perf_counter() - started:.0f} s)", flush=True)
