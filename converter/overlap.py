"""Predicted overlap of a board's cores in the matrix products (a prediction, labelled as one).

A HAL that splits each product's rows across its cores (``[compute] split_cores`` in the board
profile: firmware/hal/rp2040/cores_rp2040.c on the RP2040) runs the rows' arithmetic on every core
at once, while the rows' bytes still come over one memory path. Per phase, of the time one core
would take (computecost.compute_parts' rows part ``rows_us``, the products' reads from a tier behind
a shared line-fill bus ``bus_us`` — the RP2040's XIP flash — and from other tiers ``ram_us``), the
cores take::

    max(bus_us, (rows_us + ram_us + bus_us * (1 + bus_wait)) / split_cores)

The bus carries every line once (its floor), each core computes its share, waits for its own line
transfers and, ``bus_wait`` of them [EMU fit, boards/rp2040-emu.toml], for the other core's: the XIP
block serves one access at a time, so a core's hit waits while the other core's miss holds it
(host/emu/xip.mjs). Everything else in the phase stays on the calling core, but for the work a HAL
splits too (hal.h hal_parallel: attention's heads, RoPE, the activations' codes, the norms' scaling,
the residuals, the FFN's SiLU x up; computecost.compute_parts' parallel part), of which each core takes
its share.

A board that streams a product's rows from flash into SRAM buffers while its cores compute
(``[flash].stream_chunk_bytes``: the RP2040's stream_rp2040.c, for rows of a stride up to it, any
number of tokens) does not take those bytes through the line-fill bus: they come at the rate of
the SSI's direct reads (``stream_cycles``) while the cores compute, so the streamed products take::

    max(stream, rows / split_cores) + cold * first chunk + products * stream_setup_cycles

— the bytes overlapped with the rows, then the first chunk the cores wait for before any row in each
product whose first chunk the product before did not read (``read_ahead``: the engine's
hal_matmul_then hints), and per product the set-up and hand-over ([flash].stream_setup_cycles, [EMU
fit]). Their rows include
the work the streamed products do on their output rows (``rows_after``: hal.h hal_matmul_each), which
fills the cores' waits for the stream rather than following the product."""
from __future__ import annotations

import math
from dataclasses import dataclass

from .boards import stream_stride
from .costmodel import ModelSpec, head_rows


def split_cores(prof: dict) -> int:
    """How many cores share each product's rows on this board (1: the products run on one core)."""
    return max(1, int(prof.get("compute", {}).get("split_cores", 1)))


def stream_cycles(prof: dict, n_bytes: float) -> float:
    """clk_sys cycles the SSI's direct reads take to move n_bytes in reads of stream_chunk_bytes at
    the HAL's settings (host/emu/ssidirect.mjs: quad, 32-bit frames, no instruction, 24 address + 8
    mode bits and 4 wait clocks: a 12-SCK header and 8 SCK a word, each SCK spi_clkdiv cycles; RX
    sample delay 1 and 2 bus cycles a read): 1 KB at SCKDV 2 in 4,123 cycles."""
    flash = prof["flash"]
    chunk, sckdv = float(flash["stream_chunk_bytes"]), float(flash["spi_clkdiv"])
    reads = math.ceil(n_bytes / chunk)
    return (reads * 12 + n_bytes / 4 * 8) * sckdv + reads * 3


@dataclass(frozen=True)
class Streamed:
    """A phase's products streamed from flash into SRAM: the memory µs the tier model charged them
    (as if read in place), their bytes and how many products."""
    mem_us: float = 0.0
    bytes: float = 0.0
    products: int = 0
    ahead: float = 0.0   # of them, those whose first chunk the product before read (read_ahead)

    def __add__(self, o: Streamed) -> Streamed:
        return Streamed(self.mem_us + o.mem_us, self.bytes + o.bytes, self.products + o.products,
                        self.ahead + o.ahead)


def saving(prof: dict, rows_us: float, bus_us: float, ram_us: float, streamed: Streamed = Streamed(),
           parallel_us: float = 0.0) -> float:
    """The µs the split (and the streaming) saves in one phase against one core doing all of it,
    every byte read in place (0 on a one-core board); with the element-wise work split across the
    cores (parallel_us: hal.h hal_parallel; [compute] parallel_cores, where the HAL defines it), its
    share on the other cores."""
    k = split_cores(prof)
    if k == 1:
        return 0.0
    w = float(prof.get("compute", {}).get("bus_wait", 0.0))
    serial = rows_us + bus_us + ram_us + streamed.mem_us
    shared = max(bus_us, (rows_us + ram_us + bus_us * (1.0 + w)) / k)
    if streamed.products:
        clock = float(prof.get("clock_mhz", 100))
        first = stream_cycles(prof, stream_stride(prof))
        setup = float(prof["flash"].get("stream_setup_cycles", 0))
        shared = (max(shared, stream_cycles(prof, streamed.bytes) / clock)
                  + ((streamed.products - streamed.ahead) * first + streamed.products * setup) / clock)
    kp = max(1, int(prof.get("compute", {}).get("parallel_cores", 1)))
    return max(0.0, serial - shared) + parallel_us * (1.0 - 1.0 / kp)


def read_ahead(spec: ModelSpec, name: str, products: int) -> float:
    """Of a step's streamed products of tensor ``name``, those whose first chunk the product before
    read (engine.c's hal_matmul_then hints): within a layer each product names the next (wq after the
    norm does not, nor does a layer's wq after PLE or a mixture of experts, nor an expert's w1); a
    head scan's tile names the next one only where it is certain (tile_ahead: that tile's bound at
    least the current one's), for tiles in stored order about every other one [EST]; the centroids
    and a whole head's one product none."""
    cfg = spec.config
    if name == head_rows(spec).name:
        return max(0, products - 1) / 2
    if name.endswith(("attn.wv", "attn.wk", "attn.wo", "w3", "w2")):
        return products
    if name.endswith("w1"):
        return 0 if cfg.n_experts else products
    if name.endswith("attn.wq") and not name.startswith("layers.0.") and not cfg.ple_dim and not cfg.n_experts:
        return products
    return 0


def rows_after(streamed: dict[str, Streamed]) -> frozenset:
    """The phases whose products take the work on their output rows (hal.h hal_matmul_each: the
    residuals, the FFN's SiLU and gate; computecost.compute_parts counts it with their rows): those a
    board streams (stream_rp2040.c runs it on each chunk's rows as they are done)."""
    return frozenset(ph for ph, s in streamed.items() if s.products)


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
