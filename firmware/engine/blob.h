/* Reader of the weights blob (docs/formats.md section 1): validates, then exposes tensor views. */
#ifndef FLM_BLOB_H
#define FLM_BLOB_H
#include <stddef.h>
#include <stdint.h>

#ifndef FLM_MAX_LAYERS
#define FLM_MAX_LAYERS 32
#endif
/* Experts per FFN layer a build holds (a generated project: its model's, at least 1) and the most a
 * token reads; a dense FFN is expert 0 */
#ifndef FLM_MAX_EXPERTS
#define FLM_MAX_EXPERTS 8
#endif
#ifndef FLM_MAX_TOP_K
#define FLM_MAX_TOP_K 2
#endif

enum { FLM_F32 = 0, FLM_Q8 = 1, FLM_Q4 = 2, FLM_BYTES = 3 };
#define FLM_FMT_SCALE16 0x100u   /* table format bit 8: the rows carry fp16 scales (q8/q4 only) */
#define FLM_FMT_ROWSCALE 0x200u  /* bit 9: a row scale and u8 group multipliers (q8/q4 only; not with bit 8) */
#define FLM_MAX_GROUP 1024u      /* group sizes: every group sum (127 x 2047 x 1024 < 2^28) an int32 */
#define FLM_MAX_GROUP_ROW 512u   /* row-scaled (docs/formats.md section 1) */
enum { FLM_TIER_FLASH = 0, FLM_TIER_PSRAM = 1, FLM_TIER_SRAM = 2, FLM_N_TIERS = 3 };
/* KV cache format: state_tiers bits 12-15. k12: int16 K codes within +-2047, int8 V codes (docs/formats.md 1.2) */
enum { FLM_KV_F32 = 0, FLM_KV_INT8 = 1, FLM_KV_K12 = 2 };
#define FLM_K12_MAX_HEAD_DIM 512u  /* k12's score sums, 2047^2 * head_dim, stay below 2^31 */
#define FLM_NUMERICS 4             /* the image format and numerics version this firmware reads (header word 1) */
#define FLM_KV_SHIFT 12u
#define FLM_BATCH_SHIFT 16u      /* state_tiers bits 16-23: the most tokens one forward pass runs (0: 1) */
#define FLM_NONE 0xFFFFFFFFu
#define FLM_MAX_STOP 16u         /* stop ids a model may have (section tokenizer.stop) */

typedef struct {
    const uint8_t *data;
    uint32_t fmt, rows, cols, group, stride, tier, length;   /* fmt: the base format (FLM_F32..) */
    uint8_t scale16;               /* 1: fp16 scales, a row = its scales (padded to 4), then codes */
    uint8_t rowscale;              /* 1: a row = f32 row scale, u8 multipliers (padded to 4), then codes
                                    * (q4 offset by 8); one activation scale for the whole input
                                    * (bytes: a model holds hundreds of tensors in the RP2040's SRAM) */
} flm_tensor;

typedef struct { flm_tensor w1, w2, w3; } flm_ffn;   /* a SwiGLU FFN: gate, down, up */

typedef struct {
    flm_tensor attn_norm, wq, wk, wv, wo, ffn_norm;
    flm_ffn ffn[FLM_MAX_EXPERTS];  /* the dense FFN (ffn[0]), or expert e's (n_experts > 0) */
    flm_tensor router;             /* f32 [n_experts, dim]: the experts' router (n_experts > 0 only) */
    flm_tensor ple_gate, ple_proj, ple_norm;   /* Per-Layer Embeddings (ple_dim > 0 only) */
} flm_layer;


typedef struct {
    uint32_t dim, n_layers, n_heads, n_kv_heads, hidden, vocab, seq_len, tied, bos, eos;
    uint32_t ple_dim;              /* P: Per-Layer Embedding width, 0 = none */
    uint32_t n_out;                /* rows of the output layer (out_vocab): the logits' length */
    uint32_t n_experts, top_k;     /* a mixture of experts: E experts a layer, k read per token (0, 0: dense) */
    uint32_t head_dim, kv_dim, layout_id;
    uint32_t min_group;            /* smallest group size of the quantized tensors */
    uint32_t state_tiers;          /* header: 4-bit tier per RAM region (FLM_REG_*), 0 = default arena */
    uint32_t kv_fmt;               /* placement: the KV cache's format (FLM_KV_*), from state_tiers */
    uint32_t batch;                /* placement: the most tokens one forward pass runs (1..255; the
                                    * scratch and logits regions grow with it), from state_tiers */
    const uint8_t *blob;           /* the image in flash, and where its tensor table is */
    uint32_t n_entries, table;
    float eps;
    uint8_t model_hash[16];
    flm_tensor tok_emb, head, norm, rope_cos, rope_sin;
    /* The head index (docs/formats.md sections 1 and 3; n_tiles 0: none): the head's first n_out
     * rows are stored tile after tile; head_tiles holds a 32-byte header, per tile (u32 first
     * stored row, f32 radius), then the row -> token and token -> row maps (map_bytes an entry). */
    flm_tensor head_centroids;     /* q8 [n_tiles, dim]: each tile's centre row, the head's groups */
    flm_tensor head_tiles;         /* bytes */
    uint32_t n_tiles, map_bytes;
    flm_tensor ple_table, ple_proj, ple_norm;   /* ple_dim > 0 only */
    flm_layer layers[FLM_MAX_LAYERS];
    const uint8_t *tok_data;       /* piece bytes; piece i = tok_data[tok_off[i] .. tok_off[i+1]) */
    const uint8_t *tok_off;        /* u32 little-endian offsets, n_pieces + 1 */
    uint32_t n_stop, stop[FLM_MAX_STOP];   /* generation ends at any of these ids (tokenizer.stop) */
} flm_model;

/* Validate magic, version, size, CRC-32, config and every table entry's bounds and layout,
 * then fill m. Returns 0, or -1 with a one-line reason in err. */
int flm_blob_open(flm_model *m, const uint8_t *blob, size_t len, char *err, size_t errlen);
/* The length to open of an image at the start of a flash window of `window` bytes: the header's
 * total size when the window starts with the magic and holds that much, else the whole window (an
 * erased, foreign or truncated image is handed over as it is: flm_blob_open names what is wrong). */
size_t flm_blob_span(const uint8_t *b, size_t window);
/* 1 when a state_tiers field (header or LAYOUT) is valid: regions 0-2 a tier (0 default, psram,
 * sram), bits 12-15 a KV format (FLM_KV_*), bits 16-23 the batch, bits 24-31 zero. */
int flm_state_tiers_ok(uint32_t st);
/* NULL when model m can keep its KV cache in format kv_fmt, else the one-line reason (k12 needs a
 * head of at most FLM_K12_MAX_HEAD_DIM). */
const char *flm_kv_refusal(const flm_model *m, uint32_t kv_fmt);
/* The name of a KV format (f32, int8, k12), as convert's --kv. */
const char *flm_kv_name(uint32_t kv_fmt);
/* The batch a state_tiers field names: bits 16-23, 0 meaning 1. */
uint32_t flm_batch_of(uint32_t st);
/* Point every tensor the engine uses back at its bytes in the image (flash) and set its tier from
 * tiers[i] (one byte per table entry, table order; each < FLM_N_TIERS) or, when tiers is NULL,
 * from the table. For an m that flm_blob_open accepted. */
void flm_blob_retier(flm_model *m, const uint8_t *tiers);
/* With a tied head: head = the first n_out rows of tok_emb (call after tok_emb moves). */
void flm_blob_tie_head(flm_model *m);
/* The i-th tensor the engine reads (i = 0, 1, ... until NULL): each once, a tied head being
 * tok_emb's rows. The one list of them (staging, the emulator's region marks, the fuzz oracle). */
flm_tensor *flm_tensor_at(const flm_model *m, uint32_t i);
/* The bytes of the section (format bytes) named name, or NULL; *len receives its length. For an m
 * that flm_blob_open accepted (it checked every table entry's bounds). */
const uint8_t *flm_blob_section(const flm_model *m, const char *name, uint32_t *len);
/* 1 when id is one of the model's stop ids: a generation that emits it ends (reason eos). */
int flm_is_stop(const flm_model *m, uint32_t id);
/* Piece bytes of token id; *len receives the length. */
const uint8_t *flm_piece(const flm_model *m, uint32_t id, uint32_t *len);
uint32_t flm_rd32(const uint8_t *p);
/* The head index's maps (n_tiles > 0): the token of stored head row i (inverse 0), or the stored
 * row of token i < n_out (inverse 1); reads map_bytes bytes of head.tiles. */
uint32_t flm_head_map(const flm_model *m, int inverse, uint32_t i);
#endif
