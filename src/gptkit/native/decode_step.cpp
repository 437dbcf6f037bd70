// gptkit's native inference step: one call runs every block of a GPT (and the output layer, and
// greedy decoding's argmax) for a set of new tokens, each of its own sequence, reading each weight
// matrix once for all of them, with no interpreter or per-operator overhead in between.
//
// A decoding step multiplies a few vectors by every matrix of the model, so its speed is bounded by
// how fast the weights stream from memory; a step of many sequences, or a prompt, by how fast the
// cores multiply. The products (panels.h, kernels.h) read packed panels of 16 outputs, a block of
// rows against a block of panels in registers, so that both bounds are approached; what sits
// between them (LayerNorms, attention over the cache, GELU, the residual adds) is a few loops here,
// where as ~20 PyTorch operators a block it cost more than the products for a small model.
//
// The tokens of one call: a server's step mixes one token of each decoding sequence with a chunk
// of a prompt; a prompt alone is its tokens; each token has its sequence (a row of the block table
// of the paged cache) and its column, and attends to its sequence's columns up to its own.
//
// Built on the user's machine by gptkit.native (g++ -O3 -march=native -fopenmp): AVX-512 (with
// VNNI and the bf16 dot product where the CPU has them) or AVX2 intrinsics when the compiler
// targets them, plain loops otherwise. The whole call is one OpenMP parallel region (team.h);
// libgomp is PyTorch's own once torch is imported, so the two share one thread pool.
//
// Three weight formats: fp32, bf16 (activations rounded to bf16 for the product, sums in fp32) and
// int8 with one fp32 scale per output row (w ≈ scale · q; activations rounded per row to 7 bits).
// The hidden states, LayerNorms and attention are fp32 in all three; the cache fp32 or bf16.
//
// The step is one translation unit: this file (a step's phases on the team, and the exported
// functions) and the headers beside it, each in an unnamed namespace: interface.h (the structs
// gptkit.native mirrors), vectors.h (this CPU's vectors), elementwise.h (GELU, exp, LayerNorm),
// team.h (the threads and their barrier), panels.h and kernels.h (the products) and attention.h
// (attention over the paged cache). gptkit.native compiles this file alone; its cache key covers
// every file here.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "interface.h"
#include "vectors.h"
#include "elementwise.h"
#include "team.h"
#include "panels.h"
#include "attention.h"

namespace {

// What a call shares between its threads, kept between calls (a step allocates nothing once warm).
struct Scratch {
    std::vector<float> normed, qkv, heads, hidden, scores, gathered, best;
    std::vector<int32_t> best_at;
    Staged staged;
};

// One product on every thread of the team: the input staged for the format (each thread its rows),
// then each thread its band of panels; the team waits for every band before the next phase.
// `argmax` (the output layer): each thread also keeps its band's largest choosable result a row.
void team_product(const Team& team, int format, const Matrix& m, const float* x, int rows, float* y,
                  Epilogue epilogue, Scratch& scratch, int activation = -1, int argmax_of = 0) {
    int begin, end;
    if (format != FP32) {
        team.share(rows, begin, end);
        scratch.staged.stage(format, x, m.in, begin, end);
        team.barrier();
    }
    Product product{m, rows, groups_of(m.in, format), x, &scratch.staged, y, epilogue, activation};
    if (argmax_of > 0) {
        product.best = scratch.best.data() + size_t(team.thread) * rows;
        product.best_at = scratch.best_at.data() + size_t(team.thread) * rows;
        product.choosable = argmax_of;
        std::fill(product.best, product.best + rows, -INFINITY);
        std::fill(product.best_at, product.best_at + rows, 0);
    }
    team.share(panels_of(m.out), begin, end);
    product_panels(format, product, begin, end);
    team.barrier();
}

// LayerNorm of every row (d values), the rows split between the team.
void norm_rows(const Team& team, const Step& s, const float* x, float* y, const float* gain, const float* bias) {
    int begin, end;
    team.share(s.tokens, begin, end);
    for (int r = begin; r < end; ++r)
        layer_norm(x + size_t(r) * s.d_model, y + size_t(r) * s.d_model, s.d_model, gain, bias, s.eps);
    team.barrier();
}

// The widest row of attention scores any token of the step needs.
int widest_columns(const Step& s) {
    int columns = 1;
    for (int t = 0; t < s.tokens; ++t) columns = std::max(columns, s.column[t] + 1);
    return columns;
}

void size_scratch(const Step& s, Scratch& scratch, int threads) {
    const size_t rows = std::max(s.tokens, s.n_logits), d = s.d_model;
    size_t widest = 3 * d;
    int groups = groups_of(d, s.format);
    for (int l = 0; l < s.n_layer; ++l) {
        widest = std::max(widest, size_t(s.layers[l].fc.out));
        groups = std::max(groups, groups_of(s.layers[l].mlp_out.in, s.format));
    }
    if (s.lm_head) groups = std::max(groups, groups_of(s.lm_head->in, s.lm_format));
    scratch.normed.resize(rows * d);
    scratch.qkv.resize(rows * 3 * d);
    scratch.heads.resize(rows * d);
    scratch.hidden.resize(rows * widest);
    scratch.gathered.resize(size_t(s.n_logits) * d);
    scratch.best.resize(size_t(threads) * s.n_logits);
    scratch.best_at.resize(size_t(threads) * s.n_logits);
    scratch.scores.resize(size_t(threads) * widest_columns(s));
    scratch.staged.size(int(rows), groups);  // sized here: a thread never resizes mid-step
}

// One block for every token: GPT-2's x + attn(LN(x)), then x + mlp(LN(x)); GPT-1's LN(x + attn(x)),
// then LN(x + mlp(x)).
void block(const Team& team, const Step& s, int l, Scratch& scratch, int columns) {
    const Layer& layer = s.layers[l];
    const int rows = s.tokens, format = s.format;
    float *x = s.x, *normed = scratch.normed.data(), *qkv = scratch.qkv.data();
    float *heads = scratch.heads.data(), *hidden = scratch.hidden.data();
    const float* input = x;
    if (s.pre_ln) {
        norm_rows(team, s, x, normed, layer.ln1_weight, layer.ln1_bias);
        input = normed;
    }
    team_product(team, format, layer.qkv, input, rows, qkv, STORE, scratch);
    store_keys(team, s, l, qkv);
    attend(team, s, l, qkv, heads, scratch.scores.data(), columns);
    team_product(team, format, layer.attn_out, heads, rows, x, ADD, scratch);
    if (s.pre_ln) {
        norm_rows(team, s, x, normed, layer.ln2_weight, layer.ln2_bias);
    } else {
        norm_rows(team, s, x, x, layer.ln1_weight, layer.ln1_bias);
        input = x;
    }
    team_product(team, format, layer.fc, input, rows, hidden, STORE, scratch, s.activation);
    team_product(team, format, layer.mlp_out, hidden, rows, x, ADD, scratch);
    if (!s.pre_ln) norm_rows(team, s, x, x, layer.ln2_weight, layer.ln2_bias);
}

// The output layer for the tokens asked, and the most likely choosable id of each: the largest
// result as the product writes them (a plain pass over the logits afterwards took as long as the
// product for a step of 64 sequences), each thread's band, then the bands in order, the first of
// equal largest kept.
void output_layer(const Team& team, const Step& s, Scratch& scratch) {
    const int d = s.d_model, n = s.n_logits;
    int begin, end;
    team.share(n, begin, end);
    for (int i = begin; i < end; ++i)
        std::memcpy(scratch.gathered.data() + size_t(i) * d, s.x + size_t(s.logit_tokens[i]) * d, d * sizeof(float));
    team.barrier();
    const int choosable = s.argmax ? std::min(s.n_choosable, s.lm_head->out) : 0;
    team_product(team, s.lm_format, *s.lm_head, scratch.gathered.data(), n, s.logits, STORE, scratch, -1, choosable);
    if (!s.argmax) return;
    for (int i = begin; i < end; ++i) {
        int32_t at = 0;
        float top = -INFINITY;
        for (int t = 0; t < team.threads; ++t)
            if (scratch.best[size_t(t) * n + i] > top) {
                top = scratch.best[size_t(t) * n + i];
                at = scratch.best_at[size_t(t) * n + i];
            }
        s.argmax[i] = at;
    }
    team.barrier();
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

// One step: s.x holds h_0 of each new token; on return h_n (after GPT-2's final LayerNorm), with
// every layer's k and v of each token written at its column of the cache, and the logits (and
// their argmax) of the tokens asked.
void gptkit_step(const Step* step, int32_t threads) {
    const Step& s = *step;
    threads = team_size(threads);
    // The calling thread's scratch, shared with the team by reference (inside the region the name
    // of a thread_local would be each thread's own).
    static thread_local Scratch own;
    Scratch& scratch = own;
    size_scratch(s, scratch, threads);
    const int columns = widest_columns(s);
    in_team(threads, [&](const Team& team) {
        for (int l = 0; l < s.n_layer; ++l) block(team, s, l, scratch, columns);
        if (s.lnf_weight) norm_rows(team, s, s.x, s.x, s.lnf_weight, s.lnf_bias);
        if (s.lm_head && s.n_logits > 0) output_layer(team, s, scratch);
    });
}

// y = x·Wᵀ + b for `rows` rows of x (rows, in) into y (rows, out), W in `format`.
void gptkit_product(const Matrix* m, int32_t format, const float* x, int32_t rows, float* y, int32_t threads) {
    threads = team_size(threads);
    static thread_local Scratch own;
    Scratch& scratch = own;  // the caller's, shared with the team
    scratch.staged.size(rows, groups_of(m->in, format));
    in_team(threads, [&](const Team& team) { team_product(team, format, *m, x, rows, y, STORE, scratch); });
}

// The threads of the last team that ran (for the tests: the kernels follow the count asked for).
int32_t gptkit_last_team_size() { return last_team_size.load(std::memory_order_relaxed); }

// What this library was built with, as one line (also found in the file's bytes by gptkit.native,
// which reads it before loading a cached library): its interface version, the sources' hash and
// the compiler flags (both passed in by the build), the vector code compiled in for fp32, for bf16
// and for int8, and OpenMP's version (0: none, one thread).
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
#if defined(GPTKIT_BF16_DOT)
#define GPTKIT_BF16_ISA "avx512-bf16"
#elif defined(GPTKIT_FLOAT_VECTORS)
#define GPTKIT_BF16_ISA "widened"
#else
#define GPTKIT_BF16_ISA "generic"
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
    " bf16=" GPTKIT_BF16_ISA " int8=" GPTKIT_INT_ISA " openmp=" GPTKIT_OPENMP " flags=" GPTKIT_FLAGS;

const char* gptkit_build_info() { return gptkit_build_info_text; }

}  // extern "C"
