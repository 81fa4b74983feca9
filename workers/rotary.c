/* RoPE passes in C (workers/placement.py, workers/rotary.py): each entry read once and written once.
 *
 *   ragkv_place          a stored chunk placed into a prompt's cache:
 *                            keys[l, h, start + t]   = RoPE(k[l, h, t] + dk[l, h], cos[l][t], sin[l][t])
 *                            values[l, h, start + t] = v[l, h, t] + dv[l, h]
 *                        dk/dv: the context drift of the chunk's slot (NULL: none); cos/sin [T, D] per layer
 *                        (a layer stride of 0: every layer alike; a token stride of 0: one rotation for every
 *                        token, the re-rotation of post-RoPE keys)
 *   ragkv_rotate_rows    a pass's queries or keys rotated at their positions, [S, H, D] rows (a view of the
 *                        projection's output) -> [H, S, D], cos/sin looked up in the runner's position tables
 *
 * RoPE is the rotate_half form, pair (x1, x2) = (x[i], x[i + D/2]) -> (x1 c - x2 s, x2 c + x1 s), computed as
 * kvstore/rope.apply_rope's torch ops are on an x86 CPU (a product, then a fused multiply-add: mul then
 * addcmul_), so the bits match torch's where its kernels fuse the same way (tests/workers/test_placement.py,
 * test_rotary.py). No other contraction: the compiler's is switched off. Built by workers/native.py. */

#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

static inline __m256 drifted(const float *x, const float *d, int i) {
    __m256 v = _mm256_loadu_ps(x + i);
    return d ? _mm256_add_ps(v, _mm256_loadu_ps(d + i)) : v;
}

/* one entry of D floats: o = RoPE(x + d) with the halves of c / s (d NULL: no shift) */
static inline void rotate(const float *x, const float *d, const float *c, const float *s, int D, float *o) {
    const int half = D / 2;
    for (int i = 0; i < half; i += 8) {
        __m256 x1 = drifted(x, d, i), x2 = drifted(x, d, half + i);
        __m256 ci = _mm256_loadu_ps(c + i), si = _mm256_loadu_ps(s + i);
        _mm256_storeu_ps(o + i, _mm256_fnmadd_ps(x2, si, _mm256_mul_ps(x1, ci)));
        _mm256_storeu_ps(o + half + i, _mm256_fmadd_ps(x1, si, _mm256_mul_ps(x2, ci)));
    }
}

/* one (layer, head): T entries of D floats from `k`/`v` (contiguous) to `out_k`/`out_v` (contiguous) */
static void place_head(const float *k, const float *v, const float *dk, const float *dv, const float *cos,
                       const float *sin, long cs_token, int T, int D, float *out_k, float *out_v) {
    for (int t = 0; t < T; t++) {
        const size_t e = (size_t)t * D;
        rotate(k + e, dk, cos + (size_t)t * cs_token, sin + (size_t)t * cs_token, D, out_k + e);
        for (int i = 0; i < D; i += 8) _mm256_storeu_ps(out_v + e + i, drifted(v + e, dv, i));
    }
}

/* k, v [L, H, T, D] contiguous; dk, dv [L, H, D] or NULL; cos, sin: layer l's token t at
 * cos + l * cs_layer + t * cs_token, D floats (halves equal); out_k, out_v: entry (l, h, t) at
 * out + l * out_layer + h * out_head + t * D. D a multiple of 16. */
void ragkv_place(const float *k, const float *v, const float *dk, const float *dv, int L, int H, int T, int D,
                 const float *cos, const float *sin, long cs_layer, long cs_token, float *out_k, float *out_v,
                 long out_layer, long out_head) {
    #pragma omp parallel for schedule(static)
    for (int lh = 0; lh < L * H; lh++) {
        const int l = lh / H, h = lh % H;
        const size_t src = (size_t)lh * T * D, dst = (size_t)l * out_layer + (size_t)h * out_head;
        const size_t drift = (size_t)lh * D;
        place_head(k + src, v + src, dk ? dk + drift : NULL, dv ? dv + drift : NULL, cos + (size_t)l * cs_layer,
                   sin + (size_t)l * cs_layer, cs_token, T, D, out_k + dst, out_v + dst);
    }
}

/* x: row i's head h at x + i * row_stride + h * D; positions [S]; cos, sin [P, D] (P above every position);
 * out [H, S, D] contiguous. D a multiple of 16. */
void ragkv_rotate_rows(const float *x, long row_stride, int S, int H, int D, const int64_t *positions,
                       const float *cos, const float *sin, float *out) {
    /* (head, row) pairs split evenly (a kv head or two would leave a thread idle); a few: one thread */
    #pragma omp parallel for schedule(static) if (S * H >= 256)
    for (long hi = 0; hi < (long)H * S; hi++) {
        const int h = (int)(hi / S), i = (int)(hi % S);
        const size_t p = (size_t)positions[i] * D;
        rotate(x + (size_t)i * row_stride + (size_t)h * D, NULL, cos + p, sin + p, D, out + (size_t)hi * D);
    }
}
