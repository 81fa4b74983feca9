/* Prefill attention on an AVX2 CPU: query rows over their own ranges of cached entries, for blend's
 * recomputed rows (scattered over the prompt) as for a whole prompt (every row, in order). Built by
 * workers/native.py (gcc -O3 -mavx2 -mfma -mf16c -fopenmp), called from workers/row_attention.py.
 *
 *     q            [heads, seq, dim] fp32, contiguous
 *     keys, values kv head h's entry t at h * head_stride + t * dim, fp32
 *     first, end   [seq] int32: row i sees entries [first[i], end[i]) of its kv head, at least one
 *     out          [seq, heads * dim] fp32
 *
 * One work item is one kv head and a tile of rows. The tile's query vectors (its rows x that kv head's
 * query heads, padded to a multiple of 6) are scored 6 vectors x 16 entries at a time against the keys
 * transposed once per call (8 entries' values of one dimension side by side), so one key load serves 6
 * vectors and no horizontal sum is needed. The softmax runs online over CHUNK-entry chunks cut at fixed
 * positions (multiples of CHUNK), and the weighted values are summed 3 vectors x 32 columns at a time, so
 * one value load serves 3 vectors. Every row computes only up to the end of its own range (a tile's last
 * chunk is cut at its longest row), never the whole cache under a mask.
 *
 * Row invariance: a row's arithmetic depends on its own query, its range and the cache only, in one fixed
 * order, whatever rows share its tile and however many threads run (entries outside a row's range get a
 * weight of exactly 0). So blend's recomputed rows attend bit for bit as the same rows of a full prefill
 * over the same cache would. dim: a multiple of 8.
 *
 * ragkv_attend_rows_bf16 runs the same tiles, chunks and online softmax in bf16 arithmetic on a CPU with
 * AVX512-BF16 (the bf16 prefill kernel's attention): queries (scaled), keys, values and the softmax weights
 * rounded to bf16 (to nearest, ties to even), each pair of products summed into fp32 by vdpbf16ps, 32
 * multiply-adds an instruction where AVX2's FMA does 8. Keys are laid out 16 entries x one pair of dimensions
 * a vector, values one pair of entries x 16 columns. Row invariance holds as above. dim: a multiple of 16. */

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "simd.h"

#define CHUNK 64   /* entries per online-softmax step */
#define TILE 12    /* query vectors per tile (rows x query heads of one kv head), when a kv head has <= 12 */

/* keys [n, dim] -> kt [ceil(n / 8), dim, 8]: 8 entries' values of one dimension side by side (zeros past n);
 * 8 x 8 floats at a time through registers */
static void transpose_keys(const float *keys, int n, int dim, float *kt) {
    for (int b = 0; b * 8 < n; b++) {
        float *dst = kt + (size_t)b * dim * 8;
        const int m = n - b * 8 < 8 ? n - b * 8 : 8;
        const float *src = keys + (size_t)b * 8 * dim;
        for (int d = 0; d < dim; d += 8) {
            __m256 r[8];
            for (int e = 0; e < 8; e++) r[e] = e < m ? _mm256_loadu_ps(src + (size_t)e * dim + d) : _mm256_setzero_ps();
            const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
            const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
            const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
            const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
            const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
            const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
            const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
            const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
            float *o = dst + (size_t)d * 8;  /* row d + i of the output: entry e's value of dimension d + i */
            _mm256_storeu_ps(o + 0 * 8, _mm256_permute2f128_ps(u0, u4, 0x20));
            _mm256_storeu_ps(o + 1 * 8, _mm256_permute2f128_ps(u1, u5, 0x20));
            _mm256_storeu_ps(o + 2 * 8, _mm256_permute2f128_ps(u2, u6, 0x20));
            _mm256_storeu_ps(o + 3 * 8, _mm256_permute2f128_ps(u3, u7, 0x20));
            _mm256_storeu_ps(o + 4 * 8, _mm256_permute2f128_ps(u0, u4, 0x31));
            _mm256_storeu_ps(o + 5 * 8, _mm256_permute2f128_ps(u1, u5, 0x31));
            _mm256_storeu_ps(o + 6 * 8, _mm256_permute2f128_ps(u2, u6, 0x31));
            _mm256_storeu_ps(o + 7 * 8, _mm256_permute2f128_ps(u3, u7, 0x31));
        }
    }
}

/* s[v][j] = qs[v] . entry (8 b0 + j), for the 8-entry blocks [b0, b1) of kt and the 6 vectors qs[0..5] */
static void scores6(const float *qs, const float *kt, int b0, int b1, int dim, float *s, int stride) {
    int b = b0;
    for (; b + 2 <= b1; b += 2) {  /* 16 entries: 12 accumulators */
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0;
        __m256 c0 = a0, c1 = a0, c2 = a0, c3 = a0, c4 = a0, c5 = a0;
        const float *k = kt + (size_t)b * dim * 8, *k2 = k + dim * 8;
        for (int d = 0; d < dim; d++) {
            const __m256 x = _mm256_loadu_ps(k + d * 8), y = _mm256_loadu_ps(k2 + d * 8);
            __m256 w;
            w = _mm256_broadcast_ss(qs + 0 * dim + d); a0 = _mm256_fmadd_ps(w, x, a0); c0 = _mm256_fmadd_ps(w, y, c0);
            w = _mm256_broadcast_ss(qs + 1 * dim + d); a1 = _mm256_fmadd_ps(w, x, a1); c1 = _mm256_fmadd_ps(w, y, c1);
            w = _mm256_broadcast_ss(qs + 2 * dim + d); a2 = _mm256_fmadd_ps(w, x, a2); c2 = _mm256_fmadd_ps(w, y, c2);
            w = _mm256_broadcast_ss(qs + 3 * dim + d); a3 = _mm256_fmadd_ps(w, x, a3); c3 = _mm256_fmadd_ps(w, y, c3);
            w = _mm256_broadcast_ss(qs + 4 * dim + d); a4 = _mm256_fmadd_ps(w, x, a4); c4 = _mm256_fmadd_ps(w, y, c4);
            w = _mm256_broadcast_ss(qs + 5 * dim + d); a5 = _mm256_fmadd_ps(w, x, a5); c5 = _mm256_fmadd_ps(w, y, c5);
        }
        float *o = s + (b - b0) * 8;
        _mm256_storeu_ps(o + 0 * stride, a0); _mm256_storeu_ps(o + 0 * stride + 8, c0);
        _mm256_storeu_ps(o + 1 * stride, a1); _mm256_storeu_ps(o + 1 * stride + 8, c1);
        _mm256_storeu_ps(o + 2 * stride, a2); _mm256_storeu_ps(o + 2 * stride + 8, c2);
        _mm256_storeu_ps(o + 3 * stride, a3); _mm256_storeu_ps(o + 3 * stride + 8, c3);
        _mm256_storeu_ps(o + 4 * stride, a4); _mm256_storeu_ps(o + 4 * stride + 8, c4);
        _mm256_storeu_ps(o + 5 * stride, a5); _mm256_storeu_ps(o + 5 * stride + 8, c5);
    }
    for (; b < b1; b++) {  /* a last 8 entries */
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0;
        const float *k = kt + (size_t)b * dim * 8;
        for (int d = 0; d < dim; d++) {
            const __m256 x = _mm256_loadu_ps(k + d * 8);
            a0 = _mm256_fmadd_ps(_mm256_broadcast_ss(qs + 0 * dim + d), x, a0);
            a1 = _mm256_fmadd_ps(_mm256_broadcast_ss(qs + 1 * dim + d), x, a1);
            a2 = _mm256_fmadd_ps(_mm256_broadcast_ss(qs + 2 * dim + d), x, a2);
            a3 = _mm256_fmadd_ps(_mm256_broadcast_ss(qs + 3 * dim + d), x, a3);
            a4 = _mm256_fmadd_ps(_mm256_broadcast_ss(qs + 4 * dim + d), x, a4);
            a5 = _mm256_fmadd_ps(_mm256_broadcast_ss(qs + 5 * dim + d), x, a5);
        }
        float *o = s + (b - b0) * 8;
        _mm256_storeu_ps(o + 0 * stride, a0); _mm256_storeu_ps(o + 1 * stride, a1);
        _mm256_storeu_ps(o + 2 * stride, a2); _mm256_storeu_ps(o + 3 * stride, a3);
        _mm256_storeu_ps(o + 4 * stride, a4); _mm256_storeu_ps(o + 5 * stride, a5);
    }
}

/* acc[v][col .. col + 32) += sum_t p[v][t] values[t][col ..] for the 3 vectors v of p and acc. The chunk's sum
 * starts from zero and is added to acc once (blocked summation: a row's rounding error grows with the chunk,
 * not with the whole range) */
static void weighted3x32(const float *p, int pstride, const float *values, int n, int dim, int col, float *acc) {
    float *o0 = acc + col, *o1 = acc + dim + col, *o2 = acc + 2 * dim + col;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    __m256 c0 = a0, c1 = a0, c2 = a0, c3 = a0;
    for (int t = 0; t < n; t++) {
        const float *v = values + (size_t)t * dim + col;
        const __m256 v0 = _mm256_loadu_ps(v), v1 = _mm256_loadu_ps(v + 8), v2 = _mm256_loadu_ps(v + 16),
                     v3 = _mm256_loadu_ps(v + 24);
        __m256 w = _mm256_broadcast_ss(p + t);
        a0 = _mm256_fmadd_ps(w, v0, a0); a1 = _mm256_fmadd_ps(w, v1, a1);
        a2 = _mm256_fmadd_ps(w, v2, a2); a3 = _mm256_fmadd_ps(w, v3, a3);
        w = _mm256_broadcast_ss(p + pstride + t);
        b0 = _mm256_fmadd_ps(w, v0, b0); b1 = _mm256_fmadd_ps(w, v1, b1);
        b2 = _mm256_fmadd_ps(w, v2, b2); b3 = _mm256_fmadd_ps(w, v3, b3);
        w = _mm256_broadcast_ss(p + 2 * pstride + t);
        c0 = _mm256_fmadd_ps(w, v0, c0); c1 = _mm256_fmadd_ps(w, v1, c1);
        c2 = _mm256_fmadd_ps(w, v2, c2); c3 = _mm256_fmadd_ps(w, v3, c3);
    }
#define ADD(o, x) _mm256_storeu_ps(o, _mm256_add_ps(_mm256_loadu_ps(o), x))
    ADD(o0, a0); ADD(o0 + 8, a1); ADD(o0 + 16, a2); ADD(o0 + 24, a3);
    ADD(o1, b0); ADD(o1 + 8, b1); ADD(o1 + 16, b2); ADD(o1 + 24, b3);
    ADD(o2, c0); ADD(o2 + 8, c1); ADD(o2 + 16, c2); ADD(o2 + 24, c3);
#undef ADD
}

/* the same for 8 columns (a dim that is not a multiple of 32) */
static void weighted3x8(const float *p, int pstride, const float *values, int n, int dim, int col, float *acc) {
    __m256 a = _mm256_setzero_ps(), b = a, c = a;
    for (int t = 0; t < n; t++) {
        const __m256 v = _mm256_loadu_ps(values + (size_t)t * dim + col);
        a = _mm256_fmadd_ps(_mm256_broadcast_ss(p + t), v, a);
        b = _mm256_fmadd_ps(_mm256_broadcast_ss(p + pstride + t), v, b);
        c = _mm256_fmadd_ps(_mm256_broadcast_ss(p + 2 * pstride + t), v, c);
    }
    _mm256_storeu_ps(acc + col, _mm256_add_ps(_mm256_loadu_ps(acc + col), a));
    _mm256_storeu_ps(acc + dim + col, _mm256_add_ps(_mm256_loadu_ps(acc + dim + col), b));
    _mm256_storeu_ps(acc + 2 * dim + col, _mm256_add_ps(_mm256_loadu_ps(acc + 2 * dim + col), c));
}

/* One vector's scores s[0, width) over a chunk starting at c0 -> its weights (0 outside [a, b)), the running
 * max `best` and sum `total` updated and its accumulator rescaled when the max grows (online softmax). */
static void softmax_step(float *s, int width, int a, int b, float *best, float *total, float *acc, int dim) {
    float top = s[a];
    int t = a + 1;
    if (b - t >= 8) {
        __m256 top8 = _mm256_loadu_ps(s + t);
        for (t += 8; t + 8 <= b; t += 8) top8 = _mm256_max_ps(top8, _mm256_loadu_ps(s + t));
        top = fmaxf(top, hmax(top8));
    }
    for (; t < b; t++) if (s[t] > top) top = s[t];
    if (top > *best) {
        const float alpha = *best == -INFINITY ? 0.0f : expf(*best - top);
        *total *= alpha;
        const __m256 al = _mm256_set1_ps(alpha);
        for (int i = 0; i < dim; i += 8) _mm256_storeu_ps(acc + i, _mm256_mul_ps(al, _mm256_loadu_ps(acc + i)));
        *best = top;
    }
    for (int t = 0; t < a; t++) s[t] = 0.0f;
    for (int t = b; t < width; t++) s[t] = 0.0f;
    const __m256 top8 = _mm256_set1_ps(*best);
    __m256 sum8 = _mm256_setzero_ps();
    for (t = a; t + 8 <= b; t += 8) {
        const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + t), top8));
        _mm256_storeu_ps(s + t, e);
        sum8 = _mm256_add_ps(sum8, e);
    }
    float sum = hsum(sum8);
    for (; t < b; t++) { s[t] = expf(s[t] - *best); sum += s[t]; }
    *total += sum;
}

static void softmax_step_bf16(float *s, int width, int a, int b, float *best, float *total, float *acc, int dim,
                              uint16_t *weights);

/* ---- the tile loop's shared steps ------------------------------------------------------------------ */

/* How a call's rows are cut into work items: one kv head and a tile of `per` rows (its rows x the kv head's
 * query heads: `slots` vectors, padded to a multiple of 6); `span`: the entries any row sees */
typedef struct { int group, per, tiles, slots, span; } Tiling;

static Tiling tiling(int seq, int heads, int kv_heads, const int *end) {
    Tiling t = {heads / kv_heads, 0, 0, 0, 0};
    t.per = t.group < TILE ? TILE / t.group : 1;
    t.tiles = (seq + t.per - 1) / t.per;
    t.slots = (t.per * t.group + 5) / 6 * 6;
    for (int r = 0; r < seq; r++) if (end[r] > t.span) t.span = end[r];
    return t;
}

/* Work item u: kv head h, rows [r0, r1) (nv vectors), the entries they see between them [lo, hi); the longest
 * rows first */
typedef struct { int h, r0, r1, nv, lo, hi; } Tile;

static Tile tile_of(const Tiling *t, int u, int kv_heads, int seq, const int *first, const int *end) {
    Tile w;
    w.h = u % kv_heads;
    w.r0 = (t->tiles - 1 - u / kv_heads) * t->per;
    w.r1 = w.r0 + t->per < seq ? w.r0 + t->per : seq;
    w.nv = (w.r1 - w.r0) * t->group;
    w.lo = first[w.r0], w.hi = end[w.r0];
    for (int r = w.r0; r < w.r1; r++) { if (first[r] < w.lo) w.lo = first[r]; if (end[r] > w.hi) w.hi = end[r]; }
    return w;
}

/* A thread's online-softmax state for a tile's `slots` vectors: accumulators [slots, dim], a chunk's scores
 * [slots, CHUNK], the running max and sum */
typedef struct { float *acc, *sc, *best, *total; } Online;

static Online online_new(int slots, int dim) {
    float *mem = malloc(sizeof(float) * (size_t)slots * (dim + CHUNK + 2));
    return (Online){mem, mem + (size_t)slots * dim, mem + (size_t)slots * (dim + CHUNK),
                    mem + (size_t)slots * (dim + CHUNK + 1)};
}

static void online_reset(const Online *o, int slots, int dim) {
    memset(o->acc, 0, sizeof(float) * (size_t)slots * dim);
    for (int v = 0; v < slots; v++) { o->best[v] = -INFINITY; o->total[v] = 0.0f; }
}

/* Every vector's scores over the chunk [c0, c1) -> weights (softmax_step; zeros where its row sees nothing
 * there). weights: NULL, or bf16 [slots, CHUNK] */
static void chunk_softmax(float *sc, uint16_t *weights, int slots, int nv, int group, int r0, const int *first,
                          const int *end, int c0, int c1, float *best, float *total, float *acc, int dim) {
    const int width = c1 - c0;
    for (int v = 0; v < slots; v++) {
        const int r = r0 + v / group;
        const int a = v < nv && first[r] > c0 ? first[r] - c0 : 0;
        const int b = v >= nv ? 0 : (end[r] < c1 ? end[r] : c1) - c0;
        uint16_t *w = weights ? weights + v * CHUNK : NULL;
        if (a < b && w) softmax_step_bf16(sc + v * CHUNK, width, a, b, best + v, total + v, acc + v * dim, dim, w);
        else if (a < b) softmax_step(sc + v * CHUNK, width, a, b, best + v, total + v, acc + v * dim, dim);
        else {  /* nothing seen here */
            memset(sc + v * CHUNK, 0, sizeof(float) * width);
            if (w) memset(w, 0, sizeof(uint16_t) * (width + (width & 1)));
        }
    }
}

/* Vector v of a tile: row r0 + v / group, query head h * group + v % group; its output row divided by its
 * weights' sum */
static void tile_out(const float *acc, const float *total, int nv, int group, int r0, int h, int heads, int dim,
                     float *out) {
    for (int v = 0; v < nv; v++) {
        float *o = out + ((size_t)(r0 + v / group) * heads + h * group + v % group) * dim;
        const float inv = total[v] > 0.0f ? 1.0f / total[v] : 0.0f;
        for (int i = 0; i < dim; i++) o[i] = acc[v * dim + i] * inv;
    }
}

static const float *query_of(const float *q, int v, int h, int group, int seq, int r0, int dim) {
    return q + ((size_t)(h * group + v % group) * seq + r0 + v / group) * dim;
}

void ragkv_attend_rows(const float *q, int seq, int heads, const float *keys, const float *values, int kv_heads,
                       long head_stride, int dim, const int *first, const int *end, float scale, float *out) {
    const Tiling tl = tiling(seq, heads, kv_heads, end);
    const int group = tl.group, slots = tl.slots, span = tl.span;
    const int kblocks = (span + 7) / 8;
    float *kt = malloc(sizeof(float) * (size_t)kv_heads * kblocks * dim * 8);
    #pragma omp parallel
    {
        #pragma omp for schedule(static)
        for (int u = 0; u < kv_heads * kblocks; u++) {
            const int h = u / kblocks, b = u % kblocks;
            transpose_keys(keys + (size_t)h * head_stride + (size_t)b * 8 * dim, span - b * 8 < 8 ? span - b * 8 : 8,
                           dim, kt + ((size_t)h * kblocks + b) * dim * 8);
        }
        float *qs = malloc(sizeof(float) * (size_t)slots * dim);
        const Online st = online_new(slots, dim);
        float *acc = st.acc, *sc = st.sc, *best = st.best, *total = st.total;
        #pragma omp for schedule(dynamic, 1)
        for (int u = 0; u < tl.tiles * kv_heads; u++) {
            const Tile w = tile_of(&tl, u, kv_heads, seq, first, end);
            const int h = w.h, r0 = w.r0, nv = w.nv, lo = w.lo, hi = w.hi;
            online_reset(&st, slots, dim);
            memset(qs, 0, sizeof(float) * (size_t)slots * dim);
            for (int v = 0; v < nv; v++) {
                const float *src = query_of(q, v, h, group, seq, r0, dim);
                for (int i = 0; i < dim; i++) qs[v * dim + i] = src[i] * scale;
            }
            const float *V = values + (size_t)h * head_stride, *K = kt + (size_t)h * kblocks * dim * 8;
            for (int c0 = lo / CHUNK * CHUNK; c0 < hi; c0 += CHUNK) {
                const int c1 = c0 + CHUNK < hi ? c0 + CHUNK : hi, width = c1 - c0;
                for (int v = 0; v < slots; v += 6)
                    scores6(qs + v * dim, K, c0 / 8, (c1 + 7) / 8, dim, sc + v * CHUNK, CHUNK);
                chunk_softmax(sc, NULL, slots, nv, group, r0, first, end, c0, c1, best, total, acc, dim);
                for (int v = 0; v < nv; v += 3) {
                    int col = 0;
                    for (; col + 32 <= dim; col += 32)
                        weighted3x32(sc + v * CHUNK, CHUNK, V + (size_t)c0 * dim, width, dim, col, acc + v * dim);
                    for (; col < dim; col += 8)
                        weighted3x8(sc + v * CHUNK, CHUNK, V + (size_t)c0 * dim, width, dim, col, acc + v * dim);
                }
            }
            tile_out(acc, total, nv, group, r0, h, heads, dim, out);
        }
        free(qs); free(st.acc);
    }
    free(kt);
}

/* ---- bf16 arithmetic (AVX512-BF16) ------------------------------------------------------------------- */

#define BF16 __attribute__((target("avx512f,avx512bw,avx512bf16")))
#define KB 16  /* entries per key block: one vector of 16 entries x one pair of dimensions */
typedef uint32_t __attribute__((may_alias)) pair_t;  /* two bf16 read as one (weights are written as uint16) */

/* 16 lanes to bf16, rounded to nearest even (vcvtneps2bf16) */
static inline BF16 __m256i bf16_16(__m512 x) { return (__m256i)_mm512_cvtneps_pbh(x); }

static inline BF16 __m512 float_16(__m256i h) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* exp8 for 16 lanes, the same polynomial (in AVX-512 it costs half exp8's instructions a lane: two exp8 calls made
 * the bf16 kernel's softmax the slowest of its parts) */
static inline BF16 __m512 exp16(__m512 x) {
    const __mmask16 under = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_LT_OQ);
    x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.0f)), _mm512_set1_ps(-87.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    x = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    x = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), x);
    __m512 y = _mm512_set1_ps(1.9875691500e-4f);
    const float c[] = {1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};
    for (int i = 0; i < 5; i++) y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(c[i]));
    y = _mm512_fmadd_ps(y, _mm512_mul_ps(x, x), _mm512_add_ps(x, _mm512_set1_ps(1.0f)));
    const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_maskz_mul_ps(~under, y, _mm512_castsi512_ps(e));
}

/* softmax_step with the weights rounded to bf16 into weights[0, width rounded up to even) (zeros outside
 * [a, b)), `total` summing the rounded values; s is left as it was */
BF16 static void softmax_step_bf16(float *s, int width, int a, int b, float *best, float *total, float *acc, int dim,
                                   uint16_t *weights) {
    __m512 top16 = _mm512_set1_ps(-INFINITY);
    for (int t = a; t < b; t += 16) {
        const __mmask16 in = b - t >= 16 ? 0xFFFF : (__mmask16)((1u << (b - t)) - 1);
        top16 = _mm512_mask_max_ps(top16, in, top16, _mm512_maskz_loadu_ps(in, s + t));
    }
    const float top = _mm512_reduce_max_ps(top16);
    if (top > *best) {
        const float alpha = *best == -INFINITY ? 0.0f : expf(*best - top);
        *total *= alpha;
        const __m512 al = _mm512_set1_ps(alpha);
        for (int i = 0; i < dim; i += 16) _mm512_storeu_ps(acc + i, _mm512_mul_ps(al, _mm512_loadu_ps(acc + i)));
        *best = top;
    }
    const __m512 best16 = _mm512_set1_ps(*best);
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512 sum16 = _mm512_setzero_ps();
    for (int t = 0; t < width + (width & 1); t += 16) {  /* lanes t + i in [a, b) */
        const __m512i at = _mm512_add_epi32(lane, _mm512_set1_epi32(t));
        const __mmask16 in = _mm512_cmp_epi32_mask(at, _mm512_set1_epi32(a), _MM_CMPINT_NLT) &
                             _mm512_cmp_epi32_mask(at, _mm512_set1_epi32(b), _MM_CMPINT_LT);
        const __m512 e = _mm512_maskz_mov_ps(in, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(in, s + t), best16)));
        const __m256i h = bf16_16(e);
        _mm256_storeu_si256((__m256i *)(weights + t), h);
        sum16 = _mm512_add_ps(sum16, float_16(h));
    }
    *total += _mm512_reduce_add_ps(sum16);
}


/* 16 entries' keys (n of them; zeros past n) -> kt [dim / 2][16] pairs: kt[i * 16 + e] = entry e's dimensions
 * 2i and 2i + 1 in bf16 (the low half the first) */
BF16 static void keys_bf16(const float *keys, int n, int dim, uint32_t *kt) {
    uint16_t row[dim];
    for (int e = 0; e < KB; e++) {
        for (int i = 0; i < dim; i += 16)
            _mm256_storeu_si256((__m256i *)(row + i), e < n ? bf16_16(_mm512_loadu_ps(keys + (size_t)e * dim + i))
                                                            : _mm256_setzero_si256());
        for (int i = 0; i < dim / 2; i++) kt[i * KB + e] = (uint32_t)row[2 * i] | (uint32_t)row[2 * i + 1] << 16;
    }
}

/* Two entries' values (n = 1 or 2; the second zero when 1) -> vt [dim] pairs: column c of both in bf16 */
BF16 static void values_bf16(const float *values, int n, int dim, uint32_t *vt) {
    for (int c = 0; c < dim; c += 16) {
        const __m256i a = bf16_16(_mm512_loadu_ps(values + c));
        const __m256i b = n > 1 ? bf16_16(_mm512_loadu_ps(values + dim + c)) : _mm256_setzero_si256();
        const __m256i lo = _mm256_unpacklo_epi16(a, b), hi = _mm256_unpackhi_epi16(a, b);  /* columns 0-3, 8-11 | 4-7, 12-15 */
        _mm256_storeu_si256((__m256i *)(vt + c), _mm256_permute2x128_si256(lo, hi, 0x20));
        _mm256_storeu_si256((__m256i *)(vt + c + 8), _mm256_permute2x128_si256(lo, hi, 0x31));
    }
}

/* A query's dim values times scale -> dim / 2 bf16 pairs */
BF16 static void query_bf16(const float *q, float scale, int dim, uint32_t *qs) {
    for (int i = 0; i < dim; i += 16)
        _mm256_storeu_si256((__m256i *)((uint16_t *)qs + i), bf16_16(_mm512_mul_ps(_mm512_loadu_ps(q + i),
                                                                                     _mm512_set1_ps(scale))));
}

static inline BF16 __m512bh pair(uint32_t x) { return (__m512bh)_mm512_set1_epi32((int)x); }
static inline BF16 __m512bh load_bh(const uint32_t *p) { return (__m512bh)_mm512_loadu_si512(p); }

/* s[v][j] = qs[v] . entry (16 b0 + j) for the 16-entry blocks [b0, b1) of kt and the 6 vectors qs (bf16 pairs,
 * dim / 2 each) */
BF16 static void scores6_bf16(const uint32_t *qs, const uint32_t *kt, int b0, int b1, int half, float *s,
                              int stride) {
    int b = b0;
    for (; b + 2 <= b1; b += 2) {  /* 32 entries: 12 accumulators */
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0;
        __m512 c0 = a0, c1 = a0, c2 = a0, c3 = a0, c4 = a0, c5 = a0;
        const uint32_t *k = kt + (size_t)b * half * KB, *k2 = k + half * KB;
        for (int i = 0; i < half; i++) {
            const __m512bh x = load_bh(k + i * KB), y = load_bh(k2 + i * KB);
            __m512bh w;
            w = pair(qs[0 * half + i]); a0 = _mm512_dpbf16_ps(a0, x, w); c0 = _mm512_dpbf16_ps(c0, y, w);
            w = pair(qs[1 * half + i]); a1 = _mm512_dpbf16_ps(a1, x, w); c1 = _mm512_dpbf16_ps(c1, y, w);
            w = pair(qs[2 * half + i]); a2 = _mm512_dpbf16_ps(a2, x, w); c2 = _mm512_dpbf16_ps(c2, y, w);
            w = pair(qs[3 * half + i]); a3 = _mm512_dpbf16_ps(a3, x, w); c3 = _mm512_dpbf16_ps(c3, y, w);
            w = pair(qs[4 * half + i]); a4 = _mm512_dpbf16_ps(a4, x, w); c4 = _mm512_dpbf16_ps(c4, y, w);
            w = pair(qs[5 * half + i]); a5 = _mm512_dpbf16_ps(a5, x, w); c5 = _mm512_dpbf16_ps(c5, y, w);
        }
        float *o = s + (b - b0) * KB;
        _mm512_storeu_ps(o + 0 * stride, a0); _mm512_storeu_ps(o + 0 * stride + KB, c0);
        _mm512_storeu_ps(o + 1 * stride, a1); _mm512_storeu_ps(o + 1 * stride + KB, c1);
        _mm512_storeu_ps(o + 2 * stride, a2); _mm512_storeu_ps(o + 2 * stride + KB, c2);
        _mm512_storeu_ps(o + 3 * stride, a3); _mm512_storeu_ps(o + 3 * stride + KB, c3);
        _mm512_storeu_ps(o + 4 * stride, a4); _mm512_storeu_ps(o + 4 * stride + KB, c4);
        _mm512_storeu_ps(o + 5 * stride, a5); _mm512_storeu_ps(o + 5 * stride + KB, c5);
    }
    for (; b < b1; b++) {  /* a last 16 entries */
        __m512 a[6];
        for (int v = 0; v < 6; v++) a[v] = _mm512_setzero_ps();
        const uint32_t *k = kt + (size_t)b * half * KB;
        for (int i = 0; i < half; i++) {
            const __m512bh x = load_bh(k + i * KB);
            for (int v = 0; v < 6; v++) a[v] = _mm512_dpbf16_ps(a[v], x, pair(qs[v * half + i]));
        }
        for (int v = 0; v < 6; v++) _mm512_storeu_ps(s + v * stride + (b - b0) * KB, a[v]);
    }
}

/* acc[v][col .. col + 64) += sum_t p[v][t] values[t][col ..] for the 3 vectors v: p bf16 [3][pstride] read in
 * pairs of entries, vt the pairs of entries' values (values_bf16), `pairs` of them. The chunk's sum starts from
 * zero and is added to acc once, as weighted3x32's. */
BF16 static void weighted3x64_bf16(const uint16_t *p, int pstride, const uint32_t *vt, int pairs, int dim, int col,
                                   float *acc) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    __m512 c0 = a0, c1 = a0, c2 = a0, c3 = a0;
    const pair_t *p0 = (const pair_t *)p, *p1 = (const pair_t *)(p + pstride),
                 *p2 = (const pair_t *)(p + 2 * pstride);  /* pstride is even: pairs stay aligned */
    for (int t = 0; t < pairs; t++) {
        const uint32_t *v = vt + (size_t)t * dim + col;
        const __m512bh x0 = load_bh(v), x1 = load_bh(v + 16), x2 = load_bh(v + 32), x3 = load_bh(v + 48);
        __m512bh w = pair(p0[t]);
        a0 = _mm512_dpbf16_ps(a0, x0, w); a1 = _mm512_dpbf16_ps(a1, x1, w);
        a2 = _mm512_dpbf16_ps(a2, x2, w); a3 = _mm512_dpbf16_ps(a3, x3, w);
        w = pair(p1[t]);
        b0 = _mm512_dpbf16_ps(b0, x0, w); b1 = _mm512_dpbf16_ps(b1, x1, w);
        b2 = _mm512_dpbf16_ps(b2, x2, w); b3 = _mm512_dpbf16_ps(b3, x3, w);
        w = pair(p2[t]);
        c0 = _mm512_dpbf16_ps(c0, x0, w); c1 = _mm512_dpbf16_ps(c1, x1, w);
        c2 = _mm512_dpbf16_ps(c2, x2, w); c3 = _mm512_dpbf16_ps(c3, x3, w);
    }
#define ADD16(o, x) _mm512_storeu_ps(o, _mm512_add_ps(_mm512_loadu_ps(o), x))
    float *o0 = acc + col, *o1 = acc + dim + col, *o2 = acc + 2 * dim + col;
    ADD16(o0, a0); ADD16(o0 + 16, a1); ADD16(o0 + 32, a2); ADD16(o0 + 48, a3);
    ADD16(o1, b0); ADD16(o1 + 16, b1); ADD16(o1 + 32, b2); ADD16(o1 + 48, b3);
    ADD16(o2, c0); ADD16(o2 + 16, c1); ADD16(o2 + 32, c2); ADD16(o2 + 48, c3);
}

/* the same for 16 columns (a dim that is not a multiple of 64) */
BF16 static void weighted3x16_bf16(const uint16_t *p, int pstride, const uint32_t *vt, int pairs, int dim, int col,
                                   float *acc) {
    __m512 a = _mm512_setzero_ps(), b = a, c = a;
    const pair_t *p0 = (const pair_t *)p, *p1 = (const pair_t *)(p + pstride), *p2 = (const pair_t *)(p + 2 * pstride);
    for (int t = 0; t < pairs; t++) {
        const __m512bh x = load_bh(vt + (size_t)t * dim + col);
        a = _mm512_dpbf16_ps(a, x, pair(p0[t]));
        b = _mm512_dpbf16_ps(b, x, pair(p1[t]));
        c = _mm512_dpbf16_ps(c, x, pair(p2[t]));
    }
    ADD16(acc + col, a); ADD16(acc + dim + col, b); ADD16(acc + 2 * dim + col, c);
#undef ADD16
}

/* ragkv_attend_rows in bf16 arithmetic (the header): the same arguments, dim a multiple of 16. Returns 0, or -1
 * (nothing written) on a CPU without AVX512-BF16. */
BF16 int ragkv_attend_rows_bf16(const float *q, int seq, int heads, const float *keys, const float *values,
                                int kv_heads, long head_stride, int dim, const int *first, const int *end, float scale,
                                float *out) {
    if (!__builtin_cpu_supports("avx512bf16") || dim % 16) return -1;
    const Tiling tl = tiling(seq, heads, kv_heads, end);
    const int group = tl.group, slots = tl.slots, span = tl.span, half = dim / 2;
    const int kblocks = (span + KB - 1) / KB, pairs = (span + 1) / 2;
    uint32_t *kt = malloc(sizeof(uint32_t) * (size_t)kv_heads * kblocks * half * KB);
    uint32_t *vt = malloc(sizeof(uint32_t) * (size_t)kv_heads * pairs * dim);
    #pragma omp parallel
    {
        #pragma omp for schedule(static)
        for (int u = 0; u < kv_heads * kblocks; u++) {
            const int h = u / kblocks, b = u % kblocks;
            keys_bf16(keys + (size_t)h * head_stride + (size_t)b * KB * dim, span - b * KB < KB ? span - b * KB : KB,
                      dim, kt + ((size_t)h * kblocks + b) * half * KB);
        }
        #pragma omp for schedule(static)
        for (int u = 0; u < kv_heads * pairs; u++) {
            const int h = u / pairs, t = u % pairs;
            values_bf16(values + (size_t)h * head_stride + (size_t)2 * t * dim, span - 2 * t < 2 ? 1 : 2, dim,
                        vt + ((size_t)h * pairs + t) * dim);
        }
        uint32_t *qs = malloc(sizeof(uint32_t) * (size_t)slots * half);
        uint16_t *weights = malloc(sizeof(uint16_t) * (size_t)slots * CHUNK);
        const Online st = online_new(slots, dim);
        float *acc = st.acc, *sc = st.sc, *best = st.best, *total = st.total;
        #pragma omp for schedule(dynamic, 1)
        for (int u = 0; u < tl.tiles * kv_heads; u++) {
            const Tile w = tile_of(&tl, u, kv_heads, seq, first, end);
            const int h = w.h, r0 = w.r0, nv = w.nv, lo = w.lo, hi = w.hi;
            online_reset(&st, slots, dim);
            memset(qs, 0, sizeof(uint32_t) * (size_t)slots * half);
            for (int v = 0; v < nv; v++) query_bf16(query_of(q, v, h, group, seq, r0, dim), scale, dim, qs + v * half);
            const uint32_t *K = kt + (size_t)h * kblocks * half * KB, *V = vt + (size_t)h * pairs * dim;
            for (int c0 = lo / CHUNK * CHUNK; c0 < hi; c0 += CHUNK) {
                const int c1 = c0 + CHUNK < hi ? c0 + CHUNK : hi, n = (c1 - c0 + 1) / 2;
                for (int v = 0; v < slots; v += 6)
                    scores6_bf16(qs + v * half, K, c0 / KB, (c1 + KB - 1) / KB, half, sc + v * CHUNK, CHUNK);
                chunk_softmax(sc, weights, slots, nv, group, r0, first, end, c0, c1, best, total, acc, dim);
                for (int v = 0; v < nv; v += 3) {
                    const uint32_t *vals = V + (size_t)(c0 / 2) * dim;
                    int col = 0;
                    for (; col + 64 <= dim; col += 64)
                        weighted3x64_bf16(weights + v * CHUNK, CHUNK, vals, n, dim, col, acc + v * dim);
                    for (; col < dim; col += 16)
                        weighted3x16_bf16(weights + v * CHUNK, CHUNK, vals, n, dim, col, acc + v * dim);
                }
            }
            tile_out(acc, total, nv, group, r0, h, heads, dim, out);
        }
        free(qs); free(weights); free(st.acc);
    }
    free(kt); free(vt);
    return 0;
}
