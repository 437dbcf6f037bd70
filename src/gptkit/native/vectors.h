// Dot products: the inner loops every product and attention spend their time in, on the widest
// vectors the compiler targets (AVX-512 or AVX2 intrinsics; plain loops otherwise). Part of
// decode_step.cpp's one translation unit.

#pragma once

#include <cstdint>
#include <cstring>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace {

// A vector of fp32 lanes from a matrix row: fp32 as stored, bf16 widened (its 16 bits are fp32's
// high half), so that one dot product serves both and only the weights' rounding differs.
#if defined(__AVX512F__)
typedef __m512 fvec;
constexpr int FVEC_LANES = 16;
inline fvec lanes(const float* w) { return _mm512_loadu_ps(w); }
inline fvec lanes(const uint16_t* w) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)w)), 16));
}
inline fvec fvec_zero() { return _mm512_setzero_ps(); }
inline fvec fvec_fma(fvec a, fvec b, fvec c) { return _mm512_fmadd_ps(a, b, c); }
inline fvec fvec_add(fvec a, fvec b) { return _mm512_add_ps(a, b); }
inline float fvec_sum(fvec v) { return _mm512_reduce_add_ps(v); }
inline fvec fvec_set1(float x) { return _mm512_set1_ps(x); }
inline void fvec_store(float* p, fvec v) { _mm512_storeu_ps(p, v); }
inline float fvec_max(fvec v) { return _mm512_reduce_max_ps(v); }
inline fvec fvec_mul(fvec a, fvec b) { return _mm512_mul_ps(a, b); }
inline fvec fvec_sub(fvec a, fvec b) { return _mm512_sub_ps(a, b); }
inline fvec fvec_div(fvec a, fvec b) { return _mm512_div_ps(a, b); }
inline fvec fvec_clamp(fvec x, float lo, float hi) {
    return _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(lo)), _mm512_set1_ps(hi));
}
inline fvec fvec_rint(fvec x) { return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
// 2^n for whole numbers n (as floats) in [-126, 127], built in the exponent's bits.
inline fvec fvec_exp2_int(fvec n) {
    const __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_castsi512_ps(bits);
}
// The even and odd bf16 of 16 pairs (a pair's first value in its low half) widened to fp32.
inline fvec bf16_even(const uint32_t* p) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_loadu_si512(p), 16)); }
inline fvec bf16_odd(const uint32_t* p) {
    return _mm512_castsi512_ps(_mm512_and_si512(_mm512_loadu_si512(p), _mm512_set1_epi32(int(0xffff0000u))));
}
#define GPTKIT_FLOAT_VECTORS 1
#elif defined(__AVX2__) && defined(__FMA__)
typedef __m256 fvec;
constexpr int FVEC_LANES = 8;
inline fvec lanes(const float* w) { return _mm256_loadu_ps(w); }
inline fvec lanes(const uint16_t* w) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)w)), 16));
}
inline fvec fvec_zero() { return _mm256_setzero_ps(); }
inline fvec fvec_fma(fvec a, fvec b, fvec c) { return _mm256_fmadd_ps(a, b, c); }
inline fvec fvec_add(fvec a, fvec b) { return _mm256_add_ps(a, b); }
inline float fvec_sum(fvec v) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}
inline fvec fvec_set1(float x) { return _mm256_set1_ps(x); }
inline void fvec_store(float* p, fvec v) { _mm256_storeu_ps(p, v); }
inline float fvec_max(fvec v) {
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}
inline fvec fvec_mul(fvec a, fvec b) { return _mm256_mul_ps(a, b); }
inline fvec fvec_sub(fvec a, fvec b) { return _mm256_sub_ps(a, b); }
inline fvec fvec_div(fvec a, fvec b) { return _mm256_div_ps(a, b); }
inline fvec fvec_clamp(fvec x, float lo, float hi) {
    return _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(lo)), _mm256_set1_ps(hi));
}
inline fvec fvec_rint(fvec x) { return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
inline fvec fvec_exp2_int(fvec n) {
    const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_castsi256_ps(bits);
}
inline fvec bf16_even(const uint32_t* p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_loadu_si256((const __m256i*)p), 16));
}
inline fvec bf16_odd(const uint32_t* p) {
    return _mm256_castsi256_ps(
        _mm256_and_si256(_mm256_loadu_si256((const __m256i*)p), _mm256_set1_epi32(int(0xffff0000u))));
}
#define GPTKIT_FLOAT_VECTORS 1
#endif

// bf16 pairs multiplied and summed into fp32 lanes by one instruction (AVX512-BF16), 16 lanes:
// each lane adds x's pair times its own pair of w, the odd products first, each sum rounded once.
#if defined(__AVX512BF16__) && defined(__AVX512F__)
#define GPTKIT_BF16_DOT 1
inline __m512 bf16_dot(__m512 acc, __m512i x, __m512i w) { return _mm512_dpbf16_ps(acc, (__m512bh)x, (__m512bh)w); }
#endif

inline float widen(float w) { return w; }
inline float widen(uint16_t w) {
    const uint32_t bits = uint32_t(w) << 16;
    float value;
    std::memcpy(&value, &bits, sizeof value);
    return value;
}

// Σ w[k]·x[k] in fp32, w fp32 or bf16.
template <typename Weight>
inline float dot(const Weight* w, const float* x, int n) {
    int k = 0;
    float sum = 0.0f;
#ifdef GPTKIT_FLOAT_VECTORS
    constexpr int L = FVEC_LANES;
    fvec a0 = fvec_zero(), a1 = fvec_zero(), a2 = fvec_zero(), a3 = fvec_zero();
    for (; k + 4 * L <= n; k += 4 * L) {  // four accumulators hide the FMA latency
        a0 = fvec_fma(lanes(w + k), lanes(x + k), a0);
        a1 = fvec_fma(lanes(w + k + L), lanes(x + k + L), a1);
        a2 = fvec_fma(lanes(w + k + 2 * L), lanes(x + k + 2 * L), a2);
        a3 = fvec_fma(lanes(w + k + 3 * L), lanes(x + k + 3 * L), a3);
    }
    for (; k + L <= n; k += L) a0 = fvec_fma(lanes(w + k), lanes(x + k), a0);
    sum = fvec_sum(fvec_add(fvec_add(a0, a1), fvec_add(a2, a3)));
#endif
    for (; k < n; ++k) sum += widen(w[k]) * x[k];
    return sum;
}

// Integer products of unsigned 7-bit activations and signed 8-bit weights, exact in int32: the
// vector of int32 sums and the one instruction (VNNI) or three (AVX2, AVX-512 without VNNI) that
// adds 4 products of bytes to each lane (x: 4 activations, w: 4 weights of each lane's output). u8·s8 pairs summed to int16 stay within 2·127·127: no
// saturation with 7-bit activations.
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
typedef __m512i ivec;
constexpr int IVEC_BYTES = 64;
inline ivec ivec_load(const void* p) { return _mm512_loadu_si512(p); }
inline ivec ivec_zero() { return _mm512_setzero_si512(); }
inline ivec ivec_dot(ivec acc, ivec x, ivec w) { return _mm512_dpbusd_epi32(acc, x, w); }
inline int32_t ivec_sum(ivec v) { return _mm512_reduce_add_epi32(v); }
inline ivec ivec_set1(uint32_t x) { return _mm512_set1_epi32(int(x)); }
inline void ivec_store(int32_t* p, ivec v) { _mm512_storeu_si512(p, v); }
#define GPTKIT_INT_VECTORS 1
#elif defined(__AVX512BW__)
typedef __m512i ivec;
constexpr int IVEC_BYTES = 64;
inline ivec ivec_load(const void* p) { return _mm512_loadu_si512(p); }
inline ivec ivec_zero() { return _mm512_setzero_si512(); }
inline ivec ivec_dot(ivec acc, ivec x, ivec w) {
    return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(x, w), _mm512_set1_epi16(1)));
}
inline int32_t ivec_sum(ivec v) { return _mm512_reduce_add_epi32(v); }
inline ivec ivec_set1(uint32_t x) { return _mm512_set1_epi32(int(x)); }
inline void ivec_store(int32_t* p, ivec v) { _mm512_storeu_si512(p, v); }
#define GPTKIT_INT_VECTORS 1
#elif defined(__AVX2__)
typedef __m256i ivec;
constexpr int IVEC_BYTES = 32;
inline ivec ivec_load(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
inline ivec ivec_zero() { return _mm256_setzero_si256(); }
#if defined(__AVXVNNI__)
inline ivec ivec_dot(ivec acc, ivec x, ivec w) { return _mm256_dpbusd_avx_epi32(acc, x, w); }
#else
inline ivec ivec_dot(ivec acc, ivec x, ivec w) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(x, w), _mm256_set1_epi16(1)));
}
#endif
inline int32_t ivec_sum(ivec v) {
    __m128i h = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4e));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xb1));
    return _mm_cvtsi128_si32(h);
}
inline ivec ivec_set1(uint32_t x) { return _mm256_set1_epi32(int(x)); }
inline void ivec_store(int32_t* p, ivec v) { _mm256_storeu_si256((__m256i*)p, v); }
#define GPTKIT_INT_VECTORS 1
#endif

}  // namespace
