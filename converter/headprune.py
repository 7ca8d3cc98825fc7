"""Exact pruning of the greedy output layer by tiles of similar rows: the head index and its scan.

The index (docs/formats.md sections 1 and 3) groups the output layer's ``out_vocab`` rows into tiles
of at most T similar rows (balanced k-means), stores the rows tile after tile (so a tile is one
contiguous run of the matrix: a sequential read), and gives each tile a ball that holds all its
rows: a centre row ``c`` (q8, the head's group size and scale kind: a row of the very same
group-dot arithmetic) and a radius ``R`` that also covers every rounding of the bound and of the
logits. A greedy step (converter/reference.py, firmware/engine/engine.c ``flm_head_argmax``)
quantizes the head input as for any matvec (codes ``xq``, scales ``xs``), then

    X2 = fold_g(float(sum_k xq_k^2) * (xs_g * xs_g));   Xm = sqrt(X2) * MARGIN
    if not X2 >= FLOOR: the whole head (every row), first maximum
    U_t = C_t + R_t * Xm          C_t = the centre row's logit (the row function)
    visit the tile of the largest U first, then every other tile in stored order unless U_t < best
    (U_t finite)

where visiting a tile computes all its rows and keeps the largest logit (the lowest token among
equal ones). A skipped tile's every row has a logit strictly below ``best`` (formats.md section 3
proves it), so the token is the full scan's first maximum; the rows visited are ``head_rows``.

``converter/headcalib.py`` decides at convert time whether a model gets an index, and its tile size.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from .formats import pad4
from .ir import ModelError, QTensor
from .numerics import F, PackedMatrix, fold
from .quantize import quantize_matrix

MARGIN = F(1.0078125)             # 1 + 2^-7 (0x1.02p+0f in engine.c): Xm >= ||x|| (1 + 2^-8), formats.md 3
FLOOR = F(2.0 ** -64)             # below it no tile is skipped (underflow guard, formats.md 3)
R_MIN = 2.0 ** -60                # the smallest radius: covers the logits' underflow at X2 >= FLOOR
U = 2.0 ** -24                    # binary32 unit roundoff
SECTION = "head.tiles"            # bytes: header, tile records, the row <-> token maps
CENTROIDS = "head.centroids"      # q8 [n_tiles, dim]: the tiles' centre rows
HEADER = struct.Struct("<2I2f4I")   # n_tiles, map_bytes, expected_rows, expected_tiles, calib_steps, 3 x 0
TILE = np.dtype([("start", "<u4"), ("radius", "<f4")])


@dataclass
class HeadIndex:
    """Tiles over the first ``out_vocab`` head rows. Stored row i holds token ``perm[i]``; tile t
    is stored rows ``[starts[t], starts[t+1])`` (the last one ends at out_vocab)."""
    perm: np.ndarray              # int64 [n_out]: the token of each stored row, tiles back to back
    starts: np.ndarray            # int64 [n_tiles]: each tile's first stored row, ascending from 0
    centroids: QTensor            # q8 [n_tiles, dim]: each tile's centre row
    radius: np.ndarray            # float32 [n_tiles]: R_t, rounded up (formats.md 3)
    expected_rows: float = 0.0    # calibration: mean head rows a greedy step visits (a prediction)
    expected_tiles: float = 0.0   # ... and tiles
    calib_steps: int = 0          # greedy steps the calibration measured

    @property
    def n_tiles(self) -> int:
        return len(self.starts)

    @property
    def n_out(self) -> int:
        return len(self.perm)

    @property
    def map_bytes(self) -> int:
        """Width of a row <-> token map entry: u16 while every id fits, else u32."""
        return map_bytes(self.n_out)

    def ends(self) -> np.ndarray:
        return np.append(self.starts[1:], self.n_out)

    def inverse(self, n_rows: int) -> np.ndarray:
        """inv[token] = the stored row of token, for the ``n_rows`` rows of the head's tensor (a tied
        head's embedding rows past out_vocab stay where they are)."""
        inv = np.arange(n_rows, dtype=np.int64)
        inv[self.perm] = np.arange(self.n_out)
        return inv


def map_bytes(n_out: int) -> int:
    return 2 if n_out <= 1 << 16 else 4


# ---------------------------------------------------------------------------------------------
# building an index (converter/headcalib.py chooses the tile size and the tiles' order)

def balanced_tiles(w: np.ndarray, size: int, rounds: int = 10) -> list[np.ndarray]:
    """Rows of w (float64 [n, d]) in ceil(n / size) tiles of at most ``size`` similar rows: balanced
    k-means (Lloyd rounds whose assignment gives each row a near tile with room, _fill_nearest),
    started from the rows sorted along their first principal component. Above 4096 rows it first
    splits the rows the same way into balanced groups of 2048 and tiles each group on its own
    (n x k distances per round would not scale to 32000-row heads)."""
    if len(w) <= 4096:
        return _balanced_kmeans(w, size, rounds)
    return [grp[t] for grp in _balanced_kmeans(w, 2048, 4) for t in _balanced_kmeans(w[grp], size, rounds)]


def _balanced_kmeans(w: np.ndarray, size: int, rounds: int) -> list[np.ndarray]:
    n = len(w)
    k = -(-n // size)
    z = w - w.mean(axis=0)
    pc = np.ones(w.shape[1])
    for _ in range(30):                                        # the first principal component
        pc = z.T @ (z @ pc)
        pc /= max(np.linalg.norm(pc), 1e-300)
    assign = np.empty(n, np.int64)
    assign[np.argsort(z @ pc, kind="stable")] = np.arange(n) // size
    for _ in range(rounds):
        cen = _means(w, assign, k)
        d = (w * w).sum(1)[:, None] - 2 * w @ cen.T + (cen * cen).sum(1)[None, :]
        new = _fill_nearest(d, size)
        if np.array_equal(new, assign):
            break
        assign = new
    order = np.argsort(assign, kind="stable")
    cuts = np.searchsorted(assign[order], np.arange(1, k))
    return [t for t in np.split(order, cuts) if len(t)]


def _means(w: np.ndarray, assign: np.ndarray, k: int) -> np.ndarray:
    order = np.argsort(assign, kind="stable")
    cnt = np.bincount(assign, minlength=k)
    cen = np.zeros((k, w.shape[1]))
    has = cnt > 0
    cen[has] = np.add.reduceat(w[order], np.concatenate([[0], np.cumsum(cnt)[:-1]])[has]) / cnt[has, None]
    return cen


def _fill_nearest(d: np.ndarray, cap: int) -> np.ndarray:
    """Each row to a column (tile) of distances d, no tile over ``cap`` rows: in rounds, every row
    still without a tile asks for its next nearest one, and a tile takes the nearest askers it has
    room for; the few rows whose 32 nearest tiles all filled take the nearest tile with room."""
    n, k = d.shape
    m = min(k, 32)
    near = np.argpartition(d, m - 1, axis=1)[:, :m] if m < k else np.broadcast_to(np.arange(k), (n, k))
    pref = np.take_along_axis(near, np.argsort(np.take_along_axis(d, near, 1), axis=1, kind="stable"), 1)
    assign = np.full(n, -1, np.int64)
    room = np.full(k, cap, np.int64)
    for j in range(m):
        ask = np.nonzero(assign < 0)[0]
        if not ask.size:
            break
        t = pref[ask, j]
        order = np.lexsort((ask, d[ask, t], t))           # by tile, nearest first (then row)
        t_sorted = t[order]
        first = np.searchsorted(t_sorted, t_sorted)       # where each tile's askers begin
        take = order[np.arange(len(order)) - first < room[t_sorted]]
        assign[ask[take]] = t[take]
        room -= np.bincount(t[take], minlength=k)
    for r in np.nonzero(assign < 0)[0]:
        t = int(np.argmin(np.where(room > 0, d[r], np.inf)))
        assign[r] = t
        room[t] -= 1
    return assign


def ball_centres(w: np.ndarray, tiles: list[np.ndarray], steps: int = 200) -> np.ndarray:
    """Approximate minimum enclosing ball centres (Badoiu-Clarkson: step towards the farthest row,
    by 1/(i+1)), from the tiles' means: smaller radii than the means' (~10 %), inside each tile's
    hull (so within the rows' range)."""
    size = max(len(t) for t in tiles)
    p = w[np.stack([np.resize(t, size) for t in tiles])]      # [k, size, d]; short tiles repeat rows
    p2 = (p * p).sum(axis=2)
    c = p.mean(axis=1) if all(len(t) == size for t in tiles) else np.stack([w[t].mean(axis=0) for t in tiles])
    k = np.arange(len(tiles))
    for i in range(1, steps + 1):
        far = np.argmax(p2 - 2 * np.einsum("ktd,kd->kt", p, c), axis=1)
        c = c + (p[k, far] - c) / (i + 1)
    return c


def radii(w: np.ndarray, tiles: list[np.ndarray], cen: QTensor) -> np.ndarray:
    """R_t = max(rho_t + (gamma_{G+1} + 2u) N_t, R_MIN), rounded up to binary32 (formats.md 3):
    rho_t = max ||w_r - c_t|| over the tile's rows, N_t = ||c_t|| + max ||w_r||, G the groups of a
    row (at least 2 when row-scaled); computed in float64 (the products exact) and widened by 2^-30
    for its own roundings."""
    G = max(cen.n_groups, 2) if cen.rowscale else cen.n_groups   # row-scaled: three roundings (formats.md 3)
    gamma = (G + 1) * U / (1 - (G + 1) * U)
    c = cen.exact64()
    out = np.empty(len(tiles), F)
    with np.errstate(over="ignore", invalid="ignore"):   # rows past float64's squares: an infinite radius
        for t, rows in enumerate(tiles):
            rho = np.sqrt(((w[rows] - c[t]) ** 2).sum(axis=1)).max()
            n = np.sqrt((c[t] ** 2).sum()) + np.sqrt((w[rows] ** 2).sum(axis=1)).max()
            out[t] = _round_up(max((rho + (gamma + 2 * U) * n) * (1 + 2.0 ** -30), R_MIN))
    return out


def _round_up(v: float) -> np.float32:
    with np.errstate(over="ignore"):    # past binary32's range: +inf (a bound that skips nothing)
        f = F(v)
    return np.nextafter(f, F(np.inf)) if float(f) < v else f


def build(head: QTensor, n_out: int, size: int, tiles: list[np.ndarray] | None = None) -> HeadIndex:
    """An index with tiles of at most ``size`` rows (or the given ``tiles``: arrays of token ids,
    in stored order; each is stored in ascending token order)."""
    w = head.exact64(n_out)
    if tiles is None:
        tiles = balanced_tiles(w, size)
    tiles = [np.sort(np.asarray(t, np.int64)) for t in tiles]
    cen = quantize_matrix(ball_centres(w, tiles).astype(F), "q8", head.group_size, head.scale16, head.rowscale)
    starts = np.cumsum([0] + [len(t) for t in tiles[:-1]]).astype(np.int64)
    return HeadIndex(np.concatenate(tiles), starts, cen, radii(w, tiles, cen))


def reorder(index: HeadIndex, order) -> HeadIndex:
    """The same tiles stored in ``order`` (a permutation of the tile numbers)."""
    order = np.asarray(order, np.int64)
    segs = [index.perm[a:b] for a, b in zip(index.starts, index.ends())]
    c = index.centroids
    return HeadIndex(np.concatenate([segs[t] for t in order]),
                     np.cumsum([0] + [len(segs[t]) for t in order[:-1]]).astype(np.int64),
                     c.take_rows(order),
                     index.radius[order], index.expected_rows, index.expected_tiles, index.calib_steps)


def stored_head(head: QTensor, index: HeadIndex) -> QTensor:
    """The head's rows as the blob stores them: the first out_vocab in tile order (perm), any
    further rows (a tied head's embedding rows past out_vocab) after them unchanged."""
    return head.take_rows(np.concatenate([index.perm, np.arange(index.n_out, head.shape[0])]))


def token_order_head(stored: QTensor, index: HeadIndex) -> QTensor:
    """stored_head undone."""
    return stored.take_rows(index.inverse(stored.shape[0]))


# ---------------------------------------------------------------------------------------------
# the blob section

def section_bytes(index: HeadIndex, n_rows: int) -> bytes:
    """``head.tiles``: header, one (u32 start, f32 radius) record per tile, the row -> token map of
    the out_vocab stored rows (perm) and the token -> row map of all ``n_rows`` rows of the head's
    tensor (a tied head: every embedding row, which the embedding gather reads through it), each
    map padded to 4 bytes."""
    mb = index.map_bytes
    dt = "<u2" if mb == 2 else "<u4"
    rec = np.empty(index.n_tiles, TILE)
    rec["start"], rec["radius"] = index.starts, index.radius
    out = HEADER.pack(index.n_tiles, mb, index.expected_rows, index.expected_tiles, index.calib_steps, 0, 0, 0)
    out += rec.tobytes()
    for m in (index.perm, index.inverse(n_rows)):
        b = m.astype(dt).tobytes()
        out += b + bytes(-len(b) % 4)
    return out


def section_length(n_tiles: int, n_out: int, n_rows: int) -> int:
    mb = map_bytes(n_out)
    return HEADER.size + TILE.itemsize * n_tiles + pad4(mb * n_out) + pad4(mb * n_rows)


def read_section(buf: bytes, n_out: int, n_rows: int, centroids: QTensor) -> HeadIndex:
    """Decode and validate ``head.tiles`` (the checks blob.c makes): tiles that start at 0, ascend
    and are non-empty, radii in +0..+inf, maps that are inverse permutations of 0..out_vocab-1
    (rows past out_vocab mapping to themselves)."""
    if len(buf) < HEADER.size:
        raise ModelError(f"{SECTION} is too short")
    n_tiles, mb, e_rows, e_tiles, steps = HEADER.unpack_from(buf)[:5]
    if not 1 <= n_tiles <= n_out or mb != map_bytes(n_out) or len(buf) != section_length(n_tiles, n_out, n_rows) \
            or centroids.shape[0] != n_tiles:
        raise ModelError(f"{SECTION} does not fit the output layer ({n_tiles} tiles, map of {mb}-byte entries)")
    rec = np.frombuffer(buf, TILE, n_tiles, HEADER.size)
    starts = rec["start"].astype(np.int64)
    rb = rec["radius"].view("<u4")
    if starts[0] != 0 or np.any(np.diff(np.append(starts, n_out)) <= 0) or np.any(rb > 0x7F800000):
        raise ModelError(f"{SECTION} has tiles that do not ascend from 0 or a radius that is not in +0..+inf")
    dt = "<u2" if mb == 2 else "<u4"
    off = HEADER.size + TILE.itemsize * n_tiles
    perm = np.frombuffer(buf, dt, n_out, off).astype(np.int64)
    inv = np.frombuffer(buf, dt, n_rows, off + pad4(mb * n_out)).astype(np.int64)
    if np.any(perm >= n_out) or np.any(inv[perm] != np.arange(n_out)) or \
            np.any(inv[n_out:] != np.arange(n_out, n_rows)):
        raise ModelError(f"{SECTION}: its row and token maps are not inverse permutations of the output layer")
    return HeadIndex(perm, starts, centroids, rec["radius"].copy(), e_rows, e_tiles, steps)


# ---------------------------------------------------------------------------------------------
# the scan

def x_margin(xq: np.ndarray, xs: np.ndarray) -> tuple[np.float32, np.float32]:
    """(X2, Xm) for the head input's codes [groups, g] and scales [groups] (fold over groups)."""
    sq = np.sum(xq.astype(np.int64) ** 2, axis=1).astype(F)      # an int64, rounded once to binary32
    x2 = fold(sq * (xs * xs))
    return F(x2), F(np.sqrt(F(x2)) * MARGIN)


def first_max(v: np.ndarray) -> int:
    """The engine's argmax loop (``if (v[i] > v[best]) best = i``): the first maximum; NaN never
    wins, unless it is first (then every comparison fails and it stays)."""
    return 0 if np.isnan(v[0]) else int(np.nanargmax(v))


def bounds(index: HeadIndex, xq: np.ndarray, xs: np.ndarray, xm: np.float32) -> np.ndarray:
    """U_t = C_t + R_t * Xm for every tile (float32, the engine's operations)."""
    c = PackedMatrix(index.centroids).matvec_q(xq, xs)
    with np.errstate(over="ignore", invalid="ignore"):
        return (c + (index.radius * xm).astype(F)).astype(F)


def scan(index: HeadIndex | None, logits: np.ndarray, xq: np.ndarray, xs: np.ndarray) -> tuple[int, int, int]:
    """(token, head_rows, tiles visited) of the greedy scan, given the full logits in token order
    (a visited row's logit is the full scan's, bit for bit) and the head input's codes and scales.
    Without an index, or below the floor, it is the whole head: (first maximum, out_vocab, 0)."""
    n_out = len(logits)
    if index is None:
        return first_max(logits), n_out, 0
    x2, xm = x_margin(xq, xs)
    if not x2 >= FLOOR:
        return first_max(logits), n_out, 0
    u = bounds(index, xq, xs, xm)
    first = first_max(u)
    ends = index.ends()
    lg = logits[index.perm]
    best, tok, rows, tiles = F(0), -1, 0, 0
    for t in [first] + [t for t in range(index.n_tiles) if t != first]:
        if t != first and np.isfinite(u[t]) and u[t] < best:     # an overflowed bound proves nothing
            continue
        a, b = index.starts[t], ends[t]
        seg = lg[a:b]
        if np.isnan(seg).any():
            for i in range(a, b):     # NaN: the engine's comparisons, one by one
                if tok < 0 or lg[i] > best or (lg[i] == best and index.perm[i] < tok):
                    best, tok = lg[i], int(index.perm[i])
        else:
            top = seg.max()
            cand = int(index.perm[a:b][seg == top].min())
            if tok < 0 or top > best or (top == best and cand < tok):
                best, tok = top, cand
        rows += int(b - a)
        tiles += 1
    return tok, rows, tiles
