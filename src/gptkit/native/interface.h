// The interface of gptkit's native kernels: the structs gptkit.native mirrors in ctypes (Matrix,
// Layer, Step; their sizes checked at load by gptkit_struct_sizes) and the codes of a matrix's and a
// cache's format. Part of decode_step.cpp's one translation unit.

#pragma once

#include <cstdint>

// The interface's version: gptkit.native.ABI must equal it (a library of another is rebuilt).
#define GPTKIT_ABI 4

extern "C" {

// One weight matrix W (out, in) in panels: 16 output rows at a time, their inputs in groups of g
// consecutive values (g = 1 fp32, 2 bf16, 4 int8), stored [panel][group][16 outputs][g], the last
// panel padded with zeros, and the groups (bf16, int8) to a multiple of 16. A product then reads each panel once, front to back, for
// every row of activations at once, and its sums need no horizontal add (gptkit.native.pack).
struct Matrix {
    const void* weight;      // the panels: float (fp32), uint16_t (bf16) or int8_t (int8)
    const float* bias;       // (out,) or null
    const float* scale;      // int8: one scale per output row (w ≈ scale · q), padded to the panels
    const int32_t* row_sum;  // int8: the sum of each row's integers (for the activations' zero point)
    int32_t out, in;
};

struct Layer {
    const float *ln1_weight, *ln1_bias, *ln2_weight, *ln2_bias;
    Matrix qkv, attn_out, fc, mlp_out;
};

// One call: every block (and GPT-2's final LayerNorm, and the output layer for the tokens asked)
// for `tokens` new tokens, each of its own sequence at its own cache column. A decoding step is one
// token a sequence; a prompt (or a chunk of one) is several tokens of one sequence, which attend to
// each other causally; the two mix freely in one call.
struct Step {
    int32_t n_layer, d_model, n_head;
    int32_t pre_ln;             // 1: GPT-2 (x + f(LN(x)), a final LN); 0: GPT-1 (LN(x + f(x)))
    int32_t activation;         // 0 gelu (tanh approximation), 1 gelu (erf), 2 relu
    int32_t format;             // the matrices': FP32, BF16 or INT8
    float eps;                  // the LayerNorms' epsilon
    const Layer* layers;
    const float *lnf_weight, *lnf_bias;  // GPT-2's final LayerNorm; null for GPT-1
    // The tokens.
    int32_t tokens;
    float* x;                   // (tokens, d_model): in h_0, out h_n
    const int32_t* sequence;    // (tokens,): the row of block_table (and of mask) of each token
    const int32_t* column;      // (tokens,): where its k and v are written; it attends to 0..column
    // The keys and values, in pages of page_size columns.
    void* keys;                 // (n_layer, pages, n_head, page_size, head_size), fp32 or bf16
    void* values;
    int32_t cache_format;       // FP32 or BF16
    int32_t pages, page_size;
    const int32_t* block_table; // (sequences, table_width): the page of each page_size columns
    int32_t table_width;
    const uint8_t* mask;        // (sequences, mask_width): 0 a padding column; null: every one real
    int32_t mask_width;
    // The output layer, for some of the tokens (lm_head null: none).
    const Matrix* lm_head;
    int32_t lm_format;
    int32_t n_logits;
    const int32_t* logit_tokens;  // (n_logits,): the tokens whose logits are computed
    float* logits;                // (n_logits, lm_head.out)
    int32_t n_choosable;          // argmax among ids 0..n_choosable-1
    int32_t* argmax;              // (n_logits,) the most likely id of each; null: not computed
};

}  // extern "C"

namespace {

// Step.format and Step.lm_format, a matrix's storage, and Step.cache_format (gptkit.native.FORMATS
// mirrors them).
enum Format { FP32 = 0, BF16 = 1, INT8 = 2 };

// Output rows a panel holds.
constexpr int PANEL = 16;

// Inputs in a group of a panel: what one lane's dot-product instruction takes at a time.
inline int group_size(int format) { return format == INT8 ? 4 : format == BF16 ? 2 : 1; }
// The groups of a panel: bf16's and int8's padded to a multiple of 16, a matrix unit's tile.
inline int groups_of(int in, int format) {
    const int groups = (in + group_size(format) - 1) / group_size(format);
    return format == FP32 ? groups : (groups + 15) / 16 * 16;
}
inline int panels_of(int out) { return (out + PANEL - 1) / PANEL; }

}  // namespace
