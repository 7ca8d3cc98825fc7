"""GPTQ-style rounding (Frantar et al., 2022): a matrix's codes chosen column by column so that the
error of its outputs over calibration inputs is small, not each weight's own error. With H = E[x x^T]
over the inputs the matrix multiplies, each column's rounding error is spread over the columns not yet
rounded along the Cholesky factor of H^-1. The scales are the plain quantizer's (the same blob format
and numerics: only which code each weight gets changes), so a model stays bit-exact on every board."""
from __future__ import annotations

import numpy as np

DAMP = 0.1        # H + DAMP * mean(diag H) * I: keeps the inverse stable where inputs are (nearly) collinear


def inverse_factor(h: np.ndarray) -> np.ndarray:
    """The upper Cholesky factor U of (damped H)^-1 (U^T U = H^-1), float64; a column no input ever
    reaches (diag 0) gets 1 on its diagonal, so its weights round plainly."""
    h = np.array(h, np.float64)
    d = np.diag(h).copy()
    dead = d <= 0
    h[dead, :], h[:, dead] = 0.0, 0.0
    h[np.diag_indices_from(h)] = np.where(dead, 1.0, d + DAMP * (d[~dead].mean() if (~dead).any() else 1.0))
    inv = np.linalg.inv(h)
    return np.linalg.cholesky(inv).T


def round_codes(w: np.ndarray, h: np.ndarray, eff: np.ndarray, group_size: int, qmax: int) -> np.ndarray:
    """int8 codes [rows, cols] of w (float32 [rows, cols]) under the fixed per-group scales eff
    (float64 [rows, n_groups]; 0: an all-zero group, codes 0), rounded in column order with each
    column's error weighted by the inputs' second moments h [cols, cols] carried onto later columns."""
    rows, cols = w.shape
    u = inverse_factor(h)
    work = w.astype(np.float64).copy()
    codes = np.zeros((rows, cols), np.int8)
    for j in range(cols):
        s = eff[:, j // group_size]
        safe = np.where(s > 0, s, 1.0)
        q = np.where(s > 0, np.clip(np.rint(work[:, j] / safe), -qmax, qmax), 0.0)
        codes[:, j] = q
        err = (work[:, j] - q * s) / u[j, j]
        work[:, j + 1:] -= np.outer(err, u[j, j + 1:])
    return codes
