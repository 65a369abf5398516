"""Forward never forces a host synchronisation: no operator that copies a value to the host (`.item()`, `bool()` of
a tensor, `nonzero`) runs in either model's forward, so a GPU never waits for the CPU in the middle of a call. The
checks that need pixel values (NaN / inf) live in the image processor. Recorded on CPU with a dispatch mode: the
same operators run on every device."""

import pytest
import torch
from conftest import tiny_lookwhere_config, tiny_veca_config
from torch.utils._python_dispatch import TorchDispatchMode

from corevision_hf import LookWhereModel, VecaModel

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
