// The interface of gptkit's native decoding step: the structs gptkit.native mirrors in ctypes
// (Matrix, Layer, Step; their sizes checked at load by gptkit_struct_sizes) and the codes of a
// matrix's format. Part of decode_step.cpp's one translation unit.

#pragma once

#include <cstdint>

// The interface's version: gptkit.native.ABI must equal it (a library of another is rebuilt).
#define GPTKIT_ABI 3

extern "C" {

// One weight matrix (out, in), row-major.
struct Matrix {
    const void* weight;      // float (fp32), uint16_t (bf16) or int8_t (int8)
    const float* bias;       // (out,) or null
    const float* scale;      // int8: one scale per output row
    const int32_t* row_sum;  // int8: the sum of each row's integers (for the activations' zero point)
    int32_t out, in;
};

struct Layer {
    const float *ln1_weight, *ln1_bias, *ln2_weight, *ln2_bias;
    Matrix qkv, attn_out, fc, mlp_out;
};

struct Step {
    int32_t n_layer, rows, d_model, n_head;
    int32_t capacity, past;     // the cache's positions, and how many are filled before this step
    int32_t cache_rows;         // rows the cache holds (>= rows: a server's cache has a slot per sequence)
    int32_t pre_ln;             // 1: GPT-2 (x + f(LN(x)), a final LN); 0: GPT-1 (LN(x + f(x)))
    int32_t activation;         // 0 gelu (tanh approximation), 1 gelu (erf), 2 relu
    int32_t format;             // the matrices': FP32, BF16 or INT8
    float eps;                  // the LayerNorms' epsilon
    const Layer* layers;
    const float *lnf_weight, *lnf_bias;  // GPT-2's final LayerNorm; null for GPT-1
    float* keys;                // (n_layer, cache_rows, n_head, capacity, head_size), fp32; rows 0..rows-1 used
    float* values;
    const uint8_t* mask;        // (rows, past + 1): 1 a real token, 0 padding; null: every one real
    float* x;                   // (rows, d_model): in h_0 of the new tokens, out h_n
};

}  // extern "C"

namespace {

// Step.format, the matrices' storage (gptkit.native.FORMATS mirrors it).
enum Format { FP32 = 0, BF16 = 1, INT8 = 2 };

}  // namespace
