"""The students of the quality benchmark (benchmarks.distill_quality), each trained identically against one teacher:
what each is (STUDENTS: its family, the initialisation it shares, the --lr-* argument of its peak lr), how each is made
(`new_student`, with its step loss and per-step budget draws; VECA from the teacher as issue #67's conversion makes it:
its bank seeded from the teacher's tokens here, its stage 1 in evaluation.quality_training, its loss stage 2's), the budgets it is measured at (`budgets_of`) and
validated at (`validation_budgets`), and its analytic cost (`gflops`)."""

import torch
from transformers import Dinov2Config, Dinov2Model
from transformers.modeling_outputs import BaseModelOutputWithPooling
from transformers.models.dinov2.modeling_dinov2 import Dinov2PreTrainedModel

from corevision_hf import (
    LookWhereModel, VecaConfig, VecaModel, lookwhere_flops, lookwhere_from_teacher, veca_flops, veca_from_teacher,
)
from corevision_hf.agreement import teacher_flops
from corevision_hf.lookwhere.budget_lookwhere import kept_for_ratio
from corevision_hf.veca.configuration_veca import swiglu_intermediate_size
from training.conversion import end_to_end_loss, seed_core_bank, teacher_targets
from training.losses import lookwhere_loss, veca_loss
from training.schedule import draw, draw_int

NUM_CORES = 32
ELASTIC_BUDGETS = (1, 2, 4, 8, 16, 32)  # trained by the elastic student and evaluated for every VECA
LOOKWHERE_K_RATIOS = (0.1, 0.25, 0.5, 1.0)
# student -> (family, initialisation it shares, the --lr-* argument that sets its peak lr)
STUDENTS = {
    "VECA elastic": ("veca", "VECA", "lr_veca"),
    "VECA fixed-4": ("veca", "VECA", "lr_veca"),
    "VECA fixed-32": ("veca", "VECA", "lr_veca"),
    "VECA from teacher": ("veca", "VECA from teacher", "lr_veca_teacher"),
    "dense ViT": ("dense", "dense ViT", "lr_dense"),
    "LookWhere-S random init": ("lookwhere", "LookWhere-S random", "lr_lookwhere"),
    "LookWhere-S from teacher": ("lookwhere", "LookWhere-S from teacher", "lr_lookwhere_teacher"),
}


class DenseStudent(Dinov2PreTrainedModel):
    """The dense baseline at a student's width: a transformers `Dinov2Model` whose tokens are projected linearly to the
    teacher's width (`config.output_projection_size`), as VECA's `output_projection_size` does."""

    def __init__(self, config: Dinov2Config):
        super().__init__(config)
        self.vit = Dinov2Model(config)
        self.projection = torch.nn.Linear(config.hidden_size, config.output_projection_size)
        self.post_init()

    def forward(self, pixel_values: torch.Tensor, budget: None = None) -> BaseModelOutputWithPooling:
        """`budget`: none (validation calls every student with one)."""
        hidden = self.projection(self.vit(pixel_values).last_hidden_state)  # the final norm comes before
        return BaseModelOutputWithPooling(last_hidden_state=hidden, pooler_output=hidden[:, 0])


def new_student(name: str, teacher, args, seed: int, seeding=None):
    """(student, its step loss, draws(step)) of kind `name`, initialised from `seed`. VECA from the teacher: the
    teacher's width and depth, its weights where VECA has a place for them (`veca_from_teacher`), the bank seeded from
    the teacher's tokens of the pixel batches `seeding` yields (training.conversion's `seed_core_bank`, as the
    conversion starts); its loss is the conversion's stage 2 (`conversion_step_loss`)."""
    family = STUDENTS[name][0]
    torch.manual_seed(seed)
    width = teacher.config.hidden_size
    if name == "VECA from teacher":
        if seeding is None:
            raise ValueError("VECA from the teacher seeds its bank from training images: pass `seeding`.")
        model = veca_from_teacher(teacher, num_cores=NUM_CORES, image_size=args.image_size,
                                  training_budgets=list(ELASTIC_BUDGETS)).float()
        seed_core_bank(model, teacher, seeding, seed=seed)
        budgets, weights = model.config.training_budgets, model.config.training_budget_weights
        return model, conversion_step_loss(teacher), lambda step: {"num_cores": draw(budgets, weights, seed, step)}
    if family == "veca":
        budgets = {"VECA elastic": list(ELASTIC_BUDGETS), "VECA fixed-4": [4], "VECA fixed-32": [NUM_CORES]}[name]
        config = VecaConfig.from_preset(
            "small", patch_size=14, num_cores=NUM_CORES, image_size=args.image_size, hidden_size=args.width,
            num_hidden_layers=args.depth, num_attention_heads=args.heads,
            intermediate_size=swiglu_intermediate_size(args.width),
            output_projection_size=width if width != args.width else None, training_budgets=budgets,
        )
        budgets, weights = config.training_budgets, config.training_budget_weights
        return VecaModel(config), veca_step_loss, lambda step: {"num_cores": draw(budgets, weights, seed, step)}
    if family == "lookwhere":
        model = lookwhere_from_teacher(teacher, selector_image_size=args.selector_size)
        if name == "LookWhere-S random init":
            torch.manual_seed(seed)
            model = LookWhereModel(model.config)
        return model, lookwhere_step_loss, lambda step: {"k": draw_int(args.k_min, args.k_max, seed, step)}
    config = Dinov2Config(hidden_size=args.width, num_hidden_layers=args.depth, num_attention_heads=args.heads,
                          patch_size=14, image_size=args.image_size, mlp_ratio=4)
    config.output_projection_size = width
    return DenseStudent(config), dense_step_loss, lambda step: {}


def veca_step_loss(student, pixel_values, targets, num_cores):
    output = student(pixel_values, num_cores=num_cores)
    return veca_loss(output.pooler_output, output.last_hidden_state[:, num_cores:], targets["cls"], targets["patches"])


def conversion_step_loss(teacher):
    """The conversion's stage 2 as a step loss (training.conversion's `end_to_end_loss`): the student's tokens after
    every block and its final features against the teacher's, from the teacher's forward of the batch (its cached
    final targets do not hold the blocks); no terms logged beside it."""
    def step_loss(student, pixel_values, targets, num_cores):
        return end_to_end_loss(student, teacher_targets(teacher, pixel_values), pixel_values, num_cores), {}
    return step_loss


def dense_step_loss(student, pixel_values, targets):
    hidden = student(pixel_values).last_hidden_state
    return veca_loss(hidden[:, 0], hidden[:, 1:], targets["cls"], targets["patches"])


def lookwhere_step_loss(student, pixel_values, targets, k):
    output = student(pixel_values, k=k)
    num_prefix = output.last_hidden_state.shape[1] - targets["patches"].shape[1]
    return lookwhere_loss(output.pooler_output, output.last_hidden_state[:, num_prefix:], output.selector_map,
                          targets["cls"], targets["patches"], targets["map"])


def budgets_of(name: str) -> list[tuple[str, dict]]:
    """(label, forward kwargs) of every budget evaluated for a student kind."""
    family = STUDENTS[name][0] if name in STUDENTS else name
    if family == "veca":
        return [(f"cores={c}", {"num_cores": c}) for c in ELASTIC_BUDGETS]
    if family == "lookwhere":
        return [(f"k_ratio={r:g}", {"k_ratio": r}) for r in LOOKWHERE_K_RATIOS]
    return [("all", {})]


def validation_budgets(name: str, image_size: int) -> tuple[str, list]:
    """(budget keyword, values) that validation runs a student of kind `name` at: every budget it is measured at."""
    family = STUDENTS[name][0]
    if family == "veca":
        return "num_cores", list(ELASTIC_BUDGETS)
    if family == "lookwhere":
        return "k", [kept_for_ratio(r, (image_size // 14) ** 2) for r in LOOKWHERE_K_RATIOS]
    return "budget", [None]


def gflops(model, resolution: int, budget: dict) -> float:
    """Analytic GFLOPs of one forward on a `resolution` px square image at `budget`."""
    if isinstance(model, VecaModel):
        return veca_flops(model.config, resolution, **budget) / 1e9
    if isinstance(model, LookWhereModel):
        return lookwhere_flops(model.config, resolution, **budget) / 1e9
    if isinstance(model, DenseStudent):
        tokens = (resolution // 14) ** 2 + 1
        projection = 2 * tokens * model.config.hidden_size * model.config.output_projection_size
        return (teacher_flops(model.vit, resolution, resolution) + projection) / 1e9
    return teacher_flops(model, resolution, resolution) / 1e9
