/* A stored block's codes unpacked and scaled on a CPU: the KIVI layout's group quantization (kvstore/codecs/quant.py
 * spells the layouts), value for value what the torch reference computes (kvstore/kernels/reference.py: the code
 * in fp32, times its group's scale, then plus its zero; two roundings, never a fused multiply-add). Built by
 * kvstore/native.py (gcc -O3 -mavx2 -mfma -mf16c -fopenmp -std=c11, which contracts nothing), called from
 * kvstore/kernels/native_quant.py.
 *
 *     codes   [rows, dim * bits / 8] uint8: a row's codes as one little-endian bit stream (8 codes fill `bits`
 *             bytes for every width: 2, 3, 4, 8)
 *     token:   scale, zero [rows, ceil(dim / group)] fp16, groups along the row      (values; int4; KIVI values)
 *     channel: scale, zero [lead, dim, ceil(tokens / group)] fp16, rows = lead x tokens, groups along the tokens
 *                                                                                      (KIVI and wk4v3 keys)
 *     out     [rows, dim] fp32
 * group: a multiple of 8 for token groups (8 codes at a time never straddle two), any for channel groups. */

#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* the 8 codes in the `bits` bytes at p -> 8 floats */
static inline __m256 codes8(const uint8_t *p, int bits) {
    if (bits == 8) return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)));
    uint32_t word = 0;
    memcpy(&word, p, (size_t)bits);  /* 8 codes of 2, 3 or 4 bits: 2, 3 or 4 bytes */
    const __m256i shifts = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(bits));
    const __m256i q = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)word), shifts),
                                       _mm256_set1_epi32((1 << bits) - 1));
    return _mm256_cvtepi32_ps(q);
}

static inline __m256 scaled(__m256 q, __m256 scale, __m256 zero) {
    return _mm256_add_ps(_mm256_mul_ps(q, scale), zero);
}

void ragkv_dequant_token(const uint8_t *codes, const uint16_t *scale, const uint16_t *zero, long rows, int dim,
                         int bits, int group, float *out) {
    const int groups = (dim + group - 1) / group, stride = dim * bits / 8;
    #pragma omp parallel for schedule(static)
    for (long r = 0; r < rows; r++) {
        const uint8_t *c = codes + r * stride;
        const uint16_t *s = scale + r * groups, *z = zero + r * groups;
        float *o = out + r * dim;
        for (int i = 0; i < dim; i += 8) {
            const int g = i / group;
            const __m256 q = codes8(c + i / 8 * bits, bits);
            _mm256_storeu_ps(o + i, scaled(q, _mm256_set1_ps(_cvtsh_ss(s[g])), _mm256_set1_ps(_cvtsh_ss(z[g]))));
        }
    }
}

void ragkv_dequant_channel(const uint8_t *codes, const uint16_t *scale, const uint16_t *zero, long lead, int tokens,
                           int dim, int bits, int group, float *out) {
    const int groups = (tokens + group - 1) / group, stride = dim * bits / 8;
    #pragma omp parallel
    {
        float *s = malloc(sizeof(float) * (size_t)dim * 2), *z = s + dim;  /* one token group's per-channel values */
        #pragma omp for schedule(static)
        for (long u = 0; u < lead * groups; u++) {
            const long l = u / groups;
            const int g = (int)(u % groups), t1 = (g + 1) * group < tokens ? (g + 1) * group : tokens;
            for (int d = 0; d < dim; d++) {
                s[d] = _cvtsh_ss(scale[(l * dim + d) * groups + g]);
                z[d] = _cvtsh_ss(zero[(l * dim + d) * groups + g]);
            }
            for (int t = g * group; t < t1; t++) {
                const uint8_t *c = codes + (l * tokens + t) * stride;
                float *o = out + (l * tokens + t) * dim;
                for (int i = 0; i < dim; i += 8)
                    _mm256_storeu_ps(o + i, scaled(codes8(c + i / 8 * bits, bits), _mm256_loadu_ps(s + i),
                                                   _mm256_loadu_ps(z + i)));
            }
        }
        free(s);
    }
}
