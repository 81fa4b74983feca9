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
 * over the same cache would. dim: a multiple of 8. */

#include <immintrin.h>
#include <math.h>
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

void ragkv_attend_rows(const float *q, int seq, int heads, const float *keys, const float *values, int kv_heads,
                       long head_stride, int dim, const int *first, const int *end, float scale, float *out) {
    const int group = heads / kv_heads;
    const int per = group < TILE ? TILE / group : 1;          /* rows per tile */
    const int tiles = (seq + per - 1) / per;
    const int slots = (per * group + 5) / 6 * 6;                /* vectors per tile, padded to 6 */
    int span = 0;
    for (int r = 0; r < seq; r++) if (end[r] > span) span = end[r];
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
        float *qs = malloc(sizeof(float) * (size_t)slots * dim), *acc = malloc(sizeof(float) * (size_t)slots * dim);
        float *sc = malloc(sizeof(float) * (size_t)slots * CHUNK), *best = malloc(sizeof(float) * slots);
        float *total = malloc(sizeof(float) * slots);
        #pragma omp for schedule(dynamic, 1)
        for (int u = 0; u < tiles * kv_heads; u++) {
            const int tile = tiles - 1 - u / kv_heads, h = u % kv_heads;  /* the longest rows first */
            const int r0 = tile * per, r1 = r0 + per < seq ? r0 + per : seq, nv = (r1 - r0) * group;
            int lo = first[r0], hi = end[r0];
            for (int r = r0; r < r1; r++) { if (first[r] < lo) lo = first[r]; if (end[r] > hi) hi = end[r]; }
            for (int v = 0; v < slots; v++) {  /* vector v: row r0 + v / group, query head h * group + v % group */
                if (v < nv) {
                    const float *src = q + ((size_t)(h * group + v % group) * seq + r0 + v / group) * dim;
                    for (int i = 0; i < dim; i++) qs[v * dim + i] = src[i] * scale;
                } else memset(qs + v * dim, 0, sizeof(float) * dim);
                memset(acc + v * dim, 0, sizeof(float) * dim);
                best[v] = -INFINITY;
                total[v] = 0.0f;
            }
            const float *V = values + (size_t)h * head_stride, *K = kt + (size_t)h * kblocks * dim * 8;
            for (int c0 = lo / CHUNK * CHUNK; c0 < hi; c0 += CHUNK) {
                const int c1 = c0 + CHUNK < hi ? c0 + CHUNK : hi, width = c1 - c0;
                for (int v = 0; v < slots; v += 6)
                    scores6(qs + v * dim, K, c0 / 8, (c1 + 7) / 8, dim, sc + v * CHUNK, CHUNK);
                for (int v = 0; v < slots; v++) {
                    const int r = r0 + v / group;
                    const int a = v < nv && first[r] > c0 ? first[r] - c0 : 0;
                    const int b = v >= nv ? 0 : (end[r] < c1 ? end[r] : c1) - c0;
                    if (a >= b) memset(sc + v * CHUNK, 0, sizeof(float) * width);  /* nothing seen here */
                    else softmax_step(sc + v * CHUNK, width, a, b, best + v, total + v, acc + v * dim, dim);
                }
                for (int v = 0; v < nv; v += 3) {
                    int col = 0;
                    for (; col + 32 <= dim; col += 32)
                        weighted3x32(sc + v * CHUNK, CHUNK, V + (size_t)c0 * dim, width, dim, col, acc + v * dim);
                    for (; col < dim; col += 8)
                        weighted3x8(sc + v * CHUNK, CHUNK, V + (size_t)c0 * dim, width, dim, col, acc + v * dim);
                }
            }
            for (int v = 0; v < nv; v++) {
                float *o = out + ((size_t)(r0 + v / group) * heads + h * group + v % group) * dim;
                const float inv = total[v] > 0.0f ? 1.0f / total[v] : 0.0f;
                for (int i = 0; i < dim; i++) o[i] = acc[v * dim + i] * inv;
            }
        }
        free(qs); free(acc); free(sc); free(best); free(total);
    }
    free(kt);
}
