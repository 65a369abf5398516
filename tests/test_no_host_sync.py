"""Forward never forces a host synchronisation: no operator that copies a value to the host (`.item()`, `bool()` of
a tensor, `nonzero`) runs in either model's forward, so a GPU never waits for the CPU in the middle of a call. The
checks that need pixel values (NaN / inf) live in the image processor. Nor does a training step, except on the steps
that log (nanoGPT's rule). Recorded on CPU with a dispatch mode: the same operators run on every device."""

import collections

import pytest
import torch
from conftest import lookwhere_args, read_metrics, tiny_lookwhere_config, tiny_veca_config, veca_args
from torch.utils._python_dispatch import TorchDispatchMode

from corevision_hf import LookWhereModel, VecaModel
from training import distill_lookwhere, distill_veca, loop, schedule

# The aten operators behind reading a tensor's value on the host.
HOST_READS = {"_local_scalar_dense", "is_nonzero", "nonzero", "item", "equal", "allclose"}
# A padded batch of two images: 32 x 48 px and 24 x 16 px.
PIXEL_MASK = torch.zeros(2, 32, 48, dtype=torch.int64)
PIXEL_MASK[0] = 1
PIXEL_MASK[1, :24, :16] = 1


class RecordOperators(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.add(func._schema.name.split("::")[-1])
        return func(*args, **(kwargs or {}))


def host_reads(fn) -> set[str]:
    with torch.no_grad(), RecordOperators() as recorder:
        fn()
    return recorder.names & HOST_READS


def test_the_recorder_sees_a_host_read():
    pixel_values = torch.randn(1, 3, 8, 8)
    assert host_reads(lambda: bool(torch.isfinite(pixel_values).all())) == {"_local_scalar_dense"}


@pytest.mark.parametrize(
    "build, call",
    [
        (lambda: VecaModel(tiny_veca_config()), {"num_cores": 3}),
        (lambda: VecaModel(tiny_veca_config()), {"output_hidden_states": True}),
        (lambda: VecaModel(tiny_veca_config()), {"max_gflops": 0.005}),
        (lambda: LookWhereModel(tiny_lookwhere_config()), {"k": 20}),
        (lambda: LookWhereModel(tiny_lookwhere_config()), {"k_ratio": 0.3, "fill_dense": False}),
        (lambda: LookWhereModel(tiny_lookwhere_config()), {"k": 20, "output_hidden_states": True}),
        (lambda: LookWhereModel(tiny_lookwhere_config()), {"max_gflops": 0.002}),
        (lambda: VecaModel(tiny_veca_config()), {"num_cores": 3, "pixel_mask": PIXEL_MASK}),
        (lambda: LookWhereModel(tiny_lookwhere_config()), {"k_ratio": 0.3, "pixel_mask": PIXEL_MASK}),
        (lambda: LookWhereModel(tiny_lookwhere_config()), {"k": 20, "fill_dense": False, "pixel_mask": PIXEL_MASK}),
    ],
)
def test_forward_reads_no_value_on_the_host(build, call):
    model = build().eval()
    pixel_values = torch.randn(2, 3, 32, 48, generator=torch.Generator().manual_seed(0))
    assert host_reads(lambda: model(pixel_values, **call)) == set()


class RecordHostReadsByStep(TorchDispatchMode):
    """The tensors whose values are read on the host, by the optimisation step (1-based) running when they are:
    `step` is set as each micro-batch reseeds (`training.loop.reseed_for_step`), so a step's reads run from its first
    micro-batch to the next step's. `tolist` reads without an operator and is recorded by a wrapper; nothing is
    recorded while `paused`."""

    def __init__(self):
        super().__init__()
        self.step, self.paused, self.reads = 0, False, collections.defaultdict(list)

    def record(self, tensor: torch.Tensor) -> None:
        if not self.paused:
            self.reads[self.step].append(tensor)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func._schema.name.split("::")[-1] in HOST_READS:
            self.record(args[0])
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("script, make_args", [(distill_veca, veca_args), (distill_lookwhere, lookwhere_args)])
def test_a_training_step_reads_values_on_the_host_only_when_it_logs(teacher_dir, image_dir, tmp_path, monkeypatch,
                                                                     script, make_args):
    recorder, optimizers = RecordHostReadsByStep(), []
    reseed, build_optimizer, tolist = loop.reseed_for_step, loop.build_optimizer, torch.Tensor.tolist

    def marking(seed, step, process_index, micro_batch=0):
        recorder.step = step + 1
        reseed(seed, step, process_index, micro_batch)

    def unrecorded(draw):  # the step's draws come from a CPU generator on every device: host work
        def drawn(*args):
            recorder.paused = True
            try:
                return draw(*args)
            finally:
                recorder.paused = False
        return drawn

    monkeypatch.setattr(loop, "reseed_for_step", marking)
    monkeypatch.setattr(loop, "build_optimizer",
                        lambda *args: optimizers.append(build_optimizer(*args)) or optimizers[-1])
    monkeypatch.setattr(schedule, "draw", unrecorded(schedule.draw))
    monkeypatch.setattr(schedule, "draw_int", unrecorded(schedule.draw_int))
    monkeypatch.setattr(torch.Tensor, "tolist", lambda self: recorder.record(self) or tolist(self))
    # 4 steps of 2 micro-batches, a line every 2 steps; images are decoded in a worker process: host work too
    with recorder:
        script.main(make_args(teacher_dir, image_dir, tmp_path, "--max-steps", "4", "--log-every", "2",
                              "--gradient-accumulation-steps", "2", "--checkpoint-every", "10", "--num-workers", "1"))
    # AdamW's step counters live on the host on every device (torch's choice: reading them waits for nothing)
    counters = [state["step"] for state in optimizers[0].state.values() if state["step"].device.type == "cpu"]
    reads = {step: [t for t in tensors if not any(t is counter for counter in counters)]
             for step, tensors in recorder.reads.items()}
    assert [m["step"] for m in read_metrics(tmp_path)] == [2, 4]
    assert reads.get(1, []) == [] and reads.get(3, []) == []
    assert reads[2] and reads[4]  # the logging steps read: the recorder sees what a step reads
