"""Lets PyPI's CUDA-built torchvision import beside the CPU build of torch, this project's set-up on x86_64.

`make setup` copies this file into the virtual environment's site-packages with a `.pth` line that imports it, so it
runs in every Python of that environment (transformers imports torchvision whenever it is installed). Elsewhere,
with a torchvision built for the installed torch, it does nothing.

Why: PyPI's x86_64 torchvision wheels link libtorch_cuda.so, so beside the CPU torch their C extension cannot load;
torchvision then still registers fake kernels for two of its C ops (`torchvision::nms`, `torchvision::qnms`) without
checking, and `import torchvision` fails with "operator torchvision::nms does not exist". The transforms need none of
the C ops. Before torchvision is first imported, this finder tries to load the extension; when it cannot, it defines
the two op schemas (schemas only, no kernels), so the import succeeds and only torchvision.ops' C kernels stay
unavailable (calling them raises, as torchvision says when its extension is missing).
"""

import importlib.abc
import importlib.util
import os
import sys

_schemas = None  # the torch.library.Library holding the two schemas: it must stay alive


def _define_missing_ops(package_dir: str) -> None:
    global _schemas
    import torch

    try:
        torch.ops.load_library(os.path.join(package_dir, "_C.so"))
    except OSError:
        _schemas = torch.library.Library("torchvision", "DEF")
        for op in ("nms", "qnms"):
            _schemas.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")


class _BeforeTorchvision(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != "torchvision":
            return None
        sys.meta_path.remove(self)  # once: the rest of the import goes the usual way
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations:
            _define_missing_ops(spec.submodule_search_locations[0])
        return spec


sys.meta_path.insert(0, _BeforeTorchvision())
