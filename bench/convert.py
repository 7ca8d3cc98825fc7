"""Convert time of a ~15M-parameter random llama2.c v1 checkpoint (dim 288, 6 layers, 6 heads,
vocab 32000, context 256): load + quantize + the head index's calibration + blob, host clock (the
calibration leaves the index out here: random rows are all alike)."""
from __future__ import annotations

import time
from pathlib import Path

from converter import headcalib
from converter.blob import write_blob
from converter.llama2c import write_llama2c
from converter.load import load_model
from converter.quantize import quantize

from .model import FORMATS, GROUP, random_15m_ir


def convert_15m(work: Path) -> dict:
    ir = random_15m_ir()
    work.mkdir(parents=True, exist_ok=True)
    path = work / "stories15M_random.bin"
    write_llama2c(ir, path, version=1)
    out = {"params": ir.config.n_params()}
    for fmt in FORMATS:
        t0 = time.perf_counter()
        ir = load_model(path)
        t1 = time.perf_counter()
        qm = quantize(ir, fmt, GROUP)
        t2 = time.perf_counter()
        qm.head_index, rep = headcalib.calibrate(qm)
        t3 = time.perf_counter()
        info = write_blob(qm, work / f"m15_{fmt}.flmb")
        t4 = time.perf_counter()
        out[fmt] = dict(load_s=t1 - t0, quantize_s=t2 - t1, head_index_s=t3 - t2, head_index_kept=int(rep["kept"]),
                        blob_s=t4 - t3, total_s=t4 - t0, blob_bytes=info.size)
    return out


def section(work: Path) -> dict:
    return {"convert_15M_llama2c_v1": convert_15m(work)}
