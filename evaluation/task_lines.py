"""The lines of one variant of the sparse-recognition task, each read by the readers of evaluation.readers: a line is
the per-canvas test correctness of each reader, the linear probe's head (where fine-tuning starts), its GFLOPs and
what else its benchmark keeps. `Measure` holds them; the teacher's two lines, dense (DENSE) and at equal FLOPs
(EQUAL), are its own, every student's line its benchmark's (`add`)."""

import copy

import torch

from evaluation.finetune_protocol import FineTuned, Resume, finetune
from evaluation.readers import attentive_probe, probe
from evaluation.teacher_passes import compute_pass, pass_record, resized, teacher_features, tokens_of

DENSE = "teacher dense"
EQUAL = "teacher at equal FLOPs"


class Measure:
    """Every line of one variant: per line, the per-canvas test correctness of each reader (`readers`: the linear
    probe on [CLS ; mean patch], and the attentive probe on the tokens where the line has them; `correct` is the
    linear probe's), its GFLOPs, and what its benchmark adds. `teacher_out[variant, split]` are teacher passes
    (pass_record); `equal_out[split]`, when given, the teacher's passes at `equal_size` (else computed here)."""

    def __init__(self, args, variant: str, splits: dict, teacher_out: dict, costs: dict, equal_size: int,
                 equal_out: dict | None = None):
        self.args, self.variant, self.costs, self.equal_size = args, variant, costs, equal_size
        self.train, self.test = splits["train"], splits["test"]
        self.teacher_train, self.teacher_test = teacher_out[variant, "train"], teacher_out[variant, "test"]
        self.equal_out = equal_out
        self.lines, self.heads = {}, {}

    def read(self, train_features: torch.Tensor, test_features: torch.Tensor, train_tokens=None, test_tokens=None, *,
             first: int | None = None) -> dict:
        """Each reader's test correctness, decay and validation accuracies, and the linear probe's head; with `first`,
        `test_features` (and tokens) are of the first `first` test canvases alone, and so is the correctness."""
        labels = self.test.labels[:first]
        linear = probe(train_features, self.train.labels, test_features, self.args.val, self.args.probe_decays)
        fits = {"linear": linear}
        if train_tokens is not None:
            fits["attentive"] = attentive_probe(train_tokens, self.train.labels, test_tokens, self.args.val,
                                                self.args.attentive_decays, self.args.seed)
        readers = {name: {"weight_decay": fit["weight_decay"], "val_accuracy": fit["val_accuracy"],
                          "correct": (fit["predictions"] == labels).float()} for name, fit in fits.items()}
        return {"readers": readers, "correct": readers["linear"]["correct"], "head": linear["head"]}

    def add(self, name: str, train_features: torch.Tensor, test_features: torch.Tensor, gflops: float, *,
            train_tokens=None, test_tokens=None, **extra) -> None:
        line = self.read(train_features, test_features, train_tokens, test_tokens)
        self.heads[name] = line.pop("head")
        self.lines[name] = {"gflops": gflops, "weight_decay": line["readers"]["linear"]["weight_decay"], **line,
                            **extra}

    def teacher_lines(self, teacher) -> None:
        self.add(DENSE, self.teacher_train["features"], self.teacher_test["features"], self.costs["dense"],
                 **self.teacher_tokens(self.teacher_train, self.teacher_test))
        with_tokens = "patches" in self.teacher_train and "patches" in self.teacher_test  # both readers, or linear
        equal = self.equal_out or {split: pass_record(compute_pass(teacher, getattr(self, split), self.equal_size,
                                                                   self.args.batch_size), keep_patches=with_tokens)
                                   for split in ("train", "test")}
        self.add(EQUAL, equal["train"]["features"], equal["test"]["features"], self.costs["equal"],
                 size=self.equal_size, **self.teacher_tokens(equal["train"], equal["test"]))

    @staticmethod
    def teacher_tokens(train: dict, test: dict) -> dict:
        """The attentive probe's inputs of two teacher passes, when both kept their patch tokens."""
        if "patches" not in train or "patches" not in test:
            return {}
        return {"train_tokens": tokens_of(train), "test_tokens": tokens_of(test)}

    def finetuned(self, model, gflops: float, resume: Resume | None = None) -> dict:
        result = finetune(model, self.train, self.test, self.args, self.args.val, resume)
        return {**result, "gflops": gflops, "correct": (result.pop("predictions") == self.test.labels).float()}

    def finetune_teacher(self, teacher, name: str, resume: Resume | None = None) -> dict:
        """The teacher's line `name` (DENSE or EQUAL) fine-tuned by the protocol from its linear probe's head, on the
        features that probe read ([CLS ; mean patch], registers left out), at its size (EQUAL's: the canvas resized
        as its passes resized it)."""
        size = self.equal_size if name == EQUAL else None

        def features_of(backbone, rows, pixels, seed):
            return teacher_features(backbone, pixels if size is None else resized(pixels, size))

        model = copy.deepcopy(teacher).float().requires_grad_(True)
        return self.finetuned(FineTuned(features_of, model, self.heads[name]), self.lines[name]["gflops"], resume)
