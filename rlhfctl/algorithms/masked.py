"""Masked statistics over the valid tokens of a padded (batch, response_len) tensor.

Every function here takes a ``mask`` of the same shape as ``x`` holding 1 for a valid token
and 0 for padding (bool, int or float masks are all accepted). Padding values never enter a
statistic. These are the building blocks of the advantage estimators and losses; they match
``verl.utils.torch_functional`` (``masked_mean``, ``masked_var``, ``masked_whiten``) up to the
``+1e-8`` verl adds to the token count, which is replaced here by a ``count >= 1`` guard.
"""

from __future__ import annotations

import torch

__all__ = ["masked_sum", "masked_mean", "masked_var", "masked_whiten", "explained_variance"]

#: Added to the variance before ``rsqrt`` in :func:`masked_whiten` (same value as verl).
WHITEN_EPS = 1e-8


def _as_float_mask(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    if mask.shape != like.shape:
        raise ValueError(f"mask shape {tuple(mask.shape)} does not match tensor shape {tuple(like.shape)}")
    return mask.to(dtype=like.dtype if like.is_floating_point() else torch.float32)


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of the valid entries: ``sum(x * m)`` over all entries, or along ``dim``."""
    m = _as_float_mask(mask, x)
    prod = x * m
    return prod.sum() if dim is None else prod.sum(dim=dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of the valid entries.

    .. math:: \\operatorname{mean}_m(x) = \\frac{\\sum_i m_i x_i}{\\max(1, \\sum_i m_i)}

    Over all entries when ``dim`` is None (a 0-dim tensor), otherwise along ``dim``. An empty
    mask (no valid entry) gives 0 rather than NaN.
    """
    m = _as_float_mask(mask, x)
    if dim is None:
        return (x * m).sum() / m.sum().clamp_min(1.0)
    return (x * m).sum(dim=dim) / m.sum(dim=dim).clamp_min(1.0)


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of the valid entries of ``x`` (over all dimensions), a 0-dim tensor.

    .. math:: \\operatorname{var}_m(x) = \\operatorname{mean}_m\\big((x - \\operatorname{mean}_m(x))^2\\big)
              \\cdot \\frac{n}{n - 1}\\ \\text{(if unbiased)},\\quad n = \\sum_i m_i

    With ``unbiased=True`` (Bessel's correction, as verl) at least two valid entries are
    required; fewer raises ``ValueError``. With ``unbiased=False`` an empty mask gives 0.
    """
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean) ** 2, mask)
    if unbiased:
        n = float(_as_float_mask(mask, x).sum().item())
        if n < 2:
            raise ValueError(
                f"masked_var(unbiased=True) needs at least 2 valid entries, got {n:g}: "
                "Bessel's correction n/(n-1) is undefined"
            )
        var = var * (n / (n - 1.0))
    return var


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """Normalise ``x`` to zero mean and unit variance using statistics of the valid entries.

    .. math:: \\operatorname{whiten}(x) = (x - \\mu)\\,/\\sqrt{\\sigma^2 + 10^{-8}}

    where :math:`\\mu` and :math:`\\sigma^2` are :func:`masked_mean` and the unbiased
    :func:`masked_var`. With ``shift_mean=False`` the mean is added back
    (``(x - mu)/sigma + mu``), i.e. only the scale changes. The result is computed for every
    position, padding included; callers that need zeros there multiply by the mask.
    Source: ``verl.utils.torch_functional.masked_whiten`` (itself from TRL).
    """
    mean = masked_mean(x, mask)
    var = masked_var(x, mask, unbiased=True)
    whitened = (x - mean) * torch.rsqrt(var + WHITEN_EPS)
    if not shift_mean:
        whitened = whitened + mean
    return whitened


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Fraction of the variance of the returns that the value predictions explain.

    .. math:: \\mathrm{EV} = 1 - \\frac{\\operatorname{var}_m(R - V)}{\\operatorname{var}_m(R)}

    over valid tokens (biased variances; the correction cancels in the ratio). 1 is a perfect
    critic, 0 is no better than predicting the mean, negative is worse. Returns a 0-dim float
    tensor, NaN when the returns have zero variance (as CleanRL's ``ppo.py``).
    """
    values = values.detach().float()
    returns = returns.detach().float()
    var_returns = masked_var(returns, mask, unbiased=False)
    var_residual = masked_var(returns - values, mask, unbiased=False)
    if float(var_returns.item()) == 0.0:
        return torch.tensor(float("nan"), device=returns.device)
    return 1.0 - var_residual / var_returns
