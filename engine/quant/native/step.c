/* A whole decode (or verify) step of a q8 / q5 model, or of a GGUF file's own block-format
 * weights (gguf.c's team kernels), in one call and one parallel region: up to a few consecutive
 * tokens of one sequence, or one token each of a paged batch, through every layer, the final
 * norm and the head.
 *
 * Why: the step's linears read the weights in ~15 ms on a 2-core machine, and the Python
 * around them (a dozen calls per layer: each linear's wrapper, its allocation, the fused small
 * operations, the residual adds) plus a fork/join of the thread team per linear cost ~2 ms more
 * per token. Here the team is forked once per step and meets at barriers between the pieces, as
 * llama.cpp's graph runner does; the pieces are q8.c's, gguf.c's and decode.c's own, in the same order,
 * so the logits are those of engine.forward's fused path bit for bit (tests/quant/test_step.py).
 * A GGUF layer meets at about 20 barriers. Fewer were tried (each linear's quantization inside
 * the single before it, the rounding inside the tiles, one barrier per linear: 9 a layer): on
 * a Llama 3.2 1B Q4_K_M file, paired with this code, batch 1 was even (1.01x) and batch 8 0.97x.
 * The threads' wait at a barrier is their imbalance, which fewer barriers do not remove.
 *
 * The model (ms_step_model) is described once by engine/quant/step.py (pointers into the
 * loaded weights); each call passes the tokens' embedding rows, where their keys and values go
 * (a contiguous cache, or the paged block table of the sequence or of each row), their rotary rows, and whether
 * their activations go in two bytes (q8.c's `precise`, as engine.quant.q8.linear would choose).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <omp.h>

#include "bf16.h"
#include "kernels.h"

#define MAX_PARTS 3

/* One GGUF block-format matrix of a linear: `rows` weight rows of `type`, row_bytes apart. */
typedef struct {
    int64_t type;
    const uint8_t *data;
    int64_t row_bytes, rows;
} ms_step_part;

/* A q8 / q5 linear (parts == 0: weights, scales), or the row-wise stack of 1..MAX_PARTS GGUF
 * parts (engine.quant.gguf_linear.BlockLinear: each part's float32 outputs land in its slice,
 * the bias is added and the row rounded to bf16 once, as the Python linear does). */
typedef struct {
    const uint8_t *weights;   /* q8 codes or q5-packed rows */
    const uint16_t *scales;   /* fp16 [out, in / 32] */
    const float *bias;        /* float32 [out] or NULL */
    int64_t in_features, out_features, q5;
    int64_t parts;
    ms_step_part part[MAX_PARTS];
} ms_step_linear;

typedef struct {
    const uint16_t *input_norm, *post_norm;
    ms_step_linear qkv, o, gate_up, down;
} ms_step_layer;

typedef struct {
    int64_t layers, hidden, heads, kv_heads, head_dim, intermediate, vocab, torch_lanes;
    int64_t gguf;             /* some linear is made of GGUF parts: step_buffers' wide and block_scratch */
    float eps;
    const ms_step_layer *layer;
    const uint16_t *norm;
    ms_step_linear head;
} ms_step_model;

typedef struct {
    uint16_t *h, *qkv, *attn, *y, *gate_up, *act, *logits;
    float *wide;              /* a GGUF linear's float32 outputs before the bias and the rounding */
    void *scratch, *block_scratch;
} step_buffers;

/* y [rows, out] (bf16) = x [rows, in] @ W.T + bias, by every thread of the team (it ends at a
 * barrier). q8 / q5: one thread quantizes the rows, the team multiplies. GGUF parts: each part's
 * activations are quantized for its format (parts whose formats quantize alike share them), the
 * team multiplies into `wide`, then adds the bias and rounds. */
static void linear(const ms_step_linear *lin, const uint16_t *x, uint16_t *y, int64_t rows, int precise,
                   const step_buffers *b) {
    const int64_t in = lin->in_features, out = lin->out_features;
    if (lin->parts == 0) {
        #pragma omp single
        ms_q8_team_quantize(x, rows, in, (int)lin->q5, precise, b->scratch);
        ms_q8_team_tiles(rows, in, lin->weights, (int)lin->q5, lin->scales, out, lin->bias, y, precise, b->scratch);
        return;
    }
    int64_t column = 0;
    for (int64_t p = 0; p < lin->parts; p++) {
        const ms_step_part *part = lin->part + p;
        if (p == 0 || ms_gguf_acts_key((int)part->type) != ms_gguf_acts_key((int)lin->part[p - 1].type)) {
            #pragma omp single
            ms_gguf_team_quantize((int)part->type, x, rows, in, b->block_scratch);
        }
        ms_gguf_team_tiles((int)part->type, rows, in, part->data, part->row_bytes, part->rows, b->wide + column, out,
                           b->block_scratch);
        column += part->rows;
    }
    #pragma omp for schedule(static)
    for (int64_t i = 0; i < rows * out; i++)
        y[i] = f32_to_bf16(lin->bias ? b->wide[i] + lin->bias[i % out] : b->wide[i]);
}

/* x += y in bf16, as torch's x.add_(y): the float sum rounded once. */
static void add_into(uint16_t *x, const uint16_t *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = f32_to_bf16(bf16_to_f32(x[i]) + bf16_to_f32(y[i]));
}

static void buffers_free(step_buffers *b) {
    free(b->h);
    free(b->scratch);
    free(b->block_scratch);
    free(b->wide);
}

static int buffers_alloc(const ms_step_model *m, int64_t rows, int64_t head_rows, step_buffers *b) {
    const int64_t q = m->heads * m->head_dim, kv = m->kv_heads * m->head_dim;
    int64_t widest = m->hidden > m->intermediate ? m->hidden : m->intermediate;
    widest = widest > q ? widest : q;
    int64_t outputs = q + 2 * kv > 2 * m->intermediate ? q + 2 * kv : 2 * m->intermediate;
    outputs = rows * outputs > head_rows * m->vocab ? rows * outputs : head_rows * m->vocab;
    b->h = malloc(sizeof(uint16_t) * (size_t)(rows * (m->hidden + (q + 2 * kv) + q + m->hidden
                                                      + 2 * m->intermediate + m->intermediate)
                                              + head_rows * m->vocab));
    b->scratch = malloc((size_t)ms_q8_team_scratch(rows, widest));
    b->block_scratch = m->gguf ? aligned_alloc(64, (size_t)(ms_gguf_team_scratch(rows, widest) + 63) / 64 * 64) : NULL;
    b->wide = m->gguf ? malloc(sizeof(float) * (size_t)(outputs > rows * m->hidden ? outputs : rows * m->hidden)) : NULL;
    if (!b->h || !b->scratch || (m->gguf && (!b->block_scratch || !b->wide))) {
        buffers_free(b);
        return 1;
    }
    b->qkv = b->h + rows * m->hidden;
    b->attn = b->qkv + rows * (q + 2 * kv);
    b->y = b->attn + rows * q;
    b->gate_up = b->y + rows * m->hidden;
    b->act = b->gate_up + rows * 2 * m->intermediate;
    b->logits = b->act + rows * m->intermediate;
    return 0;
}

/* The attention half's middle, one kv head per thread: rotate its query group and key in every
 * row (rotary is per head, so a head's share equals ms_rotary_bf16 over all of them), store the
 * rows' k, v, attend each row causally. Every thread calls it. */
static int attend_all(const ms_step_model *m, const step_buffers *b, kv_rows kv, int64_t pos0, int64_t rows,
                      const uint16_t *cos, const uint16_t *sin) {
    const int64_t dim = m->head_dim, group = m->heads / m->kv_heads, q_size = m->heads * dim;
    const int64_t kv_size = m->kv_heads * dim, stride = q_size + 2 * kv_size;
    const float scale = (float)(1.0 / sqrt((double)dim));   /* as engine.ops.c_calls passes it */
    int status = 0;
    #pragma omp for schedule(static)
    for (int64_t h = 0; h < m->kv_heads; h++) {
        uint16_t *q = b->qkv + h * group * dim, *k = b->qkv + q_size + h * dim;
        ms_rotary_bf16(q, rows, stride, group, dim, cos, sin);
        ms_rotary_bf16(k, rows, stride, 1, dim, cos, sin);
        status |= ms_attend_tokens(&kv, h, pos0, rows, q, stride, k, k + kv_size, stride, group, dim, scale,
                                   b->attn + h * group * dim, q_size);
    }
    return status;
}

/* The same for a decode-only batch: row t is the one new token of its own sequence, at
 * positions[t], whose block table is tables[t * max_blocks ..]. The team rotates every row's
 * heads (a kv head's group and key per thread), then each (row, kv head) pair stores the row's
 * k, v in its slot and attends over the row's positions, as ms_paged_attend_bf16 does. */
static int attend_batch(const ms_step_model *m, const step_buffers *b, kv_rows kv, const int64_t *positions,
                        const int64_t *tables, int64_t max_blocks, int64_t rows, const uint16_t *cos,
                        const uint16_t *sin) {
    const int64_t dim = m->head_dim, group = m->heads / m->kv_heads, q_size = m->heads * dim;
    const int64_t kv_size = m->kv_heads * dim, stride = q_size + 2 * kv_size;
    const float scale = (float)(1.0 / sqrt((double)dim));
    int status = 0;
    #pragma omp for schedule(static)
    for (int64_t h = 0; h < m->kv_heads; h++) {
        ms_rotary_bf16(b->qkv + h * group * dim, rows, stride, group, dim, cos, sin);
        ms_rotary_bf16(b->qkv + q_size + h * dim, rows, stride, 1, dim, cos, sin);
    }
    #pragma omp for collapse(2) schedule(static)
    for (int64_t t = 0; t < rows; t++) {
        for (int64_t h = 0; h < m->kv_heads; h++) {
            if (positions[t] / kv.block_size >= max_blocks) {
                status |= 1;
                continue;
            }
            kv_rows own = kv;
            own.table = tables + t * max_blocks;
            const uint16_t *k = b->qkv + t * stride + q_size + h * dim;
            status |= ms_attend_head(&own, h, positions[t], b->qkv + t * stride + h * group * dim, k, k + kv_size,
                                     group, dim, scale, b->attn + t * q_size + h * group * dim);
        }
    }
    return status;
}

/* `rows` consecutive tokens of one sequence (a decode token, or a verify step's pending token
 * and drafts) through every layer, the final norm and the head. x: their embedding rows
 * [rows, hidden] (bf16), left holding the final hidden states. precise: two-byte activations
 * (q8.c's `precise`). keys / values: a contiguous cache [layers, kv_heads, capacity, dim] (table
 * NULL) or a paged pool [num_blocks, layers, block_size, kv_heads, dim] read through `table`
 * (the sequence's block table). The tokens sit at pos0..; cos / sin: their rotary rows [rows,
 * dim]. logits: float32 [rows - head_from, vocab], the head's bf16 outputs of rows head_from..
 * widened. positions (not NULL): a decode-only batch instead, row t one token of its own sequence
 * at positions[t] with block table table[t * max_blocks ..] of the paged pool (attend_batch).
 * arrived (not NULL): read before each layer; when *arrived < rank the step stops there and
 * returns 4 (a request of a better class came in: engine.batching.arrivals). Nothing it wrote
 * matters then: the caller counts nothing computed, and the k, v it stored are written again.
 * Returns 0, 1 when memory runs out or a position lies past its table, 2 for more than 64
 * query heads per kv head, 4 when it stopped for an arrival. */
int ms_decode_step(const ms_step_model *m, uint16_t *x, int64_t rows, int precise, uint16_t *keys,
                   uint16_t *values, int64_t capacity, const int64_t *table, int64_t block_size, int64_t pos0,
                   const uint16_t *cos, const uint16_t *sin, int64_t head_from, float *logits, int threads,
                   const int64_t *positions, int64_t max_blocks, const volatile int32_t *arrived, int32_t rank) {
    if (positions && !table) return 3;
    if (m->heads / m->kv_heads > 64) return 2;
    if (rows <= 0 || head_from < 0 || head_from >= rows) return 3;
    const int64_t head_rows = rows - head_from, hidden = m->hidden;
    step_buffers b;
    if (buffers_alloc(m, rows, head_rows, &b)) return 1;
    const int64_t layer_elems = m->kv_heads * capacity * m->head_dim;
    int status = 0, stop = 0;
    #pragma omp parallel num_threads(threads > 0 ? threads : omp_get_max_threads())
    {
        for (int64_t l = 0; l < m->layers; l++) {
            const ms_step_layer *L = m->layer + l;
            #pragma omp single
            {
                stop = arrived != NULL && *arrived < rank;   /* every thread reads it after the barrier */
                if (l > 0) add_into(x, b.y, rows * hidden);   /* the previous layer's MLP residual */
                ms_rms_norm_bf16(x, L->input_norm, b.h, rows, hidden, m->eps, (int)m->torch_lanes);
            }
            if (stop) break;
            linear(&L->qkv, b.h, b.qkv, rows, precise, &b);
            kv_rows kv = {keys, values, capacity, table, m->layers, l, block_size, m->kv_heads};
            if (!table) kv.keys += l * layer_elems, kv.values += l * layer_elems;
            int failed = positions ? attend_batch(m, &b, kv, positions, table, max_blocks, rows, cos, sin)
                                   : attend_all(m, &b, kv, pos0, rows, cos, sin);
            if (failed) {
                #pragma omp atomic
                status |= failed;
            }
            linear(&L->o, b.attn, b.y, rows, precise, &b);
            #pragma omp single
            {
                add_into(x, b.y, rows * hidden);
                ms_rms_norm_bf16(x, L->post_norm, b.h, rows, hidden, m->eps, (int)m->torch_lanes);
            }
            linear(&L->gate_up, b.h, b.gate_up, rows, precise, &b);
            #pragma omp single
            ms_silu_mul_bf16(b.gate_up, b.act, rows, m->intermediate);
            linear(&L->down, b.act, b.y, rows, precise, &b);
        }
        if (!stop) {
        #pragma omp single
        {
            if (m->layers > 0) add_into(x, b.y, rows * hidden);
            ms_rms_norm_bf16(x + head_from * hidden, m->norm, b.h, head_rows, hidden, m->eps, (int)m->torch_lanes);
        }
        linear(&m->head, b.h, b.logits, head_rows, precise, &b);
        #pragma omp for schedule(static)
        for (int64_t i = 0; i < head_rows * m->vocab; i++) logits[i] = bf16_to_f32(b.logits[i]);
        }
    }
    buffers_free(&b);
    return stop ? 4 : status;
}
