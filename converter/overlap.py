"""Predicted overlap of a board's cores in the matrix products (a prediction, labelled as one).

A HAL that splits each product's rows across its cores (``[compute] split_cores`` in the board
profile: firmware/hal/rp2040/cores_rp2040.c on the RP2040) runs the rows' arithmetic on every core
at once, while the rows' bytes still come over one memory path. Per phase, of the time one core
would take (costmodel.compute_parts' rows part ``rows_us``, the products' reads from a tier behind
a shared line-fill bus ``bus_us`` — the RP2040's XIP flash — and from other tiers ``ram_us``), the
cores take::

    max(bus_us, (rows_us + ram_us + bus_us * (1 + bus_wait)) / split_cores)

The bus carries every line once (its floor), each core computes its share, waits for its own line
transfers and, ``bus_wait`` of them [EMU fit, boards/rp2040-emu.toml], for the other core's: the XIP
block serves one access at a time, so a core's hit waits while the other core's miss holds it
(host/emu/xip.mjs). Everything else in the phase (the activations' quantization, attention, norms,
the embedding row) stays on the calling core."""
from __future__ import annotations

from .costmodel import ModelSpec, head_rows


def split_cores(prof: dict) -> int:
    """How many cores share each product's rows on this board (1: the products run on one core)."""
    return max(1, int(prof.get("compute", {}).get("split_cores", 1)))


def saving(prof: dict, rows_us: float, bus_us: float, ram_us: float) -> float:
    """The µs the split saves in one phase against one core doing all of it (0 on a one-core board)."""
    k = split_cores(prof)
    if k == 1:
        return 0.0
    w = float(prof.get("compute", {}).get("bus_wait", 0.0))
    serial = rows_us + bus_us + ram_us
    shared = max(bus_us, (rows_us + ram_us + bus_us * (1.0 + w)) / k)
    return max(0.0, serial - shared)


def product_tensors(spec: ModelSpec) -> dict[str, str]:
    """The tensors the engine reads in matrix products (engine.c product() and the head's tiles,
    through hal_matmul), each with the phase it does so in: the rows a board may split across its
    cores (a tied head's table is a product in the output phase only, its embedding row is not)."""
    cfg = spec.config
    out = {"head.centroids": "output", "ple.proj": "embed"}
    for li in range(cfg.n_layers):
        p = f"layers.{li}."
        out.update({p + w: "attention" for w in ("attn.wq", "attn.wk", "attn.wv", "attn.wo")})
        out.update({p + w: "ple" for w in ("ple.gate", "ple.proj")})
        for f in cfg.ffn_prefixes(li):
            out.update({f + w: "ffn" for w in ("w1", "w2", "w3")})
    out[head_rows(spec).name] = "output"
    names = {t.name for t in spec.tensors}
    return {k: v for k, v in out.items() if k in names}
