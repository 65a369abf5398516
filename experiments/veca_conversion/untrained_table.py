import time, torch, sys
sys.path.insert(0, ".")
from corevision_hf.offline import load_dinov2_small_teacher
from corevision_hf import veca_from_teacher
from training.conversion import teacher_targets, transfer_errors, format_table
from evaluation.sparse_digits import make_canvases
from evaluation.canvases import Split
torch.set_num_threads(2)
teacher, _ = load_dinov2_small_teacher()
size = int(sys.argv[1]) if len(sys.argv) > 1 else 518
c = make_canvases(2, variant="single", split="train", seed=1, digit_size=56, canvas_size=518)
split = Split.of_canvases(c, 37)
x = split.pixels(slice(0, 2))
if size != 518:
    x = torch.nn.functional.interpolate(x, size=(size, size), mode="bicubic", antialias=True)
t0 = time.time(); tg = teacher_targets(teacher, x); print("teacher", time.time() - t0)
torch.manual_seed(0)
student = veca_from_teacher(teacher, num_cores=64).eval()
t0 = time.time(); table = transfer_errors(student, tg, [8, 64]); print("table", time.time() - t0)
print(format_table(table))
