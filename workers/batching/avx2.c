/* The decode step's hot path on an AVX2 CPU: 4- and 8-bit matrix-vector products over the model's own
 * GGUF blocks, and one whole Llama decoder layer in one call. Built by workers/batching/avx2.py with
 *     gcc -O3 -mavx2 -mfma -mf16c -fopenmp -shared -fPIC
 * and called through ctypes. The OpenMP runtime is the one torch already loaded (same soname, one pool).
 *
 * Blocks (32 weights each, the GGUF layouts):
 *     Q4_1   fp16 d, fp16 m, 16 bytes: byte i holds code i (low nibble) and code i + 16 (high);  w = q * d + m
 *     Q8_0   fp16 d, 32 int8 codes;                                                             w = q * d
 * Activations are quantized per 32-block to 16-bit codes, x = d q (d = max|x| / 32767), so a block's dot
 * product is integer, sum(q_w q) in int32 (vpmaddwd), times d_w d (+ m_w s for Q4_1, s = d sum(q)): the
 * weights exactly, the activations to ~16 bits (llama.cpp's Q8_1 keeps 8).
 *
 * Batch invariance: output j of row r is computed by one thread, in one fixed order, from row r alone,
 * whatever the number of rows or threads. */

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "simd.h"

#define QK 32

typedef struct { uint16_t d, m; uint8_t qs[QK / 2]; } block_q4_1;  /* 20 bytes */
typedef struct { uint16_t d; int8_t qs[QK]; } block_q8_0;        /* 34 bytes */
typedef struct { float d, s; int16_t q[QK]; } block_q16;  /* an activation block: 72 bytes */

enum { Q4_1 = 0, Q8_0 = 1 };

static inline size_t block_bytes(int format) { return format == Q4_1 ? sizeof(block_q4_1) : sizeof(block_q8_0); }

static inline int imax(int a, int b) { return a > b ? a : b; }

static inline float h2f(uint16_t h) { return _cvtsh_ss(h); }

/* ---- activations -------------------------------------------------------------------------------- */

/* x [k] -> k / 32 activation blocks: q = round(x / d), d = max|x| / 32767, s = d * sum(q) */
static void quantize_row(const float *x, block_q16 *y, int k) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const int round = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    for (int i = 0; i < k / QK; i++) {
        __m256 v[4];
        __m256 amax = _mm256_setzero_ps();
        for (int j = 0; j < 4; j++) {
            v[j] = _mm256_loadu_ps(x + i * QK + 8 * j);
            amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[j]));
        }
        float d = hmax(amax) / 32767.0f;
        __m256 id = _mm256_set1_ps(d > 0.0f ? 1.0f / d : 0.0f);
        __m256i q[4];
        __m256 total = _mm256_setzero_ps();
        for (int j = 0; j < 4; j++) {
            __m256 r = _mm256_round_ps(_mm256_mul_ps(v[j], id), round);
            r = _mm256_max_ps(_mm256_min_ps(r, _mm256_set1_ps(32767.0f)), _mm256_set1_ps(-32767.0f));
            total = _mm256_add_ps(total, r);
            q[j] = _mm256_cvtps_epi32(r);
        }
        /* packs works per 128-bit lane: (0-3, 8-11, 4-7, 12-15) -> restore the order */
        __m256i lo = _mm256_permute4x64_epi64(_mm256_packs_epi32(q[0], q[1]), 0xD8);
        __m256i hi = _mm256_permute4x64_epi64(_mm256_packs_epi32(q[2], q[3]), 0xD8);
        _mm256_storeu_si256((__m256i *)y[i].q, lo);
        _mm256_storeu_si256((__m256i *)(y[i].q + 16), hi);
        y[i].d = d;
        y[i].s = d * hsum(total);
    }
}

/* x [rows, k] -> xq [rows, k / 32] */
static void quantize_rows(const float *x, int rows, int k, block_q16 *xq) {
    for (int r = 0; r < rows; r++) quantize_row(x + (size_t)r * k, xq + (size_t)r * (k / QK), k);
}

/* ---- matrix-vector products ---------------------------------------------------------------------- */

/* 32 int16 weights (two halves) x a block's 16-bit codes -> 8 int32 partial sums, in fp32 (exact: < 2^24) */
static inline __m256 dot_i16(__m256i w0, __m256i w1, const int16_t *q) {
    __m256i a = _mm256_madd_epi16(w0, _mm256_loadu_si256((const __m256i *)q));
    __m256i b = _mm256_madd_epi16(w1, _mm256_loadu_si256((const __m256i *)(q + 16)));
    return _mm256_cvtepi32_ps(_mm256_add_epi32(a, b));
}

/* Row tiles: up to TILE activation rows against one weight row, each block's codes unpacked once for the
 * tile. Every row's arithmetic is the same sequence whatever the tile (R is a constant the compiler
 * unrolls), so a row's result has the same bits alone as in a batch. x: the tile's first row, `stride`
 * blocks apart; out: its first output, `out_stride` floats apart. */
#define TILE 8

static inline __attribute__((always_inline)) void tile_q4_1(
        const block_q4_1 *w, const block_q16 *x, size_t stride, int blocks, float *out, size_t out_stride,
        const int R) {
    const __m128i low = _mm_set1_epi8(0x0F);
    __m256 acc[TILE];
    float mins[TILE];
    for (int r = 0; r < R; r++) { acc[r] = _mm256_setzero_ps(); mins[r] = 0.0f; }
    for (int i = 0; i < blocks; i++) {
        __m128i bytes = _mm_loadu_si128((const __m128i *)w[i].qs);
        __m256i w0 = _mm256_cvtepu8_epi16(_mm_and_si128(bytes, low));                     /* codes 0..15 */
        __m256i w1 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(bytes, 4), low));  /* codes 16..31 */
        const float d = h2f(w[i].d), m = h2f(w[i].m);
        for (int r = 0; r < R; r++) {
            const block_q16 *b = x + r * stride + i;
            acc[r] = _mm256_fmadd_ps(dot_i16(w0, w1, b->q), _mm256_set1_ps(d * b->d), acc[r]);
            mins[r] += m * b->s;
        }
    }
    for (int r = 0; r < R; r++) out[r * out_stride] = hsum(acc[r]) + mins[r];
}

static inline __attribute__((always_inline)) void tile_q8_0(
        const block_q8_0 *w, const block_q16 *x, size_t stride, int blocks, float *out, size_t out_stride,
        const int R) {
    __m256 acc[TILE];
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int i = 0; i < blocks; i++) {
        __m256i w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)w[i].qs));
        __m256i w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(w[i].qs + 16)));
        const float d = h2f(w[i].d);
        for (int r = 0; r < R; r++) {
            const block_q16 *b = x + r * stride + i;
            acc[r] = _mm256_fmadd_ps(dot_i16(w0, w1, b->q), _mm256_set1_ps(d * b->d), acc[r]);
        }
    }
    for (int r = 0; r < R; r++) out[r * out_stride] = hsum(acc[r]);
}

static void tile(const void *w, int format, const block_q16 *x, size_t stride, int blocks, float *out,
                 size_t out_stride, int rows) {
#define TILE_CASE(R) case R: \
    if (format == Q4_1) tile_q4_1((const block_q4_1 *)w, x, stride, blocks, out, out_stride, R); \
    else tile_q8_0((const block_q8_0 *)w, x, stride, blocks, out, out_stride, R); \
    break;
    switch (rows) { TILE_CASE(1) TILE_CASE(2) TILE_CASE(3) TILE_CASE(4) TILE_CASE(5) TILE_CASE(6) TILE_CASE(7) TILE_CASE(8) }
#undef TILE_CASE
}

/* out[r * n + j] = W[j] . x[r] for r < rows: W [n, k] in `format` blocks, xq [rows, k / 32] */
static void matvec_q(const void *w, int format, int n, int k, const block_q16 *xq, int rows, float *out) {
    const int blocks = k / QK;
    const size_t bytes = block_bytes(format);
    #pragma omp parallel for schedule(static)
    for (int j = 0; j < n; j++) {
        const char *wj = (const char *)w + (size_t)j * blocks * bytes;
        for (int r = 0; r < rows; r += TILE)
            tile(wj, format, xq + (size_t)r * blocks, blocks, blocks, out + (size_t)r * n + j, n,
                 rows - r < TILE ? rows - r : TILE);
    }
}

/* x [rows, k] fp32 -> out [rows, n] fp32 */
void ragkv_matvec(const void *w, int format, int n, int k, const float *x, int rows, float *out) {
    block_q16 *xq = malloc(sizeof(block_q16) * (size_t)rows * (k / QK));
    quantize_rows(x, rows, k, xq);
    matvec_q(w, format, n, k, xq, rows, out);
    free(xq);
}

/* ---- one decoder layer --------------------------------------------------------------------------- */

typedef struct {
    int hidden, heads, kv_heads, head_dim, intermediate;
    float eps, scaling;
    const float *input_norm, *post_norm;  /* [hidden] */
    const void *mats[4];                  /* blocks of [q|k|v], o, [gate|up], down */
    int formats[4];                       /* Q4_1 or Q8_0, per matrix */
} Layer;

typedef struct {          /* one row's cache for this layer (fp32) and its new entry's slots */
    const float *keys, *values;  /* entry t of kv head h at [h * kv_stride + t * head_dim] */
    long long kv_stride;         /* 0 in the packed layout: one sequence of every head's entries */
    int tokens;                  /* entries, the new one included */
    const uint8_t *mask;         /* NULL, or [kv_heads, tokens] visible entries at [h * mask_stride + t] */
    long long mask_stride;
    float *key_slot, *value_slot;  /* the new entry, kv head h at [h * slot_stride] */
    long long slot_stride;
    const float *cos, *sin;      /* [head_dim]: RoPE at the row's position */
    long long layer_stride;      /* floats from one layer's keys, values and slots to the next's (every layer
                                    of the row's cache in one buffer), 0 when the pointers are this layer's */
} Row;

static void rms_norm(const float *x, const float *weight, float eps, int n, float *out) {
    __m256 acc = _mm256_setzero_ps();
    for (int i = 0; i < n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        acc = _mm256_fmadd_ps(v, v, acc);
    }
    float inv = 1.0f / sqrtf(hsum(acc) / n + eps);
    for (int i = 0; i < n; i++) out[i] = weight[i] * (x[i] * inv);
}

static void rope(float *x, const float *cos, const float *sin, int dim) {  /* rotate_half form */
    int half = dim / 2;
    for (int j = 0; j < half; j++) {
        float a = x[j], b = x[j + half];
        x[j] = a * cos[j] - b * sin[j];
        x[j + half] = b * cos[j + half] + a * sin[j + half];
    }
}

/* ---- attention of the newest token --------------------------------------------------------------
 * Split the way flash-decoding does: a row's entries in SPLIT-token parts, each part's softmax partial
 * (max, sum, weighted values) for the kv head's whole query group, then the parts merged in order. The
 * parts depend only on the row's own length, so the result does not depend on the batch or the threads;
 * a part's keys and values are read from memory once and stay in cache for the group's other heads. */

#define SPLIT 256

/* scores[j] = q . keys[j] for j < n (rows of `dim` floats, dim a multiple of 8), 8 entries at a time */
static void scores_of(const float *q, const float *keys, int n, int dim, float *scores) {
    int j = 0;
    for (; j + 8 <= n; j += 8) {
        __m256 a[8];
        for (int e = 0; e < 8; e++) a[e] = _mm256_setzero_ps();
        for (int i = 0; i < dim; i += 8) {
            const __m256 qv = _mm256_loadu_ps(q + i);
            for (int e = 0; e < 8; e++)
                a[e] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(keys + (size_t)(j + e) * dim + i), a[e]);
        }
        /* transpose-reduce: lane e of the result is entry j + e's sum */
        __m256 h0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
        __m256 h1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
        __m256 sum = _mm256_add_ps(_mm256_permute2f128_ps(h0, h1, 0x20), _mm256_permute2f128_ps(h0, h1, 0x31));
        _mm256_storeu_ps(scores + j, sum);
    }
    for (; j < n; j++) {
        __m256 acc = _mm256_setzero_ps();
        for (int i = 0; i < dim; i += 8)
            acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), _mm256_loadu_ps(keys + (size_t)j * dim + i), acc);
        scores[j] = hsum(acc);
    }
}

/* One part (entries t0..t1) of one kv head for its `group` query heads q [group, D] (scaled):
 * per head g, best[g] = max score, total[g] = sum of exp(score - best), acc [group, D] = sum of
 * exp(score - best) v. scores: scratch [SPLIT]. */
static void attend_part(const float *q, const Row *row, int kv_head, int group, int dim, int t0, int t1,
                        float *scores, float *best, float *total, float *acc) {
    const float *keys = row->keys + kv_head * row->kv_stride + (size_t)t0 * dim;
    const float *values = row->values + kv_head * row->kv_stride + (size_t)t0 * dim;
    const uint8_t *mask = row->mask ? row->mask + kv_head * row->mask_stride + t0 : NULL;
    const int n = t1 - t0;
    for (int g = 0; g < group; g++) {
        scores_of(q + g * dim, keys, n, dim, scores);
        float top = -INFINITY;
        for (int t = 0; t < n; t++) {
            if (mask && !mask[t]) scores[t] = -INFINITY;
            else if (scores[t] > top) top = scores[t];
        }
        float *out = acc + g * dim;
        best[g] = top;
        if (top == -INFINITY) {  /* every entry of this part masked */
            total[g] = 0.0f;
            for (int i = 0; i < dim; i++) out[i] = 0.0f;
            continue;
        }
        __m256 sum8 = _mm256_setzero_ps(), top8 = _mm256_set1_ps(top);
        int t = 0;
        for (; t + 8 <= n; t += 8) {
            __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(scores + t), top8));
            _mm256_storeu_ps(scores + t, e);
            sum8 = _mm256_add_ps(sum8, e);
        }
        float sum = hsum(sum8);
        for (; t < n; t++) { scores[t] = scores[t] == -INFINITY ? 0.0f : expf(scores[t] - top); sum += scores[t]; }
        total[g] = sum;
        for (int i0 = 0; i0 < dim; i0 += 64) {  /* 64 columns at a time, in registers */
            const int width = dim - i0 < 64 ? dim - i0 : 64;
            __m256 a[8];
            for (int i = 0; i < 8; i++) a[i] = _mm256_setzero_ps();
            for (t = 0; t < n; t++) {
                if (scores[t] == 0.0f) continue;  /* masked (or underflowed): adds nothing */
                const __m256 p = _mm256_set1_ps(scores[t]);
                const float *v = values + (size_t)t * dim + i0;
                if (width == 64) {
                    for (int i = 0; i < 8; i++) a[i] = _mm256_fmadd_ps(p, _mm256_loadu_ps(v + 8 * i), a[i]);
                } else {
                    for (int i = 0; i < width / 8; i++) a[i] = _mm256_fmadd_ps(p, _mm256_loadu_ps(v + 8 * i), a[i]);
                }
            }
            for (int i = 0; i < width / 8; i++) _mm256_storeu_ps(out + i0 + 8 * i, a[i]);
        }
    }
}

static int parts_of(const Row *row) { return (row->tokens + SPLIT - 1) / SPLIT; }

/* q [count, heads, D] (scaled) -> out [count, heads, D] */
static void attend(const Layer *L, const float *q, const Row *rows, int count, float *out) {
    const int heads = L->heads, kvh = L->kv_heads, group = heads / kvh, dim = L->head_dim;
    int *first = malloc(sizeof(int) * (count + 1));  /* first[r]: row r's first part, numbered over rows */
    first[0] = 0;
    for (int r = 0; r < count; r++) first[r + 1] = first[r] + parts_of(rows + r);
    const int parts = first[count];
    /* per (part, head of the row): best, total, acc[D] */
    float *best = malloc(sizeof(float) * (size_t)parts * heads), *total = malloc(sizeof(float) * (size_t)parts * heads);
    float *acc = malloc(sizeof(float) * (size_t)parts * heads * dim);
    #pragma omp parallel
    {
        float *scores = malloc(sizeof(float) * SPLIT);
        #pragma omp for schedule(static)
        for (int u = 0; u < parts * kvh; u++) {
            const int part = u / kvh, h = u % kvh;
            int r = 0;
            while (first[r + 1] <= part) r++;
            const int t0 = (part - first[r]) * SPLIT;
            const int t1 = t0 + SPLIT < rows[r].tokens ? t0 + SPLIT : rows[r].tokens;
            const size_t slot = (size_t)part * heads + h * group;
            attend_part(q + ((size_t)r * heads + h * group) * dim, rows + r, h, group, dim, t0, t1, scores,
                        best + slot, total + slot, acc + slot * dim);
        }
        free(scores);
        #pragma omp for schedule(static)
        for (int i = 0; i < count * heads; i++) {  /* merge row r's parts for head h, in order */
            const int r = i / heads, h = i % heads;
            float top = -INFINITY, sum = 0.0f;
            for (int part = first[r]; part < first[r + 1]; part++)
                if (best[(size_t)part * heads + h] > top) top = best[(size_t)part * heads + h];
            float *o = out + (size_t)i * dim;
            for (int d = 0; d < dim; d++) o[d] = 0.0f;
            for (int part = first[r]; part < first[r + 1]; part++) {
                const size_t slot = (size_t)part * heads + h;
                if (total[slot] == 0.0f) continue;
                const float scale = expf(best[slot] - top);
                sum += scale * total[slot];
                for (int d = 0; d < dim; d++) o[d] += scale * acc[slot * dim + d];
            }
            for (int d = 0; d < dim; d++) o[d] /= sum;
        }
    }
    free(first); free(best); free(total); free(acc);
}

/* out[i] = silu(gate[i]) * up[i] */
static void silu_mul(const float *gate, const float *up, int n, float *out) {
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 g = _mm256_loadu_ps(gate + i);
        __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
        __m256 s = _mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(s, _mm256_loadu_ps(up + i)));
    }
    for (; i < n; i++) out[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}

/* hidden [count, H] += attention and MLP of this layer; queries [count, heads, D] gets the rotated
 * (unscaled) queries. Same arithmetic order as workers/batching/layer.py's Llama form. */
void ragkv_decode_layer(const Layer *L, float *hidden, const Row *given, int count, int layer, float *queries) {
    Row *rows = malloc(sizeof(Row) * count);  /* the rows' pointers at this layer */
    for (int r = 0; r < count; r++) {
        const size_t offset = (size_t)layer * given[r].layer_stride;
        rows[r] = given[r];
        rows[r].keys += offset; rows[r].values += offset;
        rows[r].key_slot += offset; rows[r].value_slot += offset;
    }
    const int H = L->hidden, heads = L->heads, kvh = L->kv_heads, D = L->head_dim, I = L->intermediate;
    const int width = (heads + 2 * kvh) * D, inputs = imax(imax(H, I), heads * D);  /* widest input */
    float *normed = malloc(sizeof(float) * (size_t)count * H);
    float *qkv = malloc(sizeof(float) * (size_t)count * width);
    float *scaled = malloc(sizeof(float) * (size_t)count * heads * D);
    float *attn = malloc(sizeof(float) * (size_t)count * heads * D);
    float *out = malloc(sizeof(float) * (size_t)count * imax(H, 2 * I));
    float *acted = malloc(sizeof(float) * (size_t)count * I);
    block_q16 *xq = malloc(sizeof(block_q16) * (size_t)count * (inputs / QK));

    for (int r = 0; r < count; r++)
        rms_norm(hidden + (size_t)r * H, L->input_norm, L->eps, H, normed + (size_t)r * H);
    quantize_rows(normed, count, H, xq);
    matvec_q(L->mats[0], L->formats[0], width, H, xq, count, qkv);
    for (int r = 0; r < count; r++) {
        const Row *row = rows + r;
        float *q = qkv + (size_t)r * width, *k = q + heads * D, *v = k + kvh * D;
        for (int h = 0; h < heads + kvh; h++) rope(q + h * D, row->cos, row->sin, D);  /* q and k */
        for (int h = 0; h < kvh; h++) {
            memcpy(row->key_slot + h * row->slot_stride, k + h * D, sizeof(float) * D);
            memcpy(row->value_slot + h * row->slot_stride, v + h * D, sizeof(float) * D);
        }
        memcpy(queries + (size_t)r * heads * D, q, sizeof(float) * heads * D);
        for (int i = 0; i < heads * D; i++) scaled[(size_t)r * heads * D + i] = q[i] * L->scaling;
    }
    attend(L, scaled, rows, count, attn);
    quantize_rows(attn, count, heads * D, xq);
    matvec_q(L->mats[1], L->formats[1], H, heads * D, xq, count, out);
    for (size_t i = 0; i < (size_t)count * H; i++) hidden[i] += out[i];

    for (int r = 0; r < count; r++)
        rms_norm(hidden + (size_t)r * H, L->post_norm, L->eps, H, normed + (size_t)r * H);
    quantize_rows(normed, count, H, xq);
    matvec_q(L->mats[2], L->formats[2], 2 * I, H, xq, count, out);
    for (int r = 0; r < count; r++) {
        const float *gate = out + (size_t)r * 2 * I, *up = gate + I;
        silu_mul(gate, up, I, acted + (size_t)r * I);
    }
    quantize_rows(acted, count, I, xq);
    matvec_q(L->mats[3], L->formats[3], H, I, xq, count, out);
    for (size_t i = 0; i < (size_t)count * H; i++) hidden[i] += out[i];

    free(normed); free(qkv); free(scaled); free(attn); free(out); free(acted); free(xq); free(rows);
}

/* ---- packing: a fp32 matrix back into the GGUF blocks it was read from -----------------------------
 * A group of 32 is taken only when it is exactly such a block (checked per weight in fp32, the same
 * arithmetic as linear.q4_groups / q8_groups); returns 1 when every group of every row is, else 0. */

static uint16_t f2h(float x) { return _cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT); }

static int pack_q4_1_row(const float *w, int k, block_q4_1 *out) {
    for (int i = 0; i < k / QK; i++) {
        const float *g = w + i * QK;
        float low = g[0], high = g[0];
        for (int j = 1; j < QK; j++) { low = g[j] < low ? g[j] : low; high = g[j] > high ? g[j] : high; }
        const float d = h2f(f2h((high - low) / 15.0f));
        if (h2f(f2h(low)) != low) return 0;  /* GGUF keeps m in fp16 */
        const float step = d > 0.0f ? d : 1.0f;
        uint8_t codes[QK];
        for (int j = 0; j < QK; j++) {
            float q = nearbyintf((g[j] - low) / step);
            q = q < 0.0f ? 0.0f : (q > 15.0f ? 15.0f : q);
            if (q * d + low != g[j]) return 0;
            codes[j] = (uint8_t)q;
        }
        out[i].d = f2h(d);
        out[i].m = f2h(low);
        for (int j = 0; j < QK / 2; j++) out[i].qs[j] = codes[j] | (uint8_t)(codes[j + QK / 2] << 4);
    }
    return 1;
}

static int pack_q8_0_row(const float *w, int k, block_q8_0 *out) {
    for (int i = 0; i < k / QK; i++) {
        const float *g = w + i * QK;
        float top = 0.0f;
        for (int j = 0; j < QK; j++) { float a = g[j] < 0.0f ? -g[j] : g[j]; top = a > top ? a : top; }
        const float d = h2f(f2h(top / 127.0f));
        const float step = d > 0.0f ? d : 1.0f;
        for (int j = 0; j < QK; j++) {
            float q = nearbyintf(g[j] / step);
            q = q < -127.0f ? -127.0f : (q > 127.0f ? 127.0f : q);
            if (q * d != g[j]) return 0;
            out[i].qs[j] = (int8_t)q;
        }
        out[i].d = f2h(d);
    }
    return 1;
}

#define PROBE_ROWS 64  /* rows tried first: a matrix of another format fails fast */

static int pack_row(const float *w, int format, int k, void *out) {
    return format == Q4_1 ? pack_q4_1_row(w, k, (block_q4_1 *)out) : pack_q8_0_row(w, k, (block_q8_0 *)out);
}

/* w [n, k] fp32 -> out: n * k / 32 blocks of `format`; 1 when exact, else 0 (out partly written) */
int ragkv_pack(const float *w, int format, int n, int k, void *out) {
    const size_t row_bytes = (size_t)k / QK * block_bytes(format);
    int ok = 1;
    for (int j = 0; j < n && j < PROBE_ROWS && ok; j++)
        ok = pack_row(w + (size_t)j * k, format, k, (char *)out + j * row_bytes);
    if (!ok) return 0;
    #pragma omp parallel for schedule(static) reduction(&&:ok)
    for (int j = PROBE_ROWS; j < n; j++)
        ok = ok && pack_row(w + (size_t)j * k, format, k, (char *)out + j * row_bytes);
    return ok;
}
