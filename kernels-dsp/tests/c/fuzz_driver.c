/*
 * fuzz_driver.c -- descriptor fuzzer for the host build, compiled together with the kernels under
 * AddressSanitizer + UndefinedBehaviorSanitizer (-fno-sanitize-recover=all) by
 * tests/sanitizers.rs. Every tensor lives in its own heap buffer of exactly the size its
 * descriptor needs, so any read or write past a validated extent is an ASan report.
 *
 *   1. valid ops of every op code on random shapes (non-multiples of 32, padded strides, offsets)
 *      must return OK (and run clean under the sanitizers);
 *   2. each valid op is mutated (random bytes, dims, strides, offsets, buffer ids, dtypes,
 *      layouts, aliasing/overlapping outputs, op codes, params) and run: any status is fine,
 *      a crash or sanitizer report is not;
 *   3. fully random descriptors, random batch headers, and API misuse.
 * Usage: fuzz_driver SEED ROUNDS. Prints a status histogram; exit 0 on success.
 */
#define _POSIX_C_SOURCE 200809L

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kdsp_f16.h"
#include "kdsp_ops.h"

static uint64_t rng_state;

static uint64_t rng(void) {
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint32_t rnd(uint32_t lo, uint32_t hi) { /* inclusive */
    return lo + (uint32_t)(rng() % (uint64_t)(hi - lo + 1u));
}

static float rsym(void) {
    return (float)(int32_t)(rng() >> 40) * (1.0f / 8388608.0f) - 1.0f;
}

#define MAX_BUFS 12u
static kdsp_ctx *ctx;
static void *bufs[MAX_BUFS];
static uint64_t buf_sizes[MAX_BUFS];
static uint32_t n_bufs;
static uint64_t hist[8];
static uint32_t n_errors;

/* An exactly sized, registered buffer; returns its id. */
static uint32_t add_buf(uint64_t size) {
    void *p = NULL;
    if (posix_memalign(&p, 128, (size_t)size) != 0) {
        fprintf(stderr, "posix_memalign failed\n");
        exit(2);
    }
    const uint32_t id = n_bufs++;
    bufs[id] = p;
    buf_sizes[id] = size;
    if (kdsp_buffer_register(ctx, id, p, size) != KDSP_STATUS_OK) {
        fprintf(stderr, "register failed\n");
        exit(2);
    }
    return id;
}

static void fill(uint32_t dtype, uint8_t *p, uint64_t bytes) {
    if (dtype == KDSP_DTYPE_F32) {
        for (uint64_t i = 0; i + 4 <= bytes; i += 4) {
            const float v = rsym() * 4.0f;
            memcpy(p + i, &v, 4);
        }
    } else if (dtype == KDSP_DTYPE_F16) {
        for (uint64_t i = 0; i + 2 <= bytes; i += 2) {
            const uint16_t h = kdsp_f32_to_f16(rsym() * 4.0f);
            memcpy(p + i, &h, 2);
        }
    } else {
        for (uint64_t i = 0; i < bytes; i++) {
            p[i] = (uint8_t)(rng() >> 56);
        }
    }
}

/* Row-major tensor in its own buffer: random aligned offset, random row padding. */
static kdsp_tensor mk_rows(uint32_t dtype, uint32_t n0, uint32_t n1, uint32_t n2, uint32_t n3) {
    kdsp_tensor t;
    memset(&t, 0, sizeof(t));
    const uint32_t align = (dtype == KDSP_DTYPE_F32 || dtype == KDSP_DTYPE_I32) ? 4u : 2u;
    uint64_t unit = dtype == KDSP_DTYPE_F16 ? 2u : 4u;
    uint64_t row = (uint64_t)n0 * unit;
    if (dtype == KDSP_DTYPE_Q8_0 || dtype == KDSP_DTYPE_Q4_0) {
        unit = dtype == KDSP_DTYPE_Q8_0 ? 34u : 18u;
        row = (uint64_t)(n0 / 32u) * unit;
    }
    t.dtype = dtype;
    t.layout = KDSP_LAYOUT_ROW_MAJOR;
    t.ne[0] = n0;
    t.ne[1] = n1;
    t.ne[2] = n2;
    t.ne[3] = n3;
    t.nb[0] = unit;
    t.nb[1] = row + align * rnd(0, 2);
    t.nb[2] = t.nb[1] * n1 + align * rnd(0, 1);
    t.nb[3] = t.nb[2] * n2;
    t.offset = align * rnd(0, 8);
    const uint64_t bytes = t.offset + (n3 - 1u) * t.nb[3] + (n2 - 1u) * t.nb[2] + (n1 - 1u) * t.nb[1] + row;
    t.buffer_id = add_buf(bytes);
    fill(dtype, (uint8_t *)bufs[t.buffer_id] + t.offset, bytes - t.offset);
    return t;
}

static kdsp_tensor mk_tiles(uint32_t layout, uint32_t k, uint32_t rows) {
    kdsp_tensor t;
    memset(&t, 0, sizeof(t));
    t.dtype = layout == KDSP_LAYOUT_Q4_0_TILES ? KDSP_DTYPE_Q4_0 : KDSP_DTYPE_F16;
    t.layout = layout;
    t.ne[0] = k;
    t.ne[1] = rows;
    t.ne[2] = 1;
    t.ne[3] = 1;
    t.offset = 128u * rnd(0, 1);
    const uint64_t tiles = (uint64_t)((k + 31u) / 32u) * ((rows + 31u) / 32u);
    const uint64_t bytes = t.offset + tiles * (layout == KDSP_LAYOUT_Q4_0_TILES ? 576u : 2048u);
    t.buffer_id = add_buf(bytes);
    fill(layout == KDSP_LAYOUT_Q4_0_TILES ? KDSP_DTYPE_Q4_0 : KDSP_DTYPE_F16, (uint8_t *)bufs[t.buffer_id] + t.offset,
         bytes - t.offset);
    if (layout == KDSP_LAYOUT_Q4_0_TILES) { /* finite scales */
        uint8_t *sc = (uint8_t *)bufs[t.buffer_id] + t.offset + tiles * 512u;
        fill(KDSP_DTYPE_F16, sc, tiles * 64u);
    }
    return t;
}

static uint32_t fdt(void) {
    return rnd(0, 1) ? KDSP_DTYPE_F32 : KDSP_DTYPE_F16;
}

/* A valid op of the given code on random small shapes. */
static kdsp_op gen_valid(uint32_t code) {
    kdsp_op op;
    memset(&op, 0, sizeof(op));
    op.opcode = code;
    const uint32_t M = rnd(1, 70), N = rnd(1, 70), K = rnd(1, 100), K32 = 32u * rnd(1, 3);
    switch (code) {
    case KDSP_OP_MATMUL_F16: {
        op.n_src = 2;
        op.src[0] = mk_tiles(KDSP_LAYOUT_HMX_WEIGHT_TILES, K, N);
        op.src[1] = rnd(0, 1) ? mk_tiles(KDSP_LAYOUT_HMX_ACT_TILES, K, M) : mk_rows(fdt(), K, M, 1, 1);
        op.dst = mk_rows(fdt(), N, M, 1, 1);
        break;
    }
    case KDSP_OP_MATMUL_Q4_0: {
        op.n_src = 2;
        const int q8 = rnd(0, 1);
        const uint32_t k = q8 ? K32 : K;
        op.src[0] = mk_tiles(KDSP_LAYOUT_Q4_0_TILES, k, N);
        op.src[1] = mk_rows(q8 ? KDSP_DTYPE_Q8_0 : KDSP_DTYPE_F32, k, M, 1, 1);
        op.dst = mk_rows(KDSP_DTYPE_F32, N, M, 1, 1);
        break;
    }
    case KDSP_OP_FLASH_ATTN: {
        const uint32_t D = rnd(1, 80), Hkv = rnd(1, 3), Hq = Hkv * rnd(1, 3), Tq = rnd(1, 10), Tk = rnd(1, 80);
        op.n_src = rnd(3, 4);
        op.src[0] = mk_rows(fdt(), D, Hq, Tq, 1);
        op.src[1] = mk_rows(KDSP_DTYPE_F16, D, Hkv, Tk, 1);
        op.src[2] = mk_rows(KDSP_DTYPE_F16, D, Hkv, Tk, 1);
        if (op.n_src == 4) {
            op.src[3] = mk_rows(fdt(), Tk, Tq, rnd(0, 1) ? 1u : Hq, 1);
        }
        op.dst = mk_rows(fdt(), D, Hq, Tq, 1);
        op.params.attn.scale = 0.125f;
        if (rnd(0, 1) && Tk > 1u) { /* exclude a key range */
            op.params.attn.kv_skip_begin = rnd(0, Tk - 1u);
            op.params.attn.kv_skip_end = rnd(op.params.attn.kv_skip_begin + 1u, Tk);
        }
        break;
    }
    case KDSP_OP_RMS_NORM:
        op.n_src = 2;
        op.src[0] = mk_rows(fdt(), K, rnd(1, 4), rnd(1, 3), 1);
        op.src[1] = mk_rows(fdt(), K, 1, 1, 1);
        op.dst = mk_rows(fdt(), K, op.src[0].ne[1], op.src[0].ne[2], 1);
        op.params.norm.eps = 1e-5f;
        break;
    case KDSP_OP_SWIGLU:
    case KDSP_OP_ADD: {
        const uint32_t r = rnd(1, 4), s = rnd(1, 3);
        op.n_src = 2;
        op.src[0] = mk_rows(fdt(), K, r, s, 1);
        if (code == KDSP_OP_ADD) {
            op.src[1] = mk_rows(fdt(), rnd(0, 1) ? K : 1u, rnd(0, 1) ? r : 1u, rnd(0, 1) ? s : 1u, 1);
        } else {
            op.src[1] = mk_rows(fdt(), K, r, s, 1);
        }
        op.dst = mk_rows(fdt(), K, r, s, 1);
        break;
    }
    case KDSP_OP_ROPE_NEOX: {
        const uint32_t D = 2u * rnd(1, 40), H = rnd(1, 4), T = rnd(1, 9), P = rnd(1, 20);
        op.n_src = 4;
        op.src[0] = mk_rows(fdt(), D, H, T, 1);
        op.src[1] = mk_rows(KDSP_DTYPE_I32, T, 1, 1, 1);
        int32_t *pos = (int32_t *)(void *)((uint8_t *)bufs[op.src[1].buffer_id] + op.src[1].offset);
        for (uint32_t t = 0; t < T; t++) {
            pos[t] = (int32_t)rnd(0, P - 1u);
        }
        op.src[2] = mk_rows(KDSP_DTYPE_F32, D / 2u, P, 1, 1);
        op.src[3] = mk_rows(KDSP_DTYPE_F32, D / 2u, P, 1, 1);
        op.dst = mk_rows(fdt(), D, H, T, 1);
        break;
    }
    case KDSP_OP_QUANTIZE_Q8_0:
        op.n_src = 1;
        op.src[0] = mk_rows(KDSP_DTYPE_F32, K32, M, rnd(1, 2), 1);
        op.dst = mk_rows(KDSP_DTYPE_Q8_0, K32, M, op.src[0].ne[2], 1);
        break;
    case KDSP_OP_PACK_ACT_TILES:
        op.n_src = 1;
        op.src[0] = mk_rows(fdt(), K, M, 1, 1);
        op.dst = mk_tiles(KDSP_LAYOUT_HMX_ACT_TILES, K, M);
        break;
    case KDSP_OP_UNPACK_ACT_TILES:
        op.n_src = 1;
        op.src[0] = mk_tiles(KDSP_LAYOUT_HMX_ACT_TILES, K, M);
        op.dst = mk_rows(fdt(), K, M, 1, 1);
        break;
    case KDSP_OP_PACK_WEIGHT_F16:
        op.n_src = 1;
        op.src[0] = mk_rows(fdt(), K, N, 1, 1);
        op.dst = mk_tiles(KDSP_LAYOUT_HMX_WEIGHT_TILES, K, N);
        break;
    case KDSP_OP_PACK_Q4_0:
        op.n_src = 1;
        op.src[0] = mk_rows(KDSP_DTYPE_Q4_0, K32, N, 1, 1);
        op.dst = mk_tiles(KDSP_LAYOUT_Q4_0_TILES, K32, N);
        break;
    case KDSP_OP_GET_ROWS: {
        const uint32_t R = rnd(1, 40), B = rnd(1, 3), per_batch = rnd(0, 1);
        op.n_src = 2;
        op.src[0] = mk_rows(fdt(), K, R, B, 1);
        op.src[1] = mk_rows(KDSP_DTYPE_I32, M, per_batch ? B : 1u, 1, 1);
        for (uint32_t b = 0; b < op.src[1].ne[1]; b++) {
            for (uint32_t i = 0; i < M; i++) {
                *(int32_t *)(void *)((uint8_t *)bufs[op.src[1].buffer_id] + op.src[1].offset +
                                     b * op.src[1].nb[1] + i * 4u) = (int32_t)rnd(0, R - 1u);
            }
        }
        op.dst = mk_rows(fdt(), K, M, B, 1);
        break;
    }
    case KDSP_OP_CPY: {
        const uint32_t a = rnd(1, 4), b = rnd(1, 3), c = rnd(1, 2);
        op.n_src = 1;
        op.src[0] = mk_rows(fdt(), K, a, b, c);
        op.dst = mk_rows(fdt(), K, a, b, c);
        break;
    }
    default: /* KDSP_OP_DEQUANT_Q4_0 */
        op.n_src = 1;
        op.src[0] = mk_tiles(KDSP_LAYOUT_Q4_0_TILES, K, N);
        op.dst = mk_rows(fdt(), K, N, 1, 1);
        break;
    }
    return op;
}

static kdsp_tensor *pick_tensor(kdsp_op *op) {
    const uint32_t i = rnd(0, KDSP_MAX_SRC);
    return i == KDSP_MAX_SRC ? &op->dst : &op->src[i];
}

static const uint64_t edge_u64[] = {0, 1, 2, 3, 4, 31, 32, 127, 128, 4096, 0x7fffffffu, 0xffffffffu,
                                    0x100000000ull, 0x7fffffffffffffffull, 0xffffffffffffffffull};
static const uint32_t edge_u32[] = {0, 1, 2, 3, 31, 32, 33, 64, 255, 4096, 16777216u, 16777217u, 0x7fffffffu, 0xffffffffu};

static uint64_t pick_u64(void) {
    return rnd(0, 1) ? edge_u64[rnd(0, sizeof(edge_u64) / sizeof(edge_u64[0]) - 1u)] : rng() >> rnd(0, 63);
}

static uint32_t pick_u32(void) {
    return rnd(0, 1) ? edge_u32[rnd(0, sizeof(edge_u32) / sizeof(edge_u32[0]) - 1u)] : (uint32_t)(rng() >> rnd(32, 63));
}

static void mutate(kdsp_op *op) {
    kdsp_tensor *t = pick_tensor(op);
    switch (rnd(0, 12)) {
    case 0: { /* flip random bits anywhere */
        uint8_t *b = (uint8_t *)op;
        b[rnd(0, sizeof(*op) - 1u)] ^= (uint8_t)(1u << rnd(0, 7));
        break;
    }
    case 1:
        t->ne[rnd(0, 3)] = pick_u32();
        break;
    case 2:
        t->ne[rnd(0, 3)] += rnd(1, 40); /* just past the buffer */
        break;
    case 3:
        t->nb[rnd(0, 3)] = pick_u64();
        break;
    case 4:
        t->offset = rnd(0, 1) ? pick_u64() : (t->buffer_id < n_bufs ? buf_sizes[t->buffer_id] - rnd(0, 64) : 0);
        break;
    case 5:
        t->buffer_id = rnd(0, 2) ? rnd(0, n_bufs) : pick_u32();
        break;
    case 6: /* output overlapping or aliasing an input */
        if (op->n_src > 0 && op->n_src <= KDSP_MAX_SRC) {
            const kdsp_tensor s = op->src[rnd(0, op->n_src - 1u)];
            if (rnd(0, 1)) {
                op->dst = s;
            } else {
                op->dst.buffer_id = s.buffer_id;
                op->dst.offset = s.offset + 2u * rnd(0, 8);
            }
        }
        break;
    case 7:
        if (rnd(0, 1)) {
            t->dtype = rnd(0, 7);
        } else {
            t->layout = rnd(0, 6);
        }
        break;
    case 8:
        op->n_src = rnd(0, 6);
        break;
    case 9:
        op->params.raw[rnd(0, 15)] = rnd(0, 1) ? pick_u32() : 0x7fc00000u; /* NaN scale/eps */
        break;
    case 10:
        op->opcode = rnd(0, KDSP_OP_COUNT + 2u);
        break;
    case 11: /* data the validator cannot see: a GET_ROWS index or a RoPE position out of range */
        if ((op->opcode == KDSP_OP_GET_ROWS || op->opcode == KDSP_OP_ROPE_NEOX) && op->src[1].buffer_id < n_bufs &&
            bufs[op->src[1].buffer_id] != NULL && buf_sizes[op->src[1].buffer_id] >= 4u &&
            op->src[1].offset <= buf_sizes[op->src[1].buffer_id] - 4u) {
            const int32_t bad[4] = {-1, 1 << 30, INT32_MIN, 40};
            memcpy((uint8_t *)bufs[op->src[1].buffer_id] + op->src[1].offset, &bad[rnd(0, 3)], 4);
        }
        break;
    default: /* a second id over the same memory: overlap across buffer ids */
        if (n_bufs < MAX_BUFS && op->dst.buffer_id < n_bufs) {
            const uint32_t id = n_bufs;
            if (kdsp_buffer_register(ctx, id, bufs[op->dst.buffer_id], buf_sizes[op->dst.buffer_id]) == KDSP_STATUS_OK) {
                bufs[id] = NULL; /* not owned */
                buf_sizes[id] = buf_sizes[op->dst.buffer_id];
                n_bufs++;
                op->src[0].buffer_id = id;
            }
        }
        break;
    }
}

static void run(const kdsp_op *op) {
    uint64_t scratch = 0;
    (void)kdsp_op_check(ctx, op, &scratch);
    kdsp_status_t st = 99;
    kdsp_execute(ctx, op, 1, 0, &st);
    hist[st < 7u ? st : 7u]++;
}

static void free_bufs_owned(void) {
    for (uint32_t i = 0; i < n_bufs; i++) {
        kdsp_buffer_unregister(ctx, i);
        free(bufs[i]); /* NULL for aliases */
    }
    n_bufs = 0;
}

static void api_misuse(void) {
    kdsp_ctx_config bad = {0, 4, 0};
    uint8_t mem[64];
    kdsp_ctx *c2 = NULL;
    if (kdsp_ctx_bytes(&bad) != 0 || kdsp_ctx_init(mem, sizeof(mem), NULL, &bad, &c2) == KDSP_STATUS_OK) {
        fprintf(stderr, "bad config accepted\n");
        n_errors++;
    }
    void *p = NULL;
    if (posix_memalign(&p, 128, 256) != 0) {
        exit(2);
    }
    if (kdsp_buffer_register(ctx, 0, (uint8_t *)p + 4, 128) == KDSP_STATUS_OK ||
        kdsp_buffer_register(ctx, MAX_BUFS + 5u, p, 128) == KDSP_STATUS_OK ||
        kdsp_buffer_register(ctx, 0, p, 0) == KDSP_STATUS_OK || kdsp_buffer_unregister(ctx, 3) == KDSP_STATUS_OK ||
        kdsp_execute(ctx, NULL, 3, 0, NULL) == KDSP_STATUS_OK || kdsp_execute(ctx, NULL, 0, 2, NULL) == KDSP_STATUS_OK) {
        fprintf(stderr, "API misuse accepted\n");
        n_errors++;
    }
    free(p);
}

static void random_batches(uint32_t rounds) {
    uint64_t words[64];
    kdsp_status_t st[8];
    for (uint32_t r = 0; r < rounds; r++) {
        for (uint32_t i = 0; i < 64u; i++) {
            words[i] = rng();
        }
        kdsp_batch_header *h = (kdsp_batch_header *)(void *)words;
        if (rnd(0, 1)) {
            h->magic = KDSP_BATCH_MAGIC;
        }
        if (rnd(0, 1)) {
            h->abi_version = KDSP_ABI_VERSION;
        }
        h->n_ops = rnd(0, 1) ? rnd(0, 2) : (uint32_t)rng();
        h->flags = rnd(0, 3);
        const uint64_t len = rnd(0, 1) ? 16u + 440u * h->n_ops : rnd(0, sizeof(words));
        kdsp_execute_batch(ctx, words, len > sizeof(words) ? sizeof(words) : len, st, 8);
        kdsp_execute_batch(ctx, (uint8_t *)words + 4, 16, NULL, 0);
    }
}

int main(int argc, char **argv) {
    rng_state = argc > 1 ? strtoull(argv[1], NULL, 10) : 1u;
    const uint32_t rounds = argc > 2 ? (uint32_t)strtoul(argv[2], NULL, 10) : 40u;
    kdsp_ctx_config cfg = {3, MAX_BUFS, 4u << 20};
    void *mem = NULL, *scratch = NULL;
    if (posix_memalign(&mem, 128, (size_t)kdsp_ctx_bytes(&cfg)) != 0 || posix_memalign(&scratch, 128, (size_t)cfg.scratch_bytes) != 0 ||
        kdsp_ctx_init(mem, kdsp_ctx_bytes(&cfg), scratch, &cfg, &ctx) != KDSP_STATUS_OK) {
        fprintf(stderr, "ctx init failed\n");
        return 2;
    }
    uint32_t valid = 0, mutated = 0;
    for (uint32_t r = 0; r < rounds; r++) {
        for (uint32_t code = 1; code < KDSP_OP_COUNT; code++) {
            const kdsp_op op = gen_valid(code);
            kdsp_status_t st = 99;
            kdsp_execute(ctx, &op, 1, 0, &st);
            valid++;
            if (st != KDSP_STATUS_OK) {
                fprintf(stderr, "valid op %u (round %u) returned %u\n", code, r, st);
                n_errors++;
            }
            for (uint32_t m = 0; m < 12u; m++) {
                kdsp_op bad = op;
                const uint32_t n_mut = rnd(1, 3);
                for (uint32_t j = 0; j < n_mut; j++) {
                    mutate(&bad);
                }
                run(&bad);
                mutated++;
            }
            kdsp_op junk;
            uint8_t *jb = (uint8_t *)&junk;
            for (uint32_t i = 0; i < sizeof(junk); i++) {
                jb[i] = (uint8_t)(rng() >> 56);
            }
            junk.opcode = rnd(0, KDSP_OP_COUNT);
            junk.n_src %= 6u;
            run(&junk);
            free_bufs_owned();
        }
    }
    random_batches(rounds * 10u);
    api_misuse();
    kdsp_ctx_release(ctx);
    free(scratch);
    free(mem);
    printf("fuzz: %u valid ops OK, %u mutated + %u random ops; statuses OK=%llu UNSUPPORTED=%llu INVALID=%llu "
           "OUT_OF_BUDGET=%llu other=%llu; errors=%u\n",
           valid, mutated, rounds * (KDSP_OP_COUNT - 1u), (unsigned long long)hist[0], (unsigned long long)hist[1],
           (unsigned long long)hist[2], (unsigned long long)hist[3],
           (unsigned long long)(hist[4] + hist[5] + hist[6] + hist[7]), n_errors);
    return n_errors == 0 ? 0 : 1;
}
