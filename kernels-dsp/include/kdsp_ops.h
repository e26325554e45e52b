/*
 * kdsp_ops.h -- the whole host <-> DSP ABI of kernels-dsp.
 *
 * Everything that crosses the host/DSP boundary is defined here: op codes, data types, tensor
 * layouts, the tensor and op descriptors, status codes, the batch wire format, and the small C
 * API a runtime uses to register buffers and run batches. Descriptors contain no pointers: a
 * tensor is (buffer id, byte offset, dims, byte strides), so a batch can be copied verbatim from
 * a 64-bit host to the 32-bit DSP (all fields are fixed width, padding is explicit and the sizes
 * are checked by static asserts on both sides).
 *
 * Conventions
 * - Dims are innermost first (ggml order): ne[0] is the contiguous dimension. A 2-D row-major
 *   matrix with R rows of C columns has ne = {C, R, 1, 1}. Unused dims must be 1.
 * - nb[i] is the byte stride of dim i. Row-major tensors need nb[0] == element size (or block
 *   size for Q8_0 / Q4_0 rows) and nb[i] != 0 for every dim with ne[i] > 1 (broadcasting is
 *   expressed with ne[i] == 1). Tiled layouts define their own addressing: nb[] must be all 0.
 *   A destination must not overlap itself (checked conservatively: sorted by stride, each dim
 *   must step over the whole span of the dims below it) nor any source, except that ops marked
 *   "may alias" accept a source with exactly the same buffer, offset, dtype, dims and strides.
 * - fp16 is IEEE binary16 stored as uint16_t; all f32 -> f16 conversions round to nearest even.
 *
 * Memory layouts consumed by the kernels (edges are zero padded; see README.md for pictures)
 * - KDSP_LAYOUT_HMX_WEIGHT_TILES (F16), logical weight W[N][K] (ne = {K, N}): NT = ceil(N/32),
 *   KT = ceil(K/32) tiles of 32x32 fp16 (2048 B). Tile (nt, kt) starts at byte
 *   (nt * KT + kt) * 2048, so one output column tile accumulates along K over consecutive tiles.
 *   Inside a tile, element (k, n) (k, n in 0..32) is at byte (k/2)*128 + n*4 + (k%2)*2
 *   (K pairs interleaved by halfword). Elements beyond N or K are +0.0.
 * - KDSP_LAYOUT_HMX_ACT_TILES (F16), logical activations A[M][K] (ne = {K, M}): MT = ceil(M/32),
 *   tile (mt, kt) at byte (mt * KT + kt) * 2048; inside, element (m, k) is at byte
 *   (m/2)*128 + k*4 + (m%2)*2 (row pairs interleaved by halfword). Padding is +0.0.
 * - KDSP_LAYOUT_Q4_0_TILES (Q4_0), logical weight W[N][K] (ne = {K, N}): NT*KT tiles of 32 rows x
 *   32 K. Bytes [0, NT*KT*512) hold the nibbles, tile (nt, kt) at (nt*KT + kt)*512; bytes
 *   [NT*KT*512, NT*KT*576) hold the scales, tile (nt, kt) at NT*KT*512 + (nt*KT + kt)*64, one
 *   fp16 d per row r at +2r. Inside a nibble tile, byte p*128 + r*4 + i (p in 0..4, r in 0..32,
 *   i in 0..4) = c(r, 8p+i) | c(r, 8p+4+i) << 4, where c(r, k) in 0..15 is the ggml Q4_0 code of
 *   row 32nt+r, column 32kt+k: weight = (c - 8) * d. Padding: code 8 (value 0), scale +0.0.
 *   This lets HVX unpack a 128-byte vector with one vand and one vlsr into two vectors whose
 *   32-bit lane r holds four consecutive codes of row r, ready for vrmpy.
 * - Row-major Q8_0 (ggml block_q8_0): per 32 values {uint16_t d; int8_t qs[32];} = 34 B,
 *   value = qs * d. Row-major Q4_0 (ggml block_q4_0): {uint16_t d; uint8_t qs[16];} = 18 B,
 *   x[j] = ((qs[j] & 15) - 8) * d, x[j+16] = ((qs[j] >> 4) - 8) * d.
 *
 * Alignment: registered buffer bases must be 128-byte aligned. Row-major tensors need offset and
 * strides to be multiples of 4 (F32, I32) or 2 (F16, Q8_0, Q4_0); tiled tensors need offset % 128 == 0.
 */
#ifndef KDSP_OPS_H
#define KDSP_OPS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** Version of this ABI; a batch carrying another version is rejected with UNSUPPORTED. */
#define KDSP_ABI_VERSION 2u
/** Magic number at the start of a serialized batch ("KDSP" in little-endian byte order). */
#define KDSP_BATCH_MAGIC 0x5053444Bu
/** Number of dims of a tensor descriptor. */
#define KDSP_MAX_DIMS 4u
/** Number of source tensor slots of an op descriptor. */
#define KDSP_MAX_SRC 4u
/** Upper bound of worker threads of one context. */
#define KDSP_MAX_WORKERS 16u
/** Upper bound of buffer-table slots of one context. */
#define KDSP_MAX_BUFFERS 65536u
/** Required alignment (bytes) of registered buffer bases and of tiled tensors. */
#define KDSP_BUFFER_ALIGN 128u
/** Largest allowed value of a single dim. */
#define KDSP_MAX_NE 16777216u
/** Largest allowed number of elements of one tensor (keeps 32-bit index math exact). */
#define KDSP_MAX_ELEMS 2147483647u
/** Side of an HMX / Q4_0 tile. */
#define KDSP_TILE 32u
/** Bytes of one 32x32 fp16 tile. */
#define KDSP_F16_TILE_BYTES 2048u
/** Bytes of the nibble part of one Q4_0 tile. */
#define KDSP_Q4_TILE_NIBBLE_BYTES 512u
/** Bytes of the scale part of one Q4_0 tile. */
#define KDSP_Q4_TILE_SCALE_BYTES 64u
/** Values per Q8_0 / Q4_0 block. */
#define KDSP_QBLOCK 32u
/** Bytes of one ggml block_q8_0. */
#define KDSP_Q8_0_BLOCK_BYTES 34u
/** Bytes of one ggml block_q4_0. */
#define KDSP_Q4_0_BLOCK_BYTES 18u
/** Largest head dim supported by KDSP_OP_FLASH_ATTN. */
#define KDSP_FA_MAX_HEAD_DIM 256u

/** Status type returned by every entry point. */
typedef uint32_t kdsp_status_t;

/** Status codes. Kernels never abort: every failure is one of these. */
enum kdsp_status {
    /** The op ran (or, in check mode, would run). */
    KDSP_STATUS_OK = 0,
    /** Unknown op code, ABI version, or a dtype/layout combination this build does not implement. */
    KDSP_STATUS_UNSUPPORTED = 1,
    /** A malformed descriptor: bad buffer id, dims, strides, alignment, bounds, overlap, params. */
    KDSP_STATUS_INVALID_PARAMS = 2,
    /** The op needs more scratch memory (VTCM stand-in) than the context has. */
    KDSP_STATUS_OUT_OF_BUDGET = 3,
    /** The op was not run because an earlier op of the batch failed. */
    KDSP_STATUS_NOT_RUN = 4
};

/** Op codes. Sources are listed as src[i]; "F32|F16" means either dtype is accepted. */
enum kdsp_opcode {
    /**
     * dst[M][N] = A[M][K] x W[N][K]^T with f32 accumulation along K (what an HMX tile multiply
     * computes). src0: W, F16 HMX_WEIGHT_TILES ne {K, N}. src1: A, F16 HMX_ACT_TILES ne {K, M}, or
     * F32|F16 ROW_MAJOR ne {K, M} (packed to activation tiles in scratch). dst: F32|F16 ROW_MAJOR
     * ne {N, M}.
     */
    KDSP_OP_MATMUL_F16 = 1,
    /**
     * dst[M][N] = A[M][K] x W[N][K]^T with W in Q4_0 and A quantized to Q8_0:
     * sum over K blocks of (int8 dot) * d_w * d_a, f32 out. src0: W, Q4_0 Q4_0_TILES ne {K, N}.
     * src1: A, F32 ROW_MAJOR ne {K, M} (quantized to Q8_0 on the DSP) or Q8_0 ROW_MAJOR ne {K, M}
     * with K % 32 == 0. dst: F32 ROW_MAJOR ne {N, M}.
     */
    KDSP_OP_MATMUL_Q4_0 = 2,
    /**
     * FlashAttention with online softmax: out = softmax(scale * Q K^T + mask) V per head.
     * src0: Q, F32|F16 ne {D, Hq, Tq}. src1: K, F16 ne {D, Hkv, Tk}. src2: V, F16 ne {D, Hkv, Tk}.
     * src3 (optional, n_src = 4): additive mask, F32|F16 ne {Tk, Tq, 1 or Hq}. dst: F32|F16
     * ne {D, Hq, Tq}. Hq % Hkv == 0 (GQA: q head h reads kv head h / (Hq/Hkv)); D <= 256.
     * Rows whose scores are all -inf produce zeros. params.attn. The key range is a strided view,
     * e.g. tokens a..b of a KV cache holding the cached prefix followed by the current window's
     * K/V; the queries may be any positions (RoPE is applied before, by KDSP_OP_ROPE_NEOX).
     * params.attn.kv_skip_begin/end exclude keys [begin, end) (the stale cached rows of a window
     * whose fresh K/V were appended after the cache); the result equals attention over the keys
     * [0, begin) ++ [end, Tk) in that order. Mask columns keep the key index (0..Tk).
     */
    KDSP_OP_FLASH_ATTN = 3,
    /**
     * RMSNorm over ne[0]: dst = x * rsqrt(mean(x^2) + eps) * w, computed in f32.
     * src0: x, F32|F16 (up to 4-D). src1: w, F32|F16 ne {ne0(x), 1, 1, 1}. dst: F32|F16, shape of x.
     * params.norm. dst may alias src0 exactly.
     */
    KDSP_OP_RMS_NORM = 4,
    /**
     * dst = silu(gate) * up, silu(g) = g / (1 + exp(-g)). src0: gate, src1: up, dst: F32|F16,
     * all the same shape (up to 4-D). dst may alias a source exactly.
     */
    KDSP_OP_SWIGLU = 5,
    /**
     * dst = a + b. src0: a, src1: b (each dim equal to a's or 1: broadcast), dst: shape of a.
     * F32|F16 each. dst may alias src0 exactly.
     */
    KDSP_OP_ADD = 6,
    /**
     * NeoX (half-rotation) RoPE with host-computed tables: for i < D/2, p = pos[t],
     * y[i] = x[i] cos[p][i] - x[i+D/2] sin[p][i], y[i+D/2] = x[i+D/2] cos[p][i] + x[i] sin[p][i].
     * src0: x, F32|F16 ne {D, H, T}. src1: pos, I32 ne {T}. src2: cos, F32 ne {D/2, P}.
     * src3: sin, F32 ne {D/2, P}. dst: F32|F16, shape of x. Every pos must be in 0..P.
     * dst may alias src0 exactly.
     */
    KDSP_OP_ROPE_NEOX = 7,
    /**
     * Q8_0 quantization (see README for the exact integer rounding rule). src0: F32 ROW_MAJOR
     * ne {K, rows...} with K % 32 == 0. dst: Q8_0 ROW_MAJOR, same ne.
     */
    KDSP_OP_QUANTIZE_Q8_0 = 8,
    /** Row-major to activation tiles. src0: F32|F16 ROW_MAJOR ne {K, M}. dst: F16 HMX_ACT_TILES ne {K, M}. */
    KDSP_OP_PACK_ACT_TILES = 9,
    /** Activation tiles to row-major. src0: F16 HMX_ACT_TILES ne {K, M}. dst: F32|F16 ROW_MAJOR ne {K, M}. */
    KDSP_OP_UNPACK_ACT_TILES = 10,
    /** Load-time weight repack. src0: F32|F16 ROW_MAJOR ne {K, N}. dst: F16 HMX_WEIGHT_TILES ne {K, N}. */
    KDSP_OP_PACK_WEIGHT_F16 = 11,
    /** Load-time Q4_0 repack. src0: Q4_0 ROW_MAJOR (ggml blocks) ne {K, N}, K % 32 == 0. dst: Q4_0 Q4_0_TILES ne {K, N}. */
    KDSP_OP_PACK_Q4_0 = 12,
    /** Nibble unpack + dequantization. src0: Q4_0 Q4_0_TILES ne {K, N}. dst: F32|F16 ROW_MAJOR ne {K, N}. */
    KDSP_OP_DEQUANT_Q4_0 = 13,
    /**
     * Gather rows by index: dst[b][i][:] = src0[b][idx[b'][i]][:] with b' = b when the index
     * tensor has B rows, 0 when it has one. src0: F32|F16 ROW_MAJOR ne {C, R, B}. src1: idx, I32
     * ROW_MAJOR ne {N, 1 or B}. dst: F32|F16 ROW_MAJOR ne {C, N, B} (converts F32 <-> F16;
     * f32 -> f16 rounds to nearest even). Every index must be in 0..R: indices are data, checked
     * when the op runs, before anything is written. dst must not overlap a source.
     */
    KDSP_OP_GET_ROWS = 14,
    /**
     * Strided copy with conversion: dst = src0 element by element (F32 <-> F16, or the same
     * type bit for bit). src0, dst: F32|F16 ROW_MAJOR with the same ne (up to 4-D), any strides
     * (e.g. the V columns of a fused QKV output into a KV cache). dst must not overlap src0.
     */
    KDSP_OP_CPY = 15,
    /** Number of op codes + 1 (op codes are 1..KDSP_OP_COUNT-1). */
    KDSP_OP_COUNT = 16
};

/** Element types. */
enum kdsp_dtype {
    /** IEEE binary32. */
    KDSP_DTYPE_F32 = 1,
    /** IEEE binary16 (uint16_t storage). */
    KDSP_DTYPE_F16 = 2,
    /** int32_t. */
    KDSP_DTYPE_I32 = 3,
    /** ggml Q8_0 blocks (row-major) -- 32 values per 34-byte block. */
    KDSP_DTYPE_Q8_0 = 4,
    /** ggml Q4_0 blocks (row-major) or the Q4_0 tile repack. */
    KDSP_DTYPE_Q4_0 = 5
};

/** Memory layouts. */
enum kdsp_layout {
    /** Strided dense array described by ne[] and nb[]. */
    KDSP_LAYOUT_ROW_MAJOR = 1,
    /** fp16 activation tiles (row pairs interleaved); see the header comment. */
    KDSP_LAYOUT_HMX_ACT_TILES = 2,
    /** fp16 weight tiles (K pairs interleaved); see the header comment. */
    KDSP_LAYOUT_HMX_WEIGHT_TILES = 3,
    /** Q4_0 tiles of 32 rows x 32 K (512 B nibbles + 32 fp16 scales); see the header comment. */
    KDSP_LAYOUT_Q4_0_TILES = 4
};

/** Flags of kdsp_execute / kdsp_batch_header.flags. */
enum kdsp_exec_flags {
    /** Keep running the ops after a failed op (default: later ops get KDSP_STATUS_NOT_RUN). */
    KDSP_EXEC_CONTINUE_ON_ERROR = 1
};

/** A tensor: a view into a registered buffer. 72 bytes. */
typedef struct kdsp_tensor {
    /** Buffer table slot registered with kdsp_buffer_register. */
    uint32_t buffer_id;
    /** One of enum kdsp_dtype. */
    uint32_t dtype;
    /** One of enum kdsp_layout. */
    uint32_t layout;
    /** Explicit padding, must be 0. */
    uint32_t _pad0;
    /** Byte offset of element (0, 0, 0, 0) from the buffer base. */
    uint64_t offset;
    /** Dims, innermost first; unused dims are 1. */
    uint32_t ne[4];
    /** Byte strides (row-major) or all 0 (tiled layouts). */
    uint64_t nb[4];
} kdsp_tensor;

/** Params of the matmul ops (none yet; all fields must be 0). */
typedef struct kdsp_params_matmul {
    /** Reserved, must be 0. */
    uint32_t reserved[16];
} kdsp_params_matmul;

/** Params of KDSP_OP_FLASH_ATTN. */
typedef struct kdsp_params_attn {
    /** Score scale, usually 1/sqrt(D); must be finite. */
    float scale;
    /** First key index excluded from attention (with kv_skip_end; both 0: no exclusion). */
    uint32_t kv_skip_begin;
    /** One past the last excluded key: begin < end <= Tk, or begin == end == 0. */
    uint32_t kv_skip_end;
    /** Reserved, must be 0. */
    uint32_t reserved[13];
} kdsp_params_attn;

/** Params of KDSP_OP_RMS_NORM. */
typedef struct kdsp_params_norm {
    /** Added to mean(x^2); must be finite and >= 0. */
    float eps;
    /** Reserved, must be 0. */
    uint32_t reserved[15];
} kdsp_params_norm;

/** Op parameters: interpret by op code. 64 bytes. */
typedef union kdsp_op_params {
    /** KDSP_OP_MATMUL_F16, KDSP_OP_MATMUL_Q4_0. */
    kdsp_params_matmul matmul;
    /** KDSP_OP_FLASH_ATTN. */
    kdsp_params_attn attn;
    /** KDSP_OP_RMS_NORM. */
    kdsp_params_norm norm;
    /** Raw words (ops without params require all 0). */
    uint32_t raw[16];
} kdsp_op_params;

/** One op: code, params, destination and sources. 440 bytes. */
typedef struct kdsp_op {
    /** One of enum kdsp_opcode. */
    uint32_t opcode;
    /** Number of used src[] slots. */
    uint32_t n_src;
    /** Reserved, must be 0. */
    uint32_t flags;
    /** Explicit padding, must be 0. */
    uint32_t _pad0;
    /** Op parameters. */
    kdsp_op_params params;
    /** Output tensor. */
    kdsp_tensor dst;
    /** Input tensors (slots >= n_src are ignored). */
    kdsp_tensor src[4];
} kdsp_op;

/** Header of a serialized batch: followed by n_ops kdsp_op records. 16 bytes. */
typedef struct kdsp_batch_header {
    /** KDSP_BATCH_MAGIC. */
    uint32_t magic;
    /** KDSP_ABI_VERSION. */
    uint32_t abi_version;
    /** Number of kdsp_op records that follow. */
    uint32_t n_ops;
    /** enum kdsp_exec_flags. */
    uint32_t flags;
} kdsp_batch_header;

/** Configuration of a context. 16 bytes. */
typedef struct kdsp_ctx_config {
    /** Workers each op is split across (1..KDSP_MAX_WORKERS); worker 0 is the calling thread. */
    uint32_t n_workers;
    /** Size of the buffer table (ids 0..max_buffers-1), 1..KDSP_MAX_BUFFERS. */
    uint32_t max_buffers;
    /** Bytes of the scratch arena given to kdsp_ctx_init (the VTCM stand-in). */
    uint64_t scratch_bytes;
} kdsp_ctx_config;

#ifndef __cplusplus
_Static_assert(sizeof(kdsp_tensor) == 72, "kdsp_tensor ABI size");
_Static_assert(__builtin_offsetof(kdsp_tensor, offset) == 16, "kdsp_tensor.offset");
_Static_assert(__builtin_offsetof(kdsp_tensor, ne) == 24, "kdsp_tensor.ne");
_Static_assert(__builtin_offsetof(kdsp_tensor, nb) == 40, "kdsp_tensor.nb");
_Static_assert(sizeof(kdsp_op_params) == 64, "kdsp_op_params ABI size");
_Static_assert(sizeof(kdsp_op) == 440, "kdsp_op ABI size");
_Static_assert(__builtin_offsetof(kdsp_op, params) == 16, "kdsp_op.params");
_Static_assert(__builtin_offsetof(kdsp_op, dst) == 80, "kdsp_op.dst");
_Static_assert(__builtin_offsetof(kdsp_op, src) == 152, "kdsp_op.src");
_Static_assert(sizeof(kdsp_batch_header) == 16, "kdsp_batch_header ABI size");
_Static_assert(sizeof(kdsp_ctx_config) == 16, "kdsp_ctx_config ABI size");
#endif

/** Opaque execution context: worker pool, buffer table and scratch arena. */
typedef struct kdsp_ctx kdsp_ctx;

/**
 * Bytes of caller-provided memory kdsp_ctx_init needs for cfg (0 if cfg is invalid). The memory
 * must be 16-byte aligned and stay valid until kdsp_ctx_release.
 */
uint64_t kdsp_ctx_bytes(const kdsp_ctx_config *cfg);

/**
 * Initialise a context in mem (kdsp_ctx_bytes(cfg) bytes) with a scratch arena of
 * cfg->scratch_bytes at scratch (128-byte aligned; may be NULL when scratch_bytes is 0) and start
 * cfg->n_workers - 1 worker threads. On success *out points into mem.
 */
kdsp_status_t kdsp_ctx_init(void *mem, uint64_t mem_bytes, void *scratch, const kdsp_ctx_config *cfg,
                            kdsp_ctx **out);

/** Stop the worker threads. The context memory may then be freed. */
void kdsp_ctx_release(kdsp_ctx *ctx);

/**
 * Make [base, base + size) visible to ops as buffer `id`. base must be 128-byte aligned and the
 * slot free. On the DSP this is where a FastRPC-mapped fd becomes a buffer id.
 */
kdsp_status_t kdsp_buffer_register(kdsp_ctx *ctx, uint32_t id, void *base, uint64_t size);

/** Free slot `id`. */
kdsp_status_t kdsp_buffer_unregister(kdsp_ctx *ctx, uint32_t id);

/**
 * Validate one op against the registered buffers without touching tensor memory. On OK,
 * *scratch_bytes (if not NULL) receives the scratch the op needs. Use for routing decisions.
 */
kdsp_status_t kdsp_op_check(const kdsp_ctx *ctx, const kdsp_op *op, uint64_t *scratch_bytes);

/**
 * Run n_ops ops in order, each split across the workers. statuses (n_ops entries, may be NULL)
 * receives one status per op. Returns OK if every op ran, otherwise the first failing status.
 */
kdsp_status_t kdsp_execute(kdsp_ctx *ctx, const kdsp_op *ops, uint32_t n_ops, uint32_t flags,
                           kdsp_status_t *statuses);

/**
 * Run a serialized batch (kdsp_batch_header + ops, 8-byte aligned) as received over FastRPC.
 * statuses has room for max_statuses entries. Rejects a bad header or a length mismatch with
 * INVALID_PARAMS and another ABI version with UNSUPPORTED.
 */
kdsp_status_t kdsp_execute_batch(kdsp_ctx *ctx, const void *batch, uint64_t batch_bytes,
                                 kdsp_status_t *statuses, uint32_t max_statuses);

/** A short description of the build: "kernels-dsp abi=2 hvx=0 hvx_float=0 workers=pthreads". */
const char *kdsp_build_info(void);

#ifdef __cplusplus
}
#endif

#endif /* KDSP_OPS_H */
