/* The small operations between the linears of a low-bit decode step, one C call each.
 *
 * Why: in a one-token step of the default (q8) setting the linears read the weights in ~18 ms
 * and everything between them took ~4 ms more, mostly the fixed cost of torch calls (a
 * dozen per layer, 24 layers): RMSNorm alone is 7 of them. Each function here does one such
 * piece in one call on bf16 tensors, computed as transformers computes it in bf16 (float32
 * inside, rounded to bf16 where torch rounds), except that sums and exponentials may round
 * in a different order: only low-bit settings use them, which promise no token equality
 * with `official` (engine/ops/c_calls.py).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "kernels.h"

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif
/* CPUs with AVX2 but no AVX-512 (q8.c's AVX2 path): silu and the softmax take 8-float vectors. */
#if !defined(__AVX512F__) && defined(__AVX2__) && defined(__FMA__)
#define MS_DECODE_AVX2 1
#else
#define MS_DECODE_AVX2 0
#endif

static inline float round_bf(float f) { return bf16_to_f32(f32_to_bf16(f)); }

#ifdef __AVX512F__
static inline __m512 load_bf16(const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}

/* exp(x) for 16 floats within [lo, hi]: x = n ln2 + r, |r| <= ln2/2, a degree-6 polynomial for
 * exp(r) (within ~2 float ulps), times 2^n (scalef: overflows to inf, underflows to 0). */
static inline __m512 exp16_within(__m512 x, float lo, float hi) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(lo)), _mm512_set1_ps(hi));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}

/* The softmax's exp: inputs below -87 count as -87 (the scores' range never needs more). */
static inline __m512 exp16(__m512 x) { return exp16_within(x, -87.0f, 88.0f); }

/* exp over the whole float range, as silu needs it: clamped only to [-104, 89], beyond which
 * float's exp is 0 (denormals end near -103.97) or inf anyway, so silu of a very negative x
 * gives -0 as torch's does. With it the C silu rounds to torch's bf16 result for every finite
 * bf16 input (engine.exact_ops.silu_matches tries all of them). */
static inline __m512 exp16_full(__m512 x) { return exp16_within(x, -104.0f, 89.0f); }
#endif

#if MS_DECODE_AVX2
static inline __m256 load_bf16_8(const uint16_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}

/* exp16's method in 8 lanes (2^n built in the exponent bits: n stays within -126..127 here). */
static inline __m256 exp8(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i two_n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(two_n));
}
#endif

/* torch's float32 sum of the squares of a bf16 row, x.float().pow(2).sum() (aten's SumKernel:
 * vectorized_inner_sum -> row_sum -> multi_row_sum), for its vectors of `lanes` floats: rows of 4 vectors summed into 4 x 4
 * accumulator vectors in a cascade of 4 levels, then the 4 vectors, then the lanes in order.
 * Checked bit for bit against torch with 8 lanes (its AVX2 and default kernels). */
#define MAX_SUM_LANES 16
static inline float square_at(const uint16_t *x, int64_t i) { return bf16_to_f32(x[i]) * bf16_to_f32(x[i]); }

static float torch_row_sum(const uint16_t *x, int64_t n, int lanes) {
    enum { LEVELS = 4, ILP = 4 };
    const int64_t vectors = n / lanes, rows = vectors / ILP;
    int64_t ceil_log2 = 0;
    while (((int64_t)1 << ceil_log2) < rows) ceil_log2++;
    const int64_t power = ceil_log2 / LEVELS > 4 ? ceil_log2 / LEVELS : 4, step = (int64_t)1 << power;
    float acc[LEVELS][ILP][MAX_SUM_LANES] = {{{0}}};
    int64_t i = 0;
    for (; i + step <= rows;) {
        for (int64_t j = 0; j < step; j++, i++)
            for (int k = 0; k < ILP; k++)
                for (int l = 0; l < lanes; l++) acc[0][k][l] += square_at(x, (i * ILP + k) * lanes + l);
        for (int level = 1; level < LEVELS; level++) {
            for (int k = 0; k < ILP; k++)
                for (int l = 0; l < lanes; l++) acc[level][k][l] += acc[level - 1][k][l], acc[level - 1][k][l] = 0.0f;
            if ((i & ((step - 1) << (level * power))) != 0) break;
        }
    }
    for (; i < rows; i++)
        for (int k = 0; k < ILP; k++)
            for (int l = 0; l < lanes; l++) acc[0][k][l] += square_at(x, (i * ILP + k) * lanes + l);
    for (int level = 1; level < LEVELS; level++)
        for (int k = 0; k < ILP; k++)
            for (int l = 0; l < lanes; l++) acc[0][k][l] += acc[level][k][l];
    for (int64_t v = rows * ILP; v < vectors; v++)
        for (int l = 0; l < lanes; l++) acc[0][0][l] += square_at(x, v * lanes + l);
    for (int k = 1; k < ILP; k++)
        for (int l = 0; l < lanes; l++) acc[0][0][l] += acc[0][k][l];
    float total = 0.0f;
    for (int64_t t = vectors * lanes; t < n; t++) total += square_at(x, t);
    for (int l = 0; l < lanes; l++) total += acc[0][0][l];
    return total;
}

/* RMSNorm of `rows` rows of `dim` as transformers' Qwen2RMSNorm in bf16: h = x * rsqrt(mean(x^2)
 * + eps) in float32, rounded to bf16, times the bf16 weight (rounded). torch_lanes > 0: the sum
 * of squares in torch's order for its vectors of that many floats (then bit-identical to torch's
 * RMSNorm); 0: in 16 partial sums (within a rounding step of torch's). */
int ms_rms_norm_bf16(const uint16_t *x, const uint16_t *weight, uint16_t *out, int64_t rows, int64_t dim, float eps,
                     int torch_lanes) {
    if (torch_lanes < 0 || torch_lanes > MAX_SUM_LANES) return 1;
    for (int64_t r = 0; r < rows; r++) {
        const uint16_t *xr = x + r * dim;
        uint16_t *o = out + r * dim;
        float sum = 0.0f;
        if (torch_lanes) {
            sum = torch_row_sum(xr, dim, torch_lanes);
        } else {
            float partial[16] = {0};
            int64_t i = 0;
            for (; i + 16 <= dim; i += 16)
                for (int j = 0; j < 16; j++) partial[j] += bf16_to_f32(xr[i + j]) * bf16_to_f32(xr[i + j]);
            for (int j = 0; j < 16; j++) sum += partial[j];
            for (; i < dim; i++) sum += bf16_to_f32(xr[i]) * bf16_to_f32(xr[i]);
        }
        float scale = 1.0f / sqrtf(sum / (float)dim + eps);
        for (int64_t i = 0; i < dim; i++) o[i] = f32_to_bf16(bf16_to_f32(weight[i]) * round_bf(bf16_to_f32(xr[i]) * scale));
    }
    return 0;
}

/* Rotary embedding in place on the first `heads` heads of `dim` of each row (rows `stride`
 * elements apart), as transformers' apply_rotary_pos_emb in bf16: x * cos + rotate_half(x) *
 * sin, each product and the sum rounded to bf16. cos, sin: [rows, dim] bf16. */
int ms_rotary_bf16(uint16_t *x, int64_t rows, int64_t stride, int64_t heads, int64_t dim,
                   const uint16_t *cos, const uint16_t *sin) {
    int64_t half = dim / 2;
    if (dim > 1024 || dim % 2) return 1;
    float v[1024];
    for (int64_t r = 0; r < rows; r++) {
        const uint16_t *c = cos + r * dim, *s = sin + r * dim;
        for (int64_t h = 0; h < heads; h++) {
            uint16_t *p = x + r * stride + h * dim;
            for (int64_t i = 0; i < dim; i++) v[i] = bf16_to_f32(p[i]);
            for (int64_t i = 0; i < dim; i++) {
                float rotated = i < half ? -v[i + half] : v[i - half];
                p[i] = f32_to_bf16(round_bf(v[i] * bf16_to_f32(c[i])) + round_bf(rotated * bf16_to_f32(s[i])));
            }
        }
    }
    return 0;
}

/* silu(gate) * up for rows of [gate | up] (2 * inter each): silu rounded to bf16, then the
 * product rounded, as F.silu(gate).mul_(up) in bf16. out: [rows, inter]. */
int ms_silu_mul_bf16(const uint16_t *gate_up, uint16_t *out, int64_t rows, int64_t inter) {
    for (int64_t r = 0; r < rows; r++) {
        const uint16_t *g = gate_up + r * 2 * inter, *u = g + inter;
        uint16_t *o = out + r * inter;
        int64_t i = 0;
#ifdef __AVX512F__
        for (; i + 16 <= inter; i += 16) {
            __m512 x = load_bf16(g + i);
            __m512 silu = _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), exp16_full(_mm512_sub_ps(_mm512_setzero_ps(), x))));
            float sv[16], uv[16];
            _mm512_storeu_ps(sv, silu);
            _mm512_storeu_ps(uv, load_bf16(u + i));
            for (int j = 0; j < 16; j++) o[i + j] = f32_to_bf16(round_bf(sv[j]) * uv[j]);
        }
#elif MS_DECODE_AVX2
        for (; i + 8 <= inter; i += 8) {
            __m256 x = load_bf16_8(g + i);
            __m256 silu = _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), exp8(_mm256_sub_ps(_mm256_setzero_ps(), x))));
            float sv[8], uv[8];
            _mm256_storeu_ps(sv, silu);
            _mm256_storeu_ps(uv, load_bf16_8(u + i));
            for (int j = 0; j < 8; j++) o[i + j] = f32_to_bf16(round_bf(sv[j]) * uv[j]);
        }
#endif
        for (; i < inter; i++) {
            float x = bf16_to_f32(g[i]);
            o[i] = f32_to_bf16(round_bf(x / (1.0f + expf(-x))) * bf16_to_f32(u[i]));
        }
    }
    return 0;
}

/* exp(s - max) of the scores, each rounded to bf16 as the weights of the value sum (SDPA's
 * CPU kernel in bf16 multiplies bf16 probabilities with V); returns their float32 sum (before
 * rounding), which the weighted sum is divided by at the end, as that kernel does. */
static float exp_scores(float *s, int64_t n) {
    float top = -INFINITY, total = 0.0f;
    for (int64_t j = 0; j < n; j++) top = s[j] > top ? s[j] : top;
    int64_t j = 0;
#ifdef __AVX512F__
    __m512 sum = _mm512_setzero_ps();
    for (; j + 16 <= n; j += 16) {
        __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(s + j), _mm512_set1_ps(top)));
        _mm512_storeu_ps(s + j, e);
        sum = _mm512_add_ps(sum, e);
    }
    total = _mm512_reduce_add_ps(sum);
#elif MS_DECODE_AVX2
    __m256 sum = _mm256_setzero_ps();
    for (; j + 8 <= n; j += 8) {
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + j), _mm256_set1_ps(top)));
        _mm256_storeu_ps(s + j, e);
        sum = _mm256_add_ps(sum, e);
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, sum);
    for (int l = 0; l < 8; l++) total += lanes[l];
#endif
    for (; j < n; j++) {
        s[j] = expf(s[j] - top);
        total += s[j];
    }
    for (j = 0; j < n; j++) s[j] = round_bf(s[j]);
    return total;
}

/* Scaled dot products of `group` float queries (qf [group, dim]) with one bf16 key row:
 * out[g * stride]. The key row is converted once for the whole group. */
#ifdef __AVX512F__
/* Whether a row of `dim` takes the vector path (whole 16-float chunks, at most 16 of them). */
static inline int vector_row(int64_t dim) { return dim % 16 == 0 && dim <= 256; }

/* A bf16 row as dim / 16 vectors of floats. */
static inline int64_t load_row(const uint16_t *row, int64_t dim, __m512 *out) {
    int64_t chunks = dim / 16;
    for (int64_t c = 0; c < chunks; c++) out[c] = load_bf16(row + 16 * c);
    return chunks;
}
#endif

#if MS_DECODE_AVX2
/* The AVX2 path's rows (8-float chunks, at most 256 floats), widened once into a stack row that
 * the group's queries then share. Without it the dot products ran scalar: 4% of a 1.5B Q4_K_M
 * decode on a 2-core AVX2 host at a short context, where the vector path measured 1.02-1.04x
 * at batch 1 (paired, one process). */
static inline int vector_row8(int64_t dim) { return dim % 8 == 0 && dim <= 256; }

static inline void widen_row8(const uint16_t *row, int64_t dim, float *out) {
    for (int64_t i = 0; i < dim; i += 8) _mm256_storeu_ps(out + i, load_bf16_8(row + i));
}

static inline float sum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
#endif

static void key_scores(const float *qf, const uint16_t *k, int64_t group, int64_t dim, float scale, float *out,
                       int64_t stride) {
#ifdef __AVX512F__
    if (vector_row(dim)) {
        __m512 kv[16];
        int64_t chunks = load_row(k, dim, kv);
        for (int64_t g = 0; g < group; g++) {
            __m512 acc = _mm512_setzero_ps();
            for (int64_t c = 0; c < chunks; c++) acc = _mm512_fmadd_ps(_mm512_loadu_ps(qf + g * dim + 16 * c), kv[c], acc);
            out[g * stride] = _mm512_reduce_add_ps(acc) * scale;
        }
        return;
    }
#endif
#if MS_DECODE_AVX2
    if (vector_row8(dim)) {
        float kf[256];
        widen_row8(k, dim, kf);
        for (int64_t g = 0; g < group; g++) {
            __m256 acc = _mm256_setzero_ps();
            for (int64_t i = 0; i < dim; i += 8)
                acc = _mm256_fmadd_ps(_mm256_loadu_ps(qf + g * dim + i), _mm256_loadu_ps(kf + i), acc);
            out[g * stride] = sum8(acc) * scale;
        }
        return;
    }
#endif
    for (int64_t g = 0; g < group; g++) {
        float total = 0.0f;
        for (int64_t i = 0; i < dim; i++) total += qf[g * dim + i] * bf16_to_f32(k[i]);
        out[g * stride] = total * scale;
    }
}

/* acc[g] += p[g * stride] * v for the group's accumulators (acc [group, dim]); v converted once. */
static void add_value(float *acc, const float *p, int64_t stride, const uint16_t *v, int64_t group, int64_t dim) {
#ifdef __AVX512F__
    if (vector_row(dim)) {
        __m512 vv[16];
        int64_t chunks = load_row(v, dim, vv);
        for (int64_t g = 0; g < group; g++) {
            __m512 weight = _mm512_set1_ps(p[g * stride]);
            float *a = acc + g * dim;
            for (int64_t c = 0; c < chunks; c++)
                _mm512_storeu_ps(a + 16 * c, _mm512_fmadd_ps(weight, vv[c], _mm512_loadu_ps(a + 16 * c)));
        }
        return;
    }
#endif
#if MS_DECODE_AVX2
    if (vector_row8(dim)) {
        float vf[256];
        widen_row8(v, dim, vf);
        for (int64_t g = 0; g < group; g++) {
            __m256 weight = _mm256_set1_ps(p[g * stride]);
            float *a = acc + g * dim;
            for (int64_t i = 0; i < dim; i += 8)
                _mm256_storeu_ps(a + i, _mm256_fmadd_ps(weight, _mm256_loadu_ps(vf + i), _mm256_loadu_ps(a + i)));
        }
        return;
    }
#endif
    for (int64_t g = 0; g < group; g++)
        for (int64_t i = 0; i < dim; i++) acc[g * dim + i] += p[g * stride] * bf16_to_f32(v[i]);
}

/* One query group (`group` heads sharing a kv head, q: [group, dim]) over `length` positions
 * whose key and value rows are krows[j], vrows[j]. Scores and sums in float32, the
 * probabilities rounded to bf16 before they weight V (as SDPA's CPU kernel does in bf16: with
 * float32 probabilities q8's free-running agreement with bf16 fell to 0.869,
 * results/quantization_q8_f32_attention_probs.json); out [group, dim] rounded to bf16. */
static void attend_group(const uint16_t *q, const uint16_t *const *krows, const uint16_t *const *vrows,
                         int64_t length, int64_t group, int64_t dim, float scale, float *scores, float *acc,
                         uint16_t *out) {
    float totals[64];
    float *qf = acc;   /* the queries in float, in the accumulators' space until the value pass */
    for (int64_t i = 0; i < group * dim; i++) qf[i] = bf16_to_f32(q[i]);
    for (int64_t j = 0; j < length; j++) key_scores(qf, krows[j], group, dim, scale, scores + j, length);
    for (int64_t g = 0; g < group; g++) totals[g] = exp_scores(scores + g * length, length);
    memset(acc, 0, sizeof(float) * (size_t)(group * dim));
    for (int64_t j = 0; j < length; j++) add_value(acc, scores + j, length, vrows[j], group, dim);
    for (int64_t g = 0; g < group; g++)
        for (int64_t i = 0; i < dim; i++) out[g * dim + i] = f32_to_bf16(acc[g * dim + i] / totals[g]);
}

/* Scratch for attend_group over `length` positions: row pointers, scores, accumulators. */
typedef struct {
    const uint16_t **krows, **vrows;
    float *scores, *acc;
} scratch;

static int scratch_alloc(scratch *s, int64_t length, int64_t group, int64_t dim) {
    s->krows = malloc(sizeof(uint16_t *) * (size_t)(2 * length));
    s->scores = malloc(sizeof(float) * (size_t)(group * length + group * dim));
    if (!s->krows || !s->scores) {
        free(s->krows);
        free(s->scores);
        return 1;
    }
    s->vrows = s->krows + length;
    s->acc = s->scores + group * length;
    return 0;
}

static void scratch_free(scratch *s) {
    free(s->krows);
    free(s->scores);
}

/* Contexts from which a one-sequence step splits its kv heads over threads (below, the
 * fork/join would cost more than the work). */
#define PARALLEL_LENGTH 256

static inline int64_t kv_row_at(const kv_rows *kv, int64_t h, int64_t j) {
    if (!kv->table) return h * kv->capacity + j;
    return ((kv->table[j / kv->block_size] * kv->layers + kv->layer) * kv->block_size + j % kv->block_size)
           * kv->kv_heads + h;
}

/* One token's query group h (heads h * group ..) at position pos: optionally store its k, v
 * (k_new / v_new: [dim] of kv head h), then attend over positions 0..pos. 1: no scratch. */
int ms_attend_head(const kv_rows *kv, int64_t h, int64_t pos, const uint16_t *q, const uint16_t *k_new,
                   const uint16_t *v_new, int64_t group, int64_t dim, float scale, uint16_t *out) {
    const int64_t length = pos + 1;
    scratch sc;
    if (scratch_alloc(&sc, length, group, dim)) return 1;
    for (int64_t j = 0; j < length; j++) {
        const int64_t at = kv_row_at(kv, h, j);
        sc.krows[j] = kv->keys + at * dim;
        sc.vrows[j] = kv->values + at * dim;
    }
    if (k_new) {
        memcpy((uint16_t *)sc.krows[pos], k_new, (size_t)dim * 2);
        memcpy((uint16_t *)sc.vrows[pos], v_new, (size_t)dim * 2);
    }
    attend_group(q, sc.krows, sc.vrows, length, group, dim, scale, sc.scores, sc.acc, out);
    scratch_free(&sc);
    return 0;
}

/* (kernels.h) every token's k, v first, then each token attends causally. */
int ms_attend_tokens(const kv_rows *kv, int64_t h, int64_t pos0, int64_t tokens, const uint16_t *q,
                     int64_t q_stride, const uint16_t *k_new, const uint16_t *v_new, int64_t kv_stride,
                     int64_t group, int64_t dim, float scale, uint16_t *out, int64_t out_stride) {
    for (int64_t t = 0; t < tokens; t++) {
        const int64_t at = kv_row_at(kv, h, pos0 + t);
        memcpy(kv->keys + at * dim, k_new + t * kv_stride, (size_t)dim * 2);
        memcpy(kv->values + at * dim, v_new + t * kv_stride, (size_t)dim * 2);
    }
    int status = 0;
    for (int64_t t = 0; t < tokens && !status; t++)
        status = ms_attend_head(kv, h, pos0 + t, q + t * q_stride, NULL, NULL, group, dim, scale, out + t * out_stride);
    return status;
}

/* A few consecutive tokens of one sequence in a contiguous cache (a verify step: the pending
 * token and its drafts, or a short chunk): store their k, v ([tokens, kv_heads, dim]) at
 * positions pos0.. of keys/values ([kv_heads, capacity, dim]), then attend each q ([tokens,
 * heads, dim]) causally, as ms_paged_attend_bf16 attends such a step; kv heads in parallel.
 * out [tokens, heads, dim]. */
int ms_attend_rows_bf16(const uint16_t *q, const uint16_t *k_new, const uint16_t *v_new, uint16_t *keys,
                        uint16_t *values, int64_t capacity, int64_t pos0, int64_t tokens, int64_t heads,
                        int64_t kv_heads, int64_t dim, float scale, uint16_t *out, int threads) {
    const int64_t group = heads / kv_heads;
    if (group > 64) return 2;
    const kv_rows kv = {keys, values, capacity, NULL, 0, 0, 1, kv_heads};
    int status = 0;
#pragma omp parallel for num_threads(threads) reduction(| : status)
    for (int64_t h = 0; h < kv_heads; h++)
        status |= ms_attend_tokens(&kv, h, pos0, tokens, q + h * group * dim, heads * dim, k_new + h * dim,
                                   v_new + h * dim, kv_heads * dim, group, dim, scale, out + h * group * dim,
                                   heads * dim);
    return status;
}

/* One new token of one sequence in a contiguous cache: write its k, v ([kv_heads, dim]) at
 * position `pos` of keys/values ([kv_heads, capacity, dim]), then attend its q ([heads, dim],
 * each group of heads / kv_heads query heads sharing a kv head) over positions 0..pos;
 * out [heads, dim]. Returns 1 when scratch cannot be allocated, 2 for more than 64 query
 * heads per kv head. */
int ms_attend_decode_bf16(const uint16_t *q, const uint16_t *k_new, const uint16_t *v_new,
                          uint16_t *keys, uint16_t *values, int64_t capacity, int64_t pos,
                          int64_t heads, int64_t kv_heads, int64_t dim, float scale, uint16_t *out, int threads) {
    int64_t group = heads / kv_heads, length = pos + 1;
    if (group > 64) return 2;
    const kv_rows kv = {keys, values, capacity, NULL, 0, 0, 1, kv_heads};
    int status = 0;
#pragma omp parallel for num_threads(threads) if (length >= PARALLEL_LENGTH) reduction(| : status)
    for (int64_t h = 0; h < kv_heads; h++)
        status |= ms_attend_head(&kv, h, pos, q + h * group * dim, k_new + h * dim, v_new + h * dim, group, dim,
                                 scale, out + h * group * dim);
    return status;
}

/* A paged step's keys and values of one layer for torch's attention (CPUs where the decode
 * attention stays torch's, engine.ops.choose.attention_like_torch): store the n_new tokens' k, v
 * ([n_new, kv_heads, dim]) at their slots (block slot / block_size, offset slot % block_size of
 * the pool [num_blocks, layers, block_size, kv_heads, dim]), then copy positions 0..length-1 of
 * each of the `batch` block tables ([batch, max_blocks], as torch's gather reads them, padding
 * entries included) into out_k / out_v [batch, kv_heads, length, dim], the layout SDPA reads.
 * One call instead of four indexing ops, a gather and a transpose per layer: the same values. */
int ms_paged_gather_bf16(const uint16_t *k_new, const uint16_t *v_new, const int64_t *slots, int64_t n_new,
                         uint16_t *pool_k, uint16_t *pool_v, int64_t layers, int64_t layer, int64_t block_size,
                         int64_t kv_heads, int64_t dim, const int64_t *tables, int64_t batch, int64_t max_blocks,
                         int64_t length, uint16_t *out_k, uint16_t *out_v) {
    if (length > max_blocks * block_size) return 1;
    const size_t row = (size_t)dim * 2, token = (size_t)(kv_heads * dim);
    for (int64_t t = 0; t < n_new; t++) {
        const int64_t at = ((slots[t] / block_size * layers + layer) * block_size + slots[t] % block_size) * kv_heads;
        memcpy(pool_k + at * dim, k_new + t * token, row * (size_t)kv_heads);
        memcpy(pool_v + at * dim, v_new + t * token, row * (size_t)kv_heads);
    }
    for (int64_t b = 0; b < batch; b++) {
        const int64_t *table = tables + b * max_blocks;
        for (int64_t j = 0; j < length; j++) {
            const int64_t at = ((table[j / block_size] * layers + layer) * block_size + j % block_size) * kv_heads;
            for (int64_t h = 0; h < kv_heads; h++) {
                const int64_t to = ((b * kv_heads + h) * length + j) * dim;
                memcpy(out_k + to, pool_k + (at + h) * dim, row);
                memcpy(out_v + to, pool_v + (at + h) * dim, row);
            }
        }
    }
    return 0;
}

/* A paged step's attention, one layer, for steps whose tokens each attend over their own
 * sequence's positions 0..p (decode tokens, verify steps' drafts, short chunks): token t
 * (q [n_tokens, heads, dim]) belongs to the sequence whose block table is
 * tables[rows[t]] and sits at position positions[t]; it attends over 0..p through that
 * table (block tables[row][j / block_size], offset j % block_size of the pool, [num_blocks,
 * layers, block_size, kv_heads, dim] for keys and for values) as ms_attend_decode_bf16
 * does. `write`: first store the token's k, v ([n_tokens, kv_heads, dim]) at its slot, which
 * is only safe when every token is its sequence's only one (a decode-only step); otherwise
 * the caller has stored them. (token, kv head) pairs run in parallel (OpenMP, `threads`) for
 * several tokens or a long context. out [n_tokens, heads, dim]. */
int ms_paged_attend_bf16(const uint16_t *q, const uint16_t *k_new, const uint16_t *v_new,
                         uint16_t *pool_k, uint16_t *pool_v, int64_t layers, int64_t layer, int64_t block_size,
                         const int64_t *tables, int64_t max_blocks, const int64_t *rows, const int64_t *positions,
                         int64_t tokens, int64_t heads, int64_t kv_heads, int64_t dim, float scale, uint16_t *out,
                         int threads, int write) {
    int64_t group = heads / kv_heads;
    if (group > 64) return 2;
    int status = 0, parallel = tokens > 1 || positions[0] + 1 >= PARALLEL_LENGTH;
#pragma omp parallel for collapse(2) num_threads(threads) if (parallel) schedule(dynamic, 1) reduction(| : status)
    for (int64_t t = 0; t < tokens; t++) {
        for (int64_t h = 0; h < kv_heads; h++) {
            const kv_rows kv = {pool_k, pool_v, 0, tables + rows[t] * max_blocks, layers, layer, block_size, kv_heads};
            const int64_t at = (t * heads + h * group) * dim, kv_at = (t * kv_heads + h) * dim;
            if (positions[t] / block_size >= max_blocks) {
                status |= 1;
                continue;
            }
            status |= ms_attend_head(&kv, h, positions[t], q + at, write ? k_new + kv_at : NULL,
                                     write ? v_new + kv_at : NULL, group, dim, scale, out + at);
        }
    }
    return status;
}
