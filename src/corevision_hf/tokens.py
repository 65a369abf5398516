"""The patch tokens of a model output, checked against the grid they should fill: the one way the package's pictures,
evaluation and extraction read them, so that a grid that does not match (another patch size, another resolution) is
an error instead of a garbled picture or a wrong score."""

import torch

# Tokens before the patches in a dense teacher's output: CLS (DINOv2), or CLS and 4 registers (DINOv2 with registers,
# DINOv3).
TEACHER_PREFIXES = (1, 5)


def patch_tokens(output, grid: tuple[int, int], num_prefix: int | None = None) -> torch.Tensor:
    """(B, Hp * Wp, D), row-major: `output.patch_tokens` of VECA and of LookWhere with the dense fill, else the tokens
    after CLS (and registers) of a DINOv2 / DINOv3 `last_hidden_state`: `num_prefix` of them when given (1 + the
    model's registers), else CLS alone or with 4 registers. A ValueError when `grid` (Hp, Wp) does not match the
    output's patch tokens, or for a LookWhere output without the fill."""
    rows, columns = grid
    tokens = getattr(output, "patch_tokens", None)
    if tokens is None and getattr(output, "selected_indices", None) is not None:
        raise ValueError("This LookWhere output holds the kept tokens only (fill_dense=False): run it with "
                         "fill_dense=True for tokens on the whole grid.")
    if tokens is not None:
        if tokens.shape[1] != rows * columns:
            raise ValueError(f"The output holds {tokens.shape[1]} patch tokens, not the {rows} x {columns} = "
                             f"{rows * columns} of the grid given: the grid is the input's size over this model's "
                             "patch size.")
        return tokens
    hidden = output.last_hidden_state
    if hidden.shape[1] - rows * columns not in (TEACHER_PREFIXES if num_prefix is None else (num_prefix,)):
        prefix = "CLS (and 4 registers)" if num_prefix is None else f"{num_prefix} prefix tokens"
        raise ValueError(f"The output holds {hidden.shape[1]} tokens, which is not {prefix} and {rows} x {columns} "
                         "patches: the grid given does not match its input's size and patch size.")
    return hidden[:, hidden.shape[1] - rows * columns :]
