import time, torch, sys, random
sys.path.insert(0, ".")
from corevision_hf.offline import load_dinov2_small_teacher
from corevision_hf import veca_from_teacher
from training.conversion import teacher_targets, transfer_errors, format_table, transfer_pass, branch_error, seed_core_bank
from evaluation.sparse_digits import make_canvases
from evaluation.canvases import Split
torch.set_num_threads(2)
teacher, _ = load_dinov2_small_teacher()
size = int(sys.argv[1]); n = int(sys.argv[2]); steps = int(sys.argv[3]); lr = float(sys.argv[4])
c = make_canvases(n + 2, variant="single", split="train", seed=1, digit_size=56, canvas_size=518)
split = Split.of_canvases(c, 37)
def px(rows):
    x = split.pixels(rows)
    return torch.nn.functional.interpolate(x, size=(size, size), mode="bicubic", antialias=True) if size != 518 else x
train = [teacher_targets(teacher, px(slice(i, i + 2))) for i in range(0, n, 2)]
val = teacher_targets(teacher, px(slice(n, n + 2)))
torch.manual_seed(0)
student = veca_from_teacher(teacher, num_cores=64)
if len(sys.argv) > 5 and sys.argv[5] == "seeded":
    print(seed_core_bank(student, teacher, [px(slice(i, i + 2)) for i in range(0, n, 2)]))
print(format_table(transfer_errors(student, val, [8, 64])))
student.requires_grad_(False)
trainable = list(student.embeddings.core_bank.parameters()) + list(student.encoder.coordinate_heads.parameters())
for p in trainable: p.requires_grad_(True)
opt = torch.optim.AdamW(trainable, lr=lr, weight_decay=0.0)
t0 = time.time()
for step in range(steps):
    tg = train[step % len(train)]
    C = random.Random(step).choice([8, 16, 32, 64])
    outs = transfer_pass(student, tg, C)
    loss = sum(branch_error(o, t) for o, t in zip(outs, tg["branches"])) / len(outs)
    opt.zero_grad(); loss.backward(); opt.step()
    if step % 20 == 0: print(step, C, round(loss.item(), 3), round(time.time() - t0), flush=True)
print(format_table(transfer_errors(student, val, [8, 64])))
