"""The teacher's mean CLS and patch token over the training crops: the centre that the centred agreement measures
(`corevision_hf.agreement.per_image_agreement(..., centre)`) subtract, so that a student outputting the mean token
scores 0 there. Validation uses the mean as it stood at the run's first validation, fixed from then on and kept in
the checkpoints (`validation_centre`), so that every step's score, and so `best/`, is measured against one centre;
the export holds the mean over every crop. Summed on the device during training (no host read), reduced over
processes when asked, saved with every checkpoint (per process: a resume continues the sums) and into every exported
folder as `teacher_mean.safetensors` (tensors "cls" and "patch", (D,) float32; metadata "cls_count", "patch_count":
the tokens averaged)."""

import os

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, safe_open, save_file

from corevision_hf.atomic import atomic_path

FILE = "teacher_mean.safetensors"


class TeacherMean:
    """Running sums of the teacher's CLS tokens and patch tokens in float64 on `device`; the token counts are host
    integers, known from the shapes, so `update` never waits for the device."""

    def __init__(self, device: torch.device | str = "cpu"):
        self.device = torch.device(device)
        self.cls_sum = self.patch_sum = None
        self.cls_count = self.patch_count = 0
        self.fixed_centre = None

    def update(self, cls: torch.Tensor, patches: torch.Tensor) -> None:
        """Adds a batch of teacher targets: cls (B, D), patches (B, N, D)."""
        cls_sum = cls.detach().float().sum(0).to(self.device, torch.float64)
        patch_sum = patches.detach().float().sum((0, 1)).to(self.device, torch.float64)
        if self.cls_sum is None:
            self.cls_sum, self.patch_sum = torch.zeros_like(cls_sum), torch.zeros_like(patch_sum)
        self.cls_sum += cls_sum
        self.patch_sum += patch_sum
        self.cls_count += cls.shape[0]
        self.patch_count += patches.shape[0] * patches.shape[1]

    def totals(self, accelerator=None) -> torch.Tensor | None:
        """(cls sum (D,), patch sum (D,), cls count, patch count) as one float64 vector, summed over the processes of
        `accelerator` (a collective: every process calls it); None before the first token."""
        if self.cls_sum is None:  # before the first step; every process steps alike, so all or none have tokens
            return None
        counts = torch.tensor([self.cls_count, self.patch_count], dtype=torch.float64, device=self.device)
        vector = torch.cat([self.cls_sum, self.patch_sum, counts])
        if accelerator is not None and accelerator.num_processes > 1:
            vector = accelerator.reduce(vector.to(accelerator.device), "sum").to(self.device)
        return vector

    def centre(self, accelerator=None) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(mean CLS token (D,), mean patch token (D,)) in float32 over every process's tokens (a collective with
        several processes), on the device; None before any token was seen."""
        vector = self.totals(accelerator)
        if vector is None:
            return None
        width = (vector.numel() - 2) // 2
        return ((vector[:width] / vector[-2]).float(), (vector[width : 2 * width] / vector[-1]).float())

    def validation_centre(self, accelerator=None) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The centre every validation of the run uses: `centre` at the first call that has tokens (a collective with
        several processes, as validation is), then that same pair, also after a resume (`state_dict` keeps it)."""
        if self.fixed_centre is None:
            self.fixed_centre = self.centre(accelerator)
        return self.fixed_centre

    def save(self, folder: str, accelerator=None) -> None:
        """Writes `folder/teacher_mean.safetensors` (the main process, under a temporary name then renamed); every
        process must call it. Nothing is written before any token was seen."""
        vector = self.totals(accelerator)
        if vector is None or (accelerator is not None and not accelerator.is_main_process):
            return
        width = (vector.numel() - 2) // 2
        counts = {"cls_count": str(int(vector[-2])), "patch_count": str(int(vector[-1]))}
        tensors = {"cls": (vector[:width] / vector[-2]).float().cpu(),
                   "patch": (vector[width : 2 * width] / vector[-1]).float().cpu()}
        path = os.path.join(folder, FILE)
        with atomic_path(path) as temporary:
            save_file(tensors, temporary, metadata=counts)

    def state_dict(self) -> dict:
        """This process's sums and counts (a checkpoint holds one per process), and the validation centre once fixed."""
        if self.cls_sum is None:
            return {}
        state = {"cls_sum": self.cls_sum.cpu(), "patch_sum": self.patch_sum.cpu(),
                 "counts": torch.tensor([self.cls_count, self.patch_count], dtype=torch.int64)}
        if self.fixed_centre is not None:
            state["validation_cls"], state["validation_patch"] = (t.cpu() for t in self.fixed_centre)
        return state

    def load_state_dict(self, state: dict) -> None:
        self.fixed_centre = None  # a checkpoint from before the first validation, or from before it was kept
        if not state:
            self.cls_sum = self.patch_sum = None
            self.cls_count = self.patch_count = 0
            return
        if "validation_cls" in state:
            self.fixed_centre = (state["validation_cls"].to(self.device), state["validation_patch"].to(self.device))
        self.cls_sum = state["cls_sum"].to(self.device, torch.float64)
        self.patch_sum = state["patch_sum"].to(self.device, torch.float64)
        self.cls_count, self.patch_count = (int(c) for c in state["counts"])


def checkpoint_file(process_index: int) -> str:
    return f"teacher_mean_{process_index}.safetensors"


def save_state(teacher_mean: TeacherMean, folder: str, process_index: int) -> None:
    """This process's sums into a checkpoint folder (an empty file before any token was seen)."""
    save_file(teacher_mean.state_dict(), os.path.join(folder, checkpoint_file(process_index)))


def load_state(teacher_mean: TeacherMean, folder: str, process_index: int) -> bool:
    """This process's sums from a checkpoint folder; False (sums left empty) when it holds none, e.g. a checkpoint
    written before the centre was recorded."""
    path = os.path.join(folder, checkpoint_file(process_index))
    if not os.path.isfile(path):
        teacher_mean.load_state_dict({})
        return False
    teacher_mean.load_state_dict(load_file(path))
    return True


def load_teacher_mean(folder: str, width: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(mean CLS token (D,), mean patch token (D,)) float32 from `folder/teacher_mean.safetensors`, the teacher's mean
    over the training crops that an exported model folder holds; None when there is no such file. A ValueError (one
    line) when the file cannot be read, lacks the tensors, or holds anything but two finite floating-point vectors of
    the model's output width `width` (one of width 1 would broadcast: every centred score silently wrong)."""
    path = os.path.join(folder, FILE)
    if not os.path.isfile(path):
        return None
    try:
        with safe_open(path, framework="pt") as f:
            cls, patch = f.get_tensor("cls"), f.get_tensor("patch")
    except (SafetensorError, OSError, KeyError, RuntimeError) as error:
        raise ValueError(f"{path} is corrupt ({' '.join(str(error).split())[:120]}): delete it, or export the "
                         "model folder again.") from None
    if cls.ndim != 1 or cls.shape != patch.shape:
        raise ValueError(f"{path} is corrupt: cls {tuple(cls.shape)} and patch {tuple(patch.shape)} are not two "
                         "(D,) vectors.")
    fix = "delete it (the evaluation images' own mean serves), or export the model folder again."
    if cls.shape[0] != width:
        raise ValueError(f"{path} holds means of width {cls.shape[0]}, not the model's output width {width}: {fix}")
    if not (cls.is_floating_point() and patch.is_floating_point()):
        raise ValueError(f"{path} holds {cls.dtype if not cls.is_floating_point() else patch.dtype} tensors, not "
                         f"floating point: {fix}")
    if not (cls.isfinite().all() and patch.isfinite().all()):
        raise ValueError(f"{path} holds NaN or infinite values: {fix}")
    return cls.float(), patch.float()
