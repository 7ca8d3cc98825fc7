"""RAM the engine needs for a model: KV cache, scratch and the prompt buffer — the same sums
as flm_state_bytes() in firmware/engine/engine.c plus the app's prompt buffer (app_layout.c)."""
from __future__ import annotations

from .formats import PINNED_TO_FLASH, REGIONS, row_stride, up64
from .headprune import section_length
from .ir import ModelConfig


def _up8(n: int) -> int:
    return (n + 7) & ~7


def state_bytes(cfg: ModelConfig, min_group: int, kv: str = "f32", batch: int = 1) -> int:
    return sum(region_bytes(cfg, min_group, kv, batch).values())


def arena_bytes(cfg: ModelConfig, min_group: int, batch: int = 1) -> int:
    """The engine's RAM for any placement of the model (an f32 KV cache is the larger format)."""
    return state_bytes(cfg, min_group, batch=batch) + cfg.max_seq_len * 4


# ---- per-region sizes and staging (firmware/engine/engine.c layout(), app_layout.c app_place()) -------------

def kv_row_bytes(cfg: ModelConfig, kv: str, part: str) -> int:
    """Bytes of one (layer, position, kv head) row of the K (part "k") or V ("v") cache (engine.c
    k_row_bytes, v_row_bytes): f32 values; or an int8 row (int8 K and V, k12's V): f32 scale, then
    head_dim codes padded to 4; or a k12 K row: f32 scale, then head_dim int16 codes padded to 4 bytes."""
    if kv == "f32":
        return cfg.head_dim * 4
    if kv == "k12" and part == "k":
        return 4 + ((2 * cfg.head_dim + 3) & ~3)
    return 4 + ((cfg.head_dim + 3) & ~3)


def kv_position_bytes(cfg: ModelConfig, kv: str) -> int:
    """Bytes the KV cache stores per position: a K and a V row per layer and kv head."""
    return cfg.n_layers * cfg.n_kv_heads * (kv_row_bytes(cfg, kv, "k") + kv_row_bytes(cfg, kv, "v"))


def region_bytes(cfg: ModelConfig, min_group: int, kv: str = "f32", batch: int = 1) -> dict[str, int]:
    """Bytes of each state region, as flm_state_region_bytes() with KV format ``kv`` (f32, int8, k12) and
    a batch of ``batch`` tokens per forward pass (activations and logits per token; with more than one,
    two copies of a weight row); they sum to state_bytes()."""
    wide = max(cfg.dim, cfg.hidden_dim, cfg.ple_dim)            # the longest matmul input
    rows = cfg.n_layers * cfg.max_seq_len * cfg.n_kv_heads
    ple = cfg.n_layers * cfg.ple_dim * 4                         # per-layer inputs of a token
    t = batch
    # ... and the activation codes, 2 bytes each on every target (kernels.h flm_act), and their scales
    # attention's scratch, one a core (engine.c att_scratch_bytes): the scores, a query head's codes
    att = 2 * (_up8(cfg.max_seq_len * 4) + _up8(cfg.head_dim * 2))
    scratch = [t * cfg.dim * 4] * 4 + [att, t * cfg.hidden_dim * 4, t * cfg.hidden_dim * 4,
                                       t * (cfg.head_dim // 2) * 4, t * (cfg.head_dim // 2) * 4, t * ple,
                                       max(t, cfg.n_layers) * cfg.ple_dim * 4,   # a table row, or the gates
                                       t * 2 * _up8(wide), t * (wide // min_group + 1) * 4]
    if cfg.n_experts:   # the experts' sums, router logits, weights, every layer's choices, a pass's tokens per expert
        E, k = cfg.n_experts, cfg.moe_top_k
        scratch += [t * cfg.dim * 4, E * 4, t * k * 4, cfg.n_layers * t * k, 2 * t]
    if t > 1:   # the row buffer: two rows of the widest (engine.c, hal.h hal_matmul)
        scratch += [row_copy_bytes(wide, min_group)] * 2
    return {"kv": _up8(rows * kv_row_bytes(cfg, kv, "k")) + _up8(rows * kv_row_bytes(cfg, kv, "v")),
            "logits": _up8(t * cfg.n_out * 4) + 2 * _up8(cfg.n_out * 4),
            "scratch": sum(_up8(p) for p in scratch)}


def row_copy_bytes(wide: int, min_group: int) -> int:
    """engine.c row_copy_bytes: room for a copy of any weight row of at most ``wide`` columns in groups of
    at least ``min_group`` (q8 with f32 scales, each group's codes padded to 4)."""
    return wide + 7 * (wide // min_group + 1) + 3


def prompt_bytes(cfg: ModelConfig) -> int:
    return cfg.max_seq_len * 4


def tier_needs(cfg: ModelConfig, min_group: int, staged: dict[str, list[int]],
               region_tiers: dict[str, str], kv: str = "f32", batch: int = 1) -> dict[str, int]:
    """Bytes app_layout.c's app_place() takes from each RAM tier: the tensors staged there (``staged[tier]``,
    each rounded up to 64 bytes), the state regions placed there (``region_tiers[region]``, a tier
    name; multiples of 8) and, with the scratch region, the prompt buffer (last, unrounded)."""
    need = {"psram": 0, "sram": 0}
    for tier, lengths in staged.items():
        if tier in need:
            need[tier] += sum(up64(n) for n in lengths)
    rb = region_bytes(cfg, min_group, kv, batch)
    for r in REGIONS:
        need[region_tiers[r]] += rb[r]
    need[region_tiers["scratch"]] += prompt_bytes(cfg)
    return need


def staging_bound(cfg: ModelConfig, min_group: int) -> int:
    """An upper bound on the bytes of every tensor the engine reads, staged, for any recipe of this
    config whose smallest group is ``min_group`` (q8 at that group is the largest encoding)."""
    total = 0
    for name, shape in cfg.tensor_shapes().items():
        if name in PINNED_TO_FLASH:
            continue
        if len(shape) == 1:
            total += up64(shape[0] * 4)
        else:
            total += up64(shape[0] * row_stride("q8", shape[1], min_group))
    # RoPE, and a head index of at most one tile per head row: its centre rows and head.tiles
    head_rows = cfg.vocab_size if cfg.tied else cfg.n_out
    index = (up64(cfg.n_out * row_stride("q8", cfg.dim, min_group))
             + up64(section_length(cfg.n_out, cfg.n_out, head_rows)))
    return total + 2 * up64(cfg.max_seq_len * cfg.head_dim // 2 * 4) + index


def draft_state_bytes(draft_header) -> int:
    """RAM the draft model's state takes (its three regions, in the scratch region's tier after the
    prompt buffer: app_speculate.c app_draft_place), from its blob's header; 0 without a draft."""
    if draft_header is None:
        return 0
    g = min(e.group_size for e in draft_header.entries if e.fmt in ("q8", "q4"))
    st = draft_header.state_tiers
    return state_bytes(draft_header.config, g, st.kv, st.batch)


def layout_needs(header, default: str = "sram") -> dict[str, int]:
    """Bytes app_layout.c's app_place() takes from each RAM tier for the blob ``header``'s own
    placement (its batch, and its draft model's state, included), the state regions without a tier
    of their own going to ``default``."""
    cfg, st = header.config, header.state_tiers
    min_group = min(e.group_size for e in header.entries if e.fmt in ("q8", "q4"))
    regions = st.regions(default)
    staged: dict[str, list[int]] = {"psram": [], "sram": []}
    used = (set(cfg.tensor_shapes()) | {"rope.cos", "rope.sin", "head.centroids", "head.tiles"}) - {"ple.table"}   # the table is never staged
    for e in header.entries:
        if e.tier in staged and e.name in used:
            staged[e.tier].append(e.length)
    need = tier_needs(cfg, min_group, staged, regions, st.kv, st.batch)
    need[regions["scratch"]] += draft_state_bytes(header.draft)
    return need


# the bare-metal builds (firmware/baremetal.py): their arenas are arrays the link places in the
# board's SRAM and PSRAM, sized at build time
STATIC_ARENA_BUILDS = ("arm-gcc", "rv32-gcc", "xtensa-clang")


def build_arenas(header, prof: dict) -> tuple[int, int]:
    """(FLM_ARENA_BYTES, FLM_PSRAM_ARENA_BYTES) for a build of ``prof`` running the blob ``header``.

    The native board reserves room for any placement in both its SRAM arena and its stand-in PSRAM,
    so LAYOUT can switch freely; a bare-metal build (``STATIC_ARENA_BUILDS``: the emulated boards)
    reserves its whole SRAM and PSRAM budgets; other boards reserve what the blob's own layout needs (the
    PlatformIO boards choose the arena's tier with firmware.platformio.board_arena; a LAYOUT that
    needs more than there is is refused by the device with the numbers). A draft model's state is
    reserved too."""
    cfg = header.config
    if prof.get("hal") == "native":
        min_group = min(e.group_size for e in header.entries if e.fmt in ("q8", "q4"))
        room = (state_bytes(cfg, min_group, batch=header.state_tiers.batch) + prompt_bytes(cfg)
                + staging_bound(cfg, min_group) + draft_state_bytes(header.draft))
        return room, room
    need = layout_needs(header)
    if prof.get("build") in STATIC_ARENA_BUILDS:   # statically linked arenas: reserve each RAM tier's
        tiers = prof.get("tiers", {})             # whole budget, so LAYOUT can switch within it
        return tuple(max(need[t], int(tiers.get(t, {}).get("budget", 0))) for t in ("sram", "psram"))
    return need["sram"], need["psram"]
