// The register blocks of the panel products (panels.h): one kernel a format and vector unit, each a
// block of NR rows × NP panels whose sums stay in registers over all the inputs. R and P are the
// largest block a kernel takes: as many sums as the vector registers hold beside the weights loaded
// for one step. Part of decode_step.cpp's one translation unit, included by panels.h.

#pragma once

#include <cstdint>

#include "interface.h"
#include "vectors.h"

namespace {

#ifdef GPTKIT_FLOAT_VECTORS
constexpr int FVECS = PANEL / FVEC_LANES;  // vectors of a panel's 16 sums
constexpr bool WIDE = FVEC_LANES == 16;      // 32 registers (AVX-512) rather than 16 (AVX2)

// fp32: each input broadcast against P panels' 16 weights.
struct Fp32Panels {
    static constexpr int R = WIDE ? 6 : 2, P = WIDE ? 4 : 2;
    const Product& p;

    template <int NR, int NP>
    void block(int r0, int p0) const {
        const float* w = static_cast<const float*>(p.m.weight) + size_t(p0) * p.panel_stride();
        const float* x[NR];
        for (int r = 0; r < NR; ++r) x[r] = p.x + size_t(r0 + r) * p.m.in;
        fvec acc[NR][NP][FVECS];
        for (auto& row : acc)
            for (auto& panel : row)
                for (auto& v : panel) v = fvec_zero();
        for (int k = 0; k < p.groups; ++k) {
            fvec wv[NP][FVECS];
            for (int j = 0; j < NP; ++j)
                for (int v = 0; v < FVECS; ++v) wv[j][v] = lanes(w + j * p.panel_stride() + k * PANEL + v * FVEC_LANES);
            for (int r = 0; r < NR; ++r) {
                const fvec xb = fvec_set1(x[r][k]);
                for (int j = 0; j < NP; ++j)
                    for (int v = 0; v < FVECS; ++v) acc[r][j][v] = fvec_fma(xb, wv[j][v], acc[r][j][v]);
            }
        }
        float sums[PANEL];
        for (int r = 0; r < NR; ++r)
            for (int j = 0; j < NP; ++j) {
                for (int v = 0; v < FVECS; ++v) fvec_store(sums + v * FVEC_LANES, acc[r][j][v]);
                write_sums(p, r0 + r, (p0 + j) * PANEL, sums);
            }
    }
};

// bf16 without the CPU's bf16 dot product: each pair of weights widened to two fp32 vectors, the
// odd products added first, as the bf16 units do.
struct Bf16WidePanels {
    static constexpr int R = WIDE ? 4 : 3, P = WIDE ? 4 : 1;
    const Product& p;

    template <int NR, int NP>
    void block(int r0, int p0) const {
        const uint32_t* w = static_cast<const uint32_t*>(p.m.weight) + size_t(p0) * p.panel_stride();
        const uint32_t* x[NR];
        for (int r = 0; r < NR; ++r) x[r] = p.packed_row(r0 + r);
        fvec acc[NR][NP][FVECS];
        for (auto& row : acc)
            for (auto& panel : row)
                for (auto& v : panel) v = fvec_zero();
        for (int k = 0; k < p.groups; ++k) {
            fvec even[NP][FVECS], odd[NP][FVECS];
            for (int j = 0; j < NP; ++j)
                for (int v = 0; v < FVECS; ++v) {
                    const uint32_t* pairs = w + j * p.panel_stride() + k * PANEL + v * FVEC_LANES;
                    even[j][v] = bf16_even(pairs);
                    odd[j][v] = bf16_odd(pairs);
                }
            for (int r = 0; r < NR; ++r) {
                const fvec xe = fvec_set1(float_bits(x[r][k] << 16)), xo = fvec_set1(float_bits(x[r][k] & 0xffff0000u));
                for (int j = 0; j < NP; ++j)
                    for (int v = 0; v < FVECS; ++v)
                        acc[r][j][v] = fvec_fma(xe, even[j][v], fvec_fma(xo, odd[j][v], acc[r][j][v]));
            }
        }
        float sums[PANEL];
        for (int r = 0; r < NR; ++r)
            for (int j = 0; j < NP; ++j) {
                for (int v = 0; v < FVECS; ++v) fvec_store(sums + v * FVEC_LANES, acc[r][j][v]);
                write_sums(p, r0 + r, (p0 + j) * PANEL, sums);
            }
    }
};
#endif

#ifdef GPTKIT_BF16_DOT
// bf16 on the CPU's bf16 units: each pair of inputs broadcast against P panels' 16 pairs.
struct Bf16DotPanels {
    static constexpr int R = 6, P = 4;
    const Product& p;

    template <int NR, int NP>
    void block(int r0, int p0) const {
        const uint32_t* w = static_cast<const uint32_t*>(p.m.weight) + size_t(p0) * p.panel_stride();
        const uint32_t* x[NR];
        for (int r = 0; r < NR; ++r) x[r] = p.packed_row(r0 + r);
        __m512 acc[NR][NP];
        for (auto& row : acc)
            for (auto& v : row) v = _mm512_setzero_ps();
        for (int k = 0; k < p.groups; ++k) {
            __m512i wv[NP];
            for (int j = 0; j < NP; ++j) wv[j] = _mm512_loadu_si512(w + j * p.panel_stride() + k * PANEL);
            for (int r = 0; r < NR; ++r) {
                const __m512i xb = _mm512_set1_epi32(int(x[r][k]));
                for (int j = 0; j < NP; ++j) acc[r][j] = bf16_dot(acc[r][j], xb, wv[j]);
            }
        }
        float sums[PANEL];
        for (int r = 0; r < NR; ++r)
            for (int j = 0; j < NP; ++j) {
                _mm512_storeu_ps(sums, acc[r][j]);
                write_sums(p, r0 + r, (p0 + j) * PANEL, sums);
            }
    }
};
#endif

#ifdef GPTKIT_INT_VECTORS
constexpr int IVECS = PANEL * 4 / IVEC_BYTES;  // vectors of a panel's 16 integer sums

// int8: each quad of 7-bit inputs broadcast against P panels' 16 quads of weights.
struct Int8Panels {
    static constexpr int R = IVECS == 1 ? 6 : 2, P = IVECS == 1 ? 4 : 2;
    const Product& p;

    template <int NR, int NP>
    void block(int r0, int p0) const {
        const int8_t* w = static_cast<const int8_t*>(p.m.weight) + size_t(p0) * p.panel_stride() * 4;
        const uint32_t* x[NR];
        for (int r = 0; r < NR; ++r) x[r] = p.packed_row(r0 + r);
        ivec acc[NR][NP][IVECS];
        for (auto& row : acc)
            for (auto& panel : row)
                for (auto& v : panel) v = ivec_zero();
        for (int k = 0; k < p.groups; ++k) {
            ivec wv[NP][IVECS];
            for (int j = 0; j < NP; ++j)
                for (int v = 0; v < IVECS; ++v) wv[j][v] = ivec_load(w + (j * p.panel_stride() + k * PANEL) * 4 + v * IVEC_BYTES);
            for (int r = 0; r < NR; ++r) {
                const ivec xb = ivec_set1(x[r][k]);
                for (int j = 0; j < NP; ++j)
                    for (int v = 0; v < IVECS; ++v) acc[r][j][v] = ivec_dot(acc[r][j][v], xb, wv[j][v]);
            }
        }
        int32_t sums[PANEL];
        for (int r = 0; r < NR; ++r)
            for (int j = 0; j < NP; ++j) {
                for (int v = 0; v < IVECS; ++v) ivec_store(sums + v * IVEC_BYTES / 4, acc[r][j][v]);
                write_int_sums(p, r0 + r, (p0 + j) * PANEL, sums);
            }
    }
};
#endif

// Plain loops, a row and a panel at a time: what a build without vector code computes (the same
// sums in the same order as the vector kernels).
struct ScalarPanels {
    static constexpr int R = 1, P = 1;
    const Product& p;
    int format;

    template <int NR, int NP>
    void block(int r, int panel) const {
        float sums[PANEL] = {};
        int32_t integers[PANEL] = {};
        const size_t first = size_t(panel) * p.panel_stride();
        for (int k = 0; k < p.groups; ++k)
            for (int i = 0; i < PANEL; ++i) {
                const size_t at = first + size_t(k) * PANEL + i;
                if (format == FP32) {
                    sums[i] += p.x[size_t(r) * p.m.in + k] * static_cast<const float*>(p.m.weight)[at];
                } else if (format == BF16) {
                    const uint32_t x = p.packed_row(r)[k], w = static_cast<const uint32_t*>(p.m.weight)[at];
                    sums[i] += float_bits(x & 0xffff0000u) * float_bits(w & 0xffff0000u);
                    sums[i] += float_bits(x << 16) * float_bits(w << 16);
                } else {
                    const uint8_t* x = reinterpret_cast<const uint8_t*>(p.packed_row(r) + k);
                    const int8_t* w = static_cast<const int8_t*>(p.m.weight) + at * 4;
                    for (int b = 0; b < 4; ++b) integers[i] += int32_t(x[b]) * int32_t(w[b]);
                }
            }
        if (format == INT8)
            write_int_sums(p, r, panel * PANEL, integers);
        else
            write_sums(p, r, panel * PANEL, sums);
    }
};

}  // namespace
