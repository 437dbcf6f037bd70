// gptkit's native decoding step: one call runs every block of a GPT for the one new token of each
// row, reading each weight matrix once, with no interpreter or per-operator overhead in between.
//
// A decoding step multiplies a few vectors by every matrix of the model, so its speed is bounded by
// how fast the weights stream from memory. What sits between the products (LayerNorms, attention
// over the cache, GELU, the residual adds) is small work, but done as ~20 PyTorch operators a block
// it cost more than the products themselves for a small model. Here it is a few loops.
//
// Built on the user's machine by gptkit.native (g++ -O3 -march=native -fopenmp): the products use
// AVX-512 or AVX2 intrinsics when the compiler targets them, plain loops otherwise. OpenMP splits
// each product's output rows between the cores; libgomp is PyTorch's own once torch is imported,
// so the two share one thread pool.
//
// Three weight formats: fp32 or bf16 matrices as nn.Linear holds them (out, in), bf16 widened to
// fp32 as it is read, and int8 matrices with one fp32 scale per output row (w ≈ scale · q). The
// activations, sums, LayerNorms, attention and cache are fp32 in all three. An int8 product
// quantizes the activations as it goes, per row, to 7-bit unsigned integers with a zero point (the
// scheme of PyTorch's dynamically quantized linear with reduce_range, whose integer sums never
// saturate AVX2's 16-bit pair sums), then multiplies integers.
//
// The step is one translation unit: this file (a step's phases on the team, and the exported
// functions) and the headers beside it, each in an unnamed namespace, included in the order they
// build on: interface.h (the structs gptkit.native mirrors), vectors.h (the dot products on this
// CPU's vectors), elementwise.h (GELU, exp, LayerNorm), team.h (the threads and their barrier),
// products.h (the products per format) and attention.h (attention over the cache). gptkit.native
// compiles this file alone; its cache key covers every file here.

#include <algorithm>
#include <cstdint>
#include <vector>

#include "interface.h"
#include "vectors.h"
#include "elementwise.h"
#include "team.h"
#include "products.h"
#include "attention.h"

namespace {

// What a step shares between its threads, kept between calls (a step allocates nothing once warm).
struct Scratch {
    std::vector<float> normed, qkv, heads, hidden, scores;
    QuantizedRows quantized;
};

// One product of a step, on every thread of the team: an int8 product's input quantized first (by
// one thread), then each thread its band of output rows, its part of the results activated if
// asked (activation >= 0); the team waits for every band before the next phase.
void team_product(const Team& team, int format, const Matrix& m, const float* x, int rows, float* y,
                  Epilogue epilogue, Scratch& scratch, int activation = -1) {
    if (format == INT8) {
        if (team.thread == 0) scratch.quantized.quantize(x, rows, m.in);
        team.barrier();
    }
    int begin, end;
    team.share(m.out, begin, end);
    if (format == INT8)
        product_int8(m, scratch.quantized, rows, y, epilogue, begin, end);
    else if (format == BF16)
        product_float<uint16_t>(m, x, rows, y, epilogue, begin, end);
    else
        product_float<float>(m, x, rows, y, epilogue, begin, end);
    if (activation >= 0)
        for (int r = 0; r < rows; ++r) activate(y + size_t(r) * m.out + begin, end - begin, activation);
    team.barrier();
}

// LayerNorm of every row, by one thread (a few rows of d_model: not worth splitting).
void norm_rows(const Team& team, const Step& s, const float* x, float* y, const float* gain, const float* bias) {
    if (team.thread == 0)
        for (int r = 0; r < s.rows; ++r)
            layer_norm(x + size_t(r) * s.d_model, y + size_t(r) * s.d_model, s.d_model, gain, bias, s.eps);
    team.barrier();
}

void size_scratch(const Step& s, Scratch& scratch, int threads) {
    const size_t rows = s.rows, d = s.d_model;
    size_t widest = 3 * d;
    for (int l = 0; l < s.n_layer; ++l) widest = std::max(widest, size_t(s.layers[l].fc.out));
    scratch.normed.resize(rows * d);
    scratch.qkv.resize(rows * 3 * d);
    scratch.heads.resize(rows * d);
    scratch.hidden.resize(rows * widest);
    scratch.scores.resize(size_t(threads) * (s.past + 1));
    scratch.quantized.values.resize(rows * widest);  // sized here: a thread never resizes mid-step
    scratch.quantized.params.resize(rows);
}

// The team a call runs on: the threads asked for (at least one), one without OpenMP.
int team_size(int32_t threads) {
#ifdef _OPENMP
    return std::max(1, int(threads));
#else
    (void)threads;
    return 1;
#endif
}

}  // namespace

extern "C" {

// The sizes of the structs as compiled, for the Python side to check its mirror of them against.
int32_t gptkit_struct_sizes(int32_t which) {
    switch (which) {
        case 0: return sizeof(Matrix);
        case 1: return sizeof(Layer);
        case 2: return sizeof(Step);
        default: return -1;
    }
}

// One step: s.x holds h_0 of the new token of each row; on return h_n (after GPT-2's final
// LayerNorm), with every layer's k and v of the new token written at position s.past of the cache.
void gptkit_decode_step(const Step* step, int32_t threads) {
    const Step& s = *step;
    threads = team_size(threads);
    // The calling thread's scratch, shared with the team by reference (inside the region the name
    // of a thread_local would be each thread's own).
    static thread_local Scratch own;
    Scratch& scratch = own;
    size_scratch(s, scratch, threads);
    const int rows = s.rows, format = s.format;
    float* x = s.x;
    float* normed = scratch.normed.data();
    float* qkv = scratch.qkv.data();
    float* heads = scratch.heads.data();
    float* hidden = scratch.hidden.data();
    in_team(threads, [&](const Team& team) {
        for (int l = 0; l < s.n_layer; ++l) {
            const Layer& layer = s.layers[l];
            if (s.pre_ln) {  // GPT-2: x + attn(LN(x)), then x + mlp(LN(x))
                norm_rows(team, s, x, normed, layer.ln1_weight, layer.ln1_bias);
                team_product(team, format, layer.qkv, normed, rows, qkv, STORE, scratch);
                attend(team, s, l, qkv, heads, scratch.scores.data());
                team_product(team, format, layer.attn_out, heads, rows, x, ADD, scratch);
                norm_rows(team, s, x, normed, layer.ln2_weight, layer.ln2_bias);
                team_product(team, format, layer.fc, normed, rows, hidden, STORE, scratch, s.activation);
                team_product(team, format, layer.mlp_out, hidden, rows, x, ADD, scratch);
            } else {  // GPT-1: LN(x + attn(x)), then LN(x + mlp(x))
                team_product(team, format, layer.qkv, x, rows, qkv, STORE, scratch);
                attend(team, s, l, qkv, heads, scratch.scores.data());
                team_product(team, format, layer.attn_out, heads, rows, x, ADD, scratch);
                norm_rows(team, s, x, x, layer.ln1_weight, layer.ln1_bias);
                team_product(team, format, layer.fc, x, rows, hidden, STORE, scratch, s.activation);
                team_product(team, format, layer.mlp_out, hidden, rows, x, ADD, scratch);
                norm_rows(team, s, x, x, layer.ln2_weight, layer.ln2_bias);
            }
        }
        if (s.lnf_weight) norm_rows(team, s, x, x, s.lnf_weight, s.lnf_bias);
    });
}

// y = x·Wᵀ + b for `rows` rows of x (rows, in) into y (rows, out), W in `format`: the output layer
// of a step, and int8 matrices' products for any number of rows.
void gptkit_product(const Matrix* m, int32_t format, const float* x, int32_t rows, float* y, int32_t threads) {
    threads = team_size(threads);
    static thread_local Scratch own;
    Scratch& scratch = own;  // the caller's, shared with the team
    if (format == INT8 && rows >= TILE) {
        scratch.quantized.quantize(x, rows, m->in, threads);
        product_int8_tiled(*m, scratch.quantized, rows, y, threads);
        last_team_size.store(threads, std::memory_order_relaxed);
        return;
    }
    scratch.quantized.values.resize(size_t(rows) * m->in);
    scratch.quantized.params.resize(rows);
    in_team(threads, [&](const Team& team) { team_product(team, format, *m, x, rows, y, STORE, scratch); });
}

// The threads of the last team that ran (for the tests: the kernels follow the count asked for).
int32_t gptkit_last_team_size() { return last_team_size.load(std::memory_order_relaxed); }

// What this library was built with, as one line (also found in the file's bytes by gptkit.native,
// which reads it before loading a cached library): its interface version, the sources' hash and
// the compiler flags (both passed in by the build), the vector code compiled in for fp32/bf16 and
// for int8, and OpenMP's version (0: none, one thread).
#ifndef GPTKIT_SOURCE_HASH
#define GPTKIT_SOURCE_HASH "unknown"
#endif
#ifndef GPTKIT_FLAGS
#define GPTKIT_FLAGS "unknown"
#endif
#define GPTKIT_STRINGIFY_(x) #x
#define GPTKIT_STRINGIFY(x) GPTKIT_STRINGIFY_(x)
#if defined(GPTKIT_FLOAT_VECTORS) && defined(__AVX512F__)
#define GPTKIT_FLOAT_ISA "avx512"
#elif defined(GPTKIT_FLOAT_VECTORS)
#define GPTKIT_FLOAT_ISA "avx2"
#else
#define GPTKIT_FLOAT_ISA "generic"
#endif
#if defined(GPTKIT_INT_VECTORS) && defined(__AVX512VNNI__)
#define GPTKIT_INT_ISA "avx512-vnni"
#elif defined(GPTKIT_INT_VECTORS) && defined(__AVX512BW__)
#define GPTKIT_INT_ISA "avx512bw"
#elif defined(GPTKIT_INT_VECTORS) && defined(__AVXVNNI__)
#define GPTKIT_INT_ISA "avx-vnni"
#elif defined(GPTKIT_INT_VECTORS)
#define GPTKIT_INT_ISA "avx2"
#else
#define GPTKIT_INT_ISA "generic"
#endif
#ifdef _OPENMP
#define GPTKIT_OPENMP GPTKIT_STRINGIFY(_OPENMP)
#else
#define GPTKIT_OPENMP "0"
#endif
__attribute__((used)) const char gptkit_build_info_text[] =
    "gptkit-native-build abi=" GPTKIT_STRINGIFY(GPTKIT_ABI) " source=" GPTKIT_SOURCE_HASH " isa=" GPTKIT_FLOAT_ISA
    " int8=" GPTKIT_INT_ISA " openmp=" GPTKIT_OPENMP " flags=" GPTKIT_FLAGS;

const char* gptkit_build_info() { return gptkit_build_info_text; }

}  // extern "C"
