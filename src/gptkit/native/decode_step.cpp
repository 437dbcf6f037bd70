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

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include <atomic>
#include <chrono>
#include <climits>
#include <thread>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif
#ifdef _OPENMP
#include <omp.h>
#endif
#ifdef __linux__
#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

// The interface's version: gptkit.native.ABI must equal it (a library of another is rebuilt).
#define GPTKIT_ABI 2

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

enum Epilogue { STORE = 0, ADD = 1 };
enum Format { FP32 = 0, BF16 = 1, INT8 = 2 };

// ---------------------------------------------------------------------------------------------
// Dot products: the inner loops every product and attention spend their time in.

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
#define GPTKIT_FLOAT_VECTORS 1
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
// adds 4 products of bytes to each lane. u8·s8 pairs summed to int16 stay within 2·127·127: no
// saturation with 7-bit activations.
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
typedef __m512i ivec;
constexpr int IVEC_BYTES = 64;
inline ivec ivec_load(const void* p) { return _mm512_loadu_si512(p); }
inline ivec ivec_zero() { return _mm512_setzero_si512(); }
inline ivec ivec_dot(ivec acc, ivec x, ivec w) { return _mm512_dpbusd_epi32(acc, x, w); }
inline int32_t ivec_sum(ivec v) { return _mm512_reduce_add_epi32(v); }
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
#define GPTKIT_INT_VECTORS 1
#endif

// Σ x·w of `W` weight rows against `X` activation rows at once, sums[i·X + j] for weight row i and
// activation row j: each piece of weights and activations loaded once for all its products (two
// weight rows as two streams while decoding; 2 × 4 for a prompt's many rows). Exact in int32.
template <int W, int X>
inline void dot_u8s8(const int8_t* const* w, const uint8_t* const* x, int n, int32_t* sums) {
    int k = 0;
    for (int i = 0; i < W * X; ++i) sums[i] = 0;
#ifdef GPTKIT_INT_VECTORS
    ivec a[W * X];
    for (int i = 0; i < W * X; ++i) a[i] = ivec_zero();
    for (; k + IVEC_BYTES <= n; k += IVEC_BYTES) {
        ivec xk[X];
        for (int j = 0; j < X; ++j) xk[j] = ivec_load(x[j] + k);
        for (int i = 0; i < W; ++i) {
            const ivec wk = ivec_load(w[i] + k);
            for (int j = 0; j < X; ++j) a[i * X + j] = ivec_dot(a[i * X + j], xk[j], wk);
        }
    }
    for (int i = 0; i < W * X; ++i) sums[i] = ivec_sum(a[i]);
#endif
    for (; k < n; ++k)
        for (int i = 0; i < W; ++i)
            for (int j = 0; j < X; ++j) sums[i * X + j] += int32_t(x[j][k]) * int32_t(w[i][k]);
}

// One weight row against one activation row.
inline int32_t dot_u8s8(const int8_t* w, const uint8_t* x, int n) {
    int32_t sum;
    dot_u8s8<1, 1>(&w, &x, n, &sum);
    return sum;
}

// Activation rows a prompt's int8 product takes at a time, against two weight rows.
constexpr int TILE = 4;

// ---------------------------------------------------------------------------------------------
// Element-wise functions, written without library calls so that the compiler vectorizes the loops.

// e^x to about 1e-7 relative (Cody-Waite range reduction, a degree-6 polynomial, the exponent set by
// integer arithmetic), for x in [-87, 88].
inline float exp_approx(float x) {
    x = std::min(std::max(x, -87.0f), 88.0f);
    const float n = __builtin_rintf(x * 1.44269504088896341f);
    const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    const int32_t bits = (int32_t(n) + 127) << 23;
    float scale;
    std::memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

inline float gelu_tanh(float x) {
    // 0.5·x·(1 + tanh(u)) = x·(1 - 1/(e^{2u} + 1)), u = √(2/π)·(x + 0.044715·x³)
    const float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
    return x - x / (exp_approx(2.0f * u) + 1.0f);
}

inline float gelu_erf(float x) {
    // 0.5·x·(1 + erf(x/√2)), erf to 1.5e-7 (Abramowitz and Stegun 7.1.26)
    const float z = std::fabs(x) * 0.7071067811865476f;
    const float t = 1.0f / (1.0f + 0.3275911f * z);
    const float poly =
        t * (0.254829592f + t * (-0.284496736f + t * (1.421413741f + t * (-1.453152027f + t * 1.061405429f))));
    float erf_abs = 1.0f - poly * exp_approx(-z * z);
    const float erf = x < 0.0f ? -erf_abs : erf_abs;
    return 0.5f * x * (1.0f + erf);
}

void activate(float* y, int n, int activation) {
    if (activation == 0) {
#pragma omp simd
        for (int i = 0; i < n; ++i) y[i] = gelu_tanh(y[i]);
    } else if (activation == 1) {
#pragma omp simd
        for (int i = 0; i < n; ++i) y[i] = gelu_erf(y[i]);
    } else {
#pragma omp simd
        for (int i = 0; i < n; ++i) y[i] = std::max(y[i], 0.0f);
    }
}

void layer_norm(const float* x, float* y, int n, const float* gain, const float* bias, float eps) {
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int i = 0; i < n; ++i) sum += x[i];
    const float mean = sum / n;
    float squares = 0.0f;
#pragma omp simd reduction(+ : squares)
    for (int i = 0; i < n; ++i) squares += (x[i] - mean) * (x[i] - mean);
    const float inv_std = 1.0f / std::sqrt(squares / n + eps);
#pragma omp simd
    for (int i = 0; i < n; ++i) y[i] = (x[i] - mean) * inv_std * gain[i] + bias[i];
}

// ---------------------------------------------------------------------------------------------
// Threads. A step runs in one OpenMP parallel region of as many threads as the caller asks for
// (gptkit passes torch.get_num_threads(): the calling thread's OpenMP setting is not PyTorch's in a
// thread PyTorch never set up, such as a server's engine thread). Each phase (a product's output
// rows, attention's heads) is split between the threads by index, and a barrier separates the
// phases. A region per product would wake the other threads ~60 times a token; on the 2-core VMs
// measured, those wake-ups together took about as long as all the work between the products.
//
// The barrier spins for a bounded time (a phase's wait is microseconds on an idle machine), then
// sleeps in the kernel until the last thread arrives (a futex on Linux; short sleeps elsewhere).
// A barrier that only spun (or yielded, which CFS honours weakly) took the core from the very
// thread it waited for whenever the team outnumbered the free cores: 0.2× the PyTorch layouts'
// speed with 4 threads and a competing process on 2 cores. How long to spin is learnt as the
// barriers are waited at: a wait that outlasts the longest spin (a thread of the team descheduled
// by another process) halves it, a sleep that spinning a little longer would have spared doubles it
// (a sleeper woken is also scheduled at once, ahead of a busy competitor, where a spinner waits
// for its turn).

inline void pause() {
#if defined(__x86_64__) || defined(__i386__)
    _mm_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

// The longest a waiting thread spins before it sleeps; none when the team outnumbers the CPUs this
// process may run on (the awaited thread then needs this core).
constexpr int SPIN_NS = 20000;
// How long a waiting thread spins now, in this process (learnt: see above).
std::atomic<int> spin_ns{SPIN_NS};

inline int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

int cpus_available() {
#ifdef __linux__
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set);
#endif
    const unsigned n = std::thread::hardware_concurrency();
    return n ? int(n) : 1;
}

// Sleep while *word == seen (or until woken); wake every sleeper on word.
inline void sleep_while(std::atomic<int>* word, int seen) {
#ifdef __linux__
    syscall(SYS_futex, reinterpret_cast<int*>(word), FUTEX_WAIT_PRIVATE, seen, nullptr, nullptr, 0);
#else
    if (word->load(std::memory_order_acquire) == seen) std::this_thread::sleep_for(std::chrono::microseconds(20));
#endif
}

inline void wake_all(std::atomic<int>* word) {
#ifdef __linux__
    syscall(SYS_futex, reinterpret_cast<int*>(word), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
#else
    (void)word;
#endif
}

struct Barrier {
    std::atomic<int> arrived{0}, generation{0}, sleepers{0};
    bool spin = true;
};

// Threads of a team that have run (the last region's size, for the tests that check the team
// follows torch.set_num_threads).
std::atomic<int> last_team_size{0};

struct Team {
    int thread = 0, threads = 1;
    Barrier* shared = nullptr;

    // Every thread waits here until all have arrived (and sees what they wrote before).
    void barrier() const {
        if (threads == 1) return;
        std::atomic<int>& generation = shared->generation;
        const int seen = generation.load(std::memory_order_acquire);
        if (shared->arrived.fetch_add(1, std::memory_order_acq_rel) == threads - 1) {
            shared->arrived.store(0, std::memory_order_relaxed);
            generation.fetch_add(1, std::memory_order_seq_cst);
            if (shared->sleepers.load(std::memory_order_seq_cst) > 0) wake_all(&generation);
            return;
        }
        const int64_t start = now_ns();
        const int budget = shared->spin ? spin_ns.load(std::memory_order_relaxed) : 0;
        for (int spins = 0; generation.load(std::memory_order_acquire) == seen; ++spins) {
            pause();
            if ((spins & 63) == 63 && now_ns() - start > budget) break;
        }
        if (generation.load(std::memory_order_acquire) != seen) return;
        // Counted as a sleeper before the last look: the thread releasing the barrier either sees
        // the count and wakes us, or released it before our look (seq_cst orders the two).
        shared->sleepers.fetch_add(1, std::memory_order_seq_cst);
        while (generation.load(std::memory_order_seq_cst) == seen) sleep_while(&generation, seen);
        shared->sleepers.fetch_sub(1, std::memory_order_seq_cst);
        if (!shared->spin) return;
        if (now_ns() - start > SPIN_NS)  // no spin would have caught it: spin less
            spin_ns.store(budget / 2, std::memory_order_relaxed);
        else  // a little more spinning would have: spin more
            spin_ns.store(std::min(SPIN_NS, 2 * budget + 1000), std::memory_order_relaxed);
    }

    // This thread's contiguous band [begin, end) of `total` items.
    void share(int total, int& begin, int& end) const {
        const int base = total / threads, extra = total % threads;
        begin = thread * base + std::min(thread, extra);
        end = begin + base + (thread < extra ? 1 : 0);
    }
};

// Run body(team) on `threads` threads of one parallel region (one thread, no region, for 1 or
// without OpenMP).
template <typename Body>
void in_team(int threads, Body body) {
    Barrier shared;
#ifdef _OPENMP
    if (threads > 1) {
        static const int cpus = cpus_available();
        shared.spin = threads <= cpus;
#pragma omp parallel num_threads(threads)
        {
            Team team{omp_get_thread_num(), omp_get_num_threads(), &shared};
            if (team.thread == 0) last_team_size.store(team.threads, std::memory_order_relaxed);
            body(team);
        }
        return;
    }
#endif
    last_team_size.store(1, std::memory_order_relaxed);
    body(Team{0, 1, &shared});
}

// ---------------------------------------------------------------------------------------------
// Products: y[r] (=, or +=) x[r]·Wᵀ + b for every row r, output rows [begin, end) of W: each thread
// takes a contiguous band, one stream through its part of the matrix.

// A thread's band of a one-row product read as STREAMS sequential streams at once (the band's
// parts, a row from each in turn) rather than one: more of the band in flight from memory.
// GPT-2 small's 49 products, one row, 2 cores, alternating, medians of 15: fp32 -9%, bf16 -12%,
// int8 -6% against one stream; three or four streams no better than two.
constexpr int STREAMS = 2;

template <typename Weight>
inline void dot_rows(const Weight* const* w, const float* x, int n, float* sums) {
    int k = 0;
    for (int i = 0; i < STREAMS; ++i) sums[i] = 0.0f;
#ifdef GPTKIT_FLOAT_VECTORS
    constexpr int L = FVEC_LANES;
    fvec a[STREAMS], b[STREAMS];
    for (int i = 0; i < STREAMS; ++i) a[i] = b[i] = fvec_zero();
    for (; k + 2 * L <= n; k += 2 * L) {
        const fvec x0 = lanes(x + k), x1 = lanes(x + k + L);
        for (int i = 0; i < STREAMS; ++i) {
            a[i] = fvec_fma(lanes(w[i] + k), x0, a[i]);
            b[i] = fvec_fma(lanes(w[i] + k + L), x1, b[i]);
        }
    }
    for (int i = 0; i < STREAMS; ++i) sums[i] = fvec_sum(fvec_add(a[i], b[i]));
#endif
    for (; k < n; ++k)
        for (int i = 0; i < STREAMS; ++i) sums[i] += widen(w[i][k]) * x[k];
}

// Where row i of part j of a band [begin, end) split into STREAMS parts is (the rest: `rest`).
inline int part_row(int begin, int end, int i, int j) { return begin + j * ((end - begin) / STREAMS) + i; }
inline int parts_rest(int begin, int end) { return begin + STREAMS * ((end - begin) / STREAMS); }

template <typename Weight>
void product_float(const Matrix& m, const float* x, int rows, float* y, Epilogue epilogue, int begin, int end) {
    const Weight* weight = static_cast<const Weight*>(m.weight);
    const int out = m.out, in = m.in;
    auto write = [&](int r, int n, float sum) {
        const float v = sum + (m.bias ? m.bias[n] : 0.0f);
        float& target = y[size_t(r) * out + n];
        target = epilogue == ADD ? target + v : v;
    };
    if (rows == 1) {  // decoding one sequence: the band as STREAMS streams
        for (int i = 0; i < (end - begin) / STREAMS; ++i) {
            const Weight* w[STREAMS];
            float sums[STREAMS];
            for (int j = 0; j < STREAMS; ++j) w[j] = weight + size_t(part_row(begin, end, i, j)) * in;
            dot_rows<Weight>(w, x, in, sums);
            for (int j = 0; j < STREAMS; ++j) write(0, part_row(begin, end, i, j), sums[j]);
        }
        begin = parts_rest(begin, end);
    }
    for (int n = begin; n < end; ++n) {
        const Weight* w = weight + size_t(n) * in;
        for (int r = 0; r < rows; ++r) write(r, n, dot<Weight>(w, x + size_t(r) * in, in));  // W's row in L1
    }
}

// The activations of one row as 7-bit unsigned integers: x ≈ scale · (q - zero_point), q in [0, 127].
// The range is [min(x, 0), max(x, 0)] so that 0 is exact, the zero point rounded to an integer.
struct Quantized {
    float scale;
    int32_t zero_point;
};

Quantized quantize_row(const float* x, int n, uint8_t* q) {
    float lo = 0.0f, hi = 0.0f;
#pragma omp simd reduction(min : lo) reduction(max : hi)
    for (int i = 0; i < n; ++i) {
        lo = std::min(lo, x[i]);
        hi = std::max(hi, x[i]);
    }
    const int levels = 127;
    double scale = (double(hi) - double(lo)) / levels;
    if (float(scale) == 0.0f) scale = 0.1;  // an all-zero row: any scale
    const double zero_from_min = -double(lo) / scale;
    const int32_t zero_point = int32_t(std::min(std::max(std::nearbyint(zero_from_min), 0.0), double(levels)));
    const float inverse = float(1.0 / scale);
    const float zero = float(zero_point);
#pragma omp simd
    for (int i = 0; i < n; ++i) {
        const float v = __builtin_rintf(x[i] * inverse + zero);
        q[i] = uint8_t(std::min(std::max(v, 0.0f), float(levels)));
    }
    return {float(scale), zero_point};
}

// An int8 product's input: every row quantized, with its scale and zero point.
struct QuantizedRows {
    std::vector<uint8_t> values;
    std::vector<Quantized> params;

    void quantize(const float* x, int rows, int in, int threads = 1) {
        values.resize(size_t(rows) * in);
        params.resize(rows);
        // A prompt's rows on every core (called by one thread of a step's team, a few rows: not).
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && rows >= TILE)
        for (int r = 0; r < rows; ++r) params[r] = quantize_row(x + size_t(r) * in, in, &values[size_t(r) * in]);
    }
};

// Σ scale_x·(q_x - z)·scale_w·q_w = scale_x·scale_w·(Σ q_x·q_w - z·Σ q_w), plus the bias.
inline void write_int8(const Matrix& m, const QuantizedRows& x, int r, int n, int32_t sum, float* y, Epilogue epilogue) {
    const Quantized& p = x.params[r];
    const float v = (m.bias ? m.bias[n] : 0.0f) + float(sum - p.zero_point * m.row_sum[n]) * (p.scale * m.scale[n]);
    float& target = y[size_t(r) * m.out + n];
    target = epilogue == ADD ? target + v : v;
}

// A few rows (decoding): each weight row read once for all of them.
void product_int8(const Matrix& m, const QuantizedRows& x, int rows, float* y, Epilogue epilogue, int begin, int end) {
    const int8_t* weight = static_cast<const int8_t*>(m.weight);
    const uint8_t* q = x.values.data();
    if (rows == 1) {  // decoding one sequence: the band as STREAMS streams
        for (int i = 0; i < (end - begin) / STREAMS; ++i) {
            const int8_t* w[STREAMS];
            int32_t sums[STREAMS];
            for (int j = 0; j < STREAMS; ++j) w[j] = weight + size_t(part_row(begin, end, i, j)) * m.in;
            dot_u8s8<STREAMS, 1>(w, &q, m.in, sums);
            for (int j = 0; j < STREAMS; ++j) write_int8(m, x, 0, part_row(begin, end, i, j), sums[j], y, epilogue);
        }
        begin = parts_rest(begin, end);
    }
    for (int n = begin; n < end; ++n)
        for (int r = 0; r < rows; ++r)
            write_int8(m, x, r, n, dot_u8s8(weight + size_t(n) * m.in, q + size_t(r) * m.in, m.in), y, epilogue);
}

// Rows of activations taken together by the product of many rows: their integers (64 rows of
// 3,072 bytes) stay in the core's cache while the weights stream past them.
constexpr int ROW_BLOCK = 64;

// Many rows (a prompt): two weight rows against TILE activation rows at a time.
void product_int8_tiled(const Matrix& m, const QuantizedRows& x, int rows, float* y, int threads) {
    const int8_t* weight = static_cast<const int8_t*>(m.weight);
    const int out = m.out, in = m.in;
    const uint8_t* q = x.values.data();
    for (int first = 0; first < rows; first += ROW_BLOCK) {
        const int last = std::min(first + ROW_BLOCK, rows);
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
        for (int pair = 0; pair < (out + 1) / 2; ++pair) {
            const int n0 = 2 * pair, n1 = std::min(n0 + 1, out - 1);  // an odd last row pairs with itself
            const int8_t* w[2] = {weight + size_t(n0) * in, weight + size_t(n1) * in};
            int r = first;
            for (; r + TILE <= last; r += TILE) {
                const uint8_t* xs[TILE];
                for (int i = 0; i < TILE; ++i) xs[i] = q + size_t(r + i) * in;
                int32_t sums[2 * TILE];
                dot_u8s8<2, TILE>(w, xs, in, sums);
                for (int i = 0; i < TILE; ++i) {
                    write_int8(m, x, r + i, n0, sums[i], y, STORE);
                    if (n1 != n0) write_int8(m, x, r + i, n1, sums[TILE + i], y, STORE);
                }
            }
            for (; r < last; ++r) {
                const uint8_t* xr = q + size_t(r) * in;
                int32_t sums[2];
                dot_u8s8<2, 1>(w, &xr, in, sums);
                write_int8(m, x, r, n0, sums[0], y, STORE);
                if (n1 != n0) write_int8(m, x, r, n1, sums[1], y, STORE);
            }
        }
    }
}

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

// softmax(q·Kᵀ/√d)·V of the new token of each row over its cached positions, the new k and v
// written into the cache first; the (row, head) pairs split between the team. qkv: (rows,
// 3·d_model); heads: (rows, d_model); scores: positions floats a thread.
void attend(const Team& team, const Step& s, int layer, const float* qkv, float* heads, float* scores) {
    const int d = s.d_model, nh = s.n_head, hs = d / nh, positions = s.past + 1;
    const float scale = 1.0f / std::sqrt(float(hs));
    scores += size_t(team.thread) * positions;
    int begin, end;
    team.share(s.rows * nh, begin, end);
    for (int item = begin; item < end; ++item) {
        const int r = item / nh, h = item % nh;
        const size_t base = ((size_t(layer) * s.cache_rows + r) * nh + h) * size_t(s.capacity) * hs;
        float* keys = s.keys + base;
        float* values = s.values + base;
        const float* q = qkv + size_t(r) * 3 * d + h * hs;
        std::memcpy(keys + size_t(s.past) * hs, q + d, hs * sizeof(float));
        std::memcpy(values + size_t(s.past) * hs, q + 2 * d, hs * sizeof(float));
        const uint8_t* mask = s.mask ? s.mask + size_t(r) * positions : nullptr;
        float top = -INFINITY;
        for (int j = 0; j < positions; ++j) {
            // A padding position is skipped, but the new token always sees itself (as PyTorch's
            // mask keeps the diagonal: a padded query's row is never empty).
            const bool skip = mask && !mask[j] && j != s.past;
            scores[j] = skip ? -INFINITY : dot<float>(q, keys + size_t(j) * hs, hs) * scale;
            top = std::max(top, scores[j]);
        }
        float total = 0.0f;
        for (int j = 0; j < positions; ++j) {
            scores[j] = scores[j] == -INFINITY ? 0.0f : exp_approx(scores[j] - top);
            total += scores[j];
        }
        float* out = heads + size_t(r) * d + h * hs;
        std::fill(out, out + hs, 0.0f);
        const float inverse = 1.0f / total;
        for (int j = 0; j < positions; ++j) {
            if (scores[j] == 0.0f) continue;
            const float weight = scores[j] * inverse;
            const float* v = values + size_t(j) * hs;
#pragma omp simd
            for (int i = 0; i < hs; ++i) out[i] += weight * v[i];
        }
    }
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

// The products of a step alone, as the step runs them, on constant activations (s.rows rows),
// their results discarded: what a step spends streaming its matrices, for measuring what it
// spends around them.
void gptkit_step_products(const Step* step, int32_t threads) {
    const Step& s = *step;
    threads = team_size(threads);
    static thread_local Scratch own;
    Scratch& scratch = own;  // the caller's, shared with the team
    size_scratch(s, scratch, threads);
    std::vector<float> input(scratch.hidden.size(), 0.5f), output(scratch.hidden.size());
    in_team(threads, [&](const Team& team) {
        for (int l = 0; l < s.n_layer; ++l) {
            const Layer& layer = s.layers[l];
            for (const Matrix* m : {&layer.qkv, &layer.attn_out, &layer.fc, &layer.mlp_out})
                team_product(team, s.format, *m, input.data(), s.rows, output.data(), STORE, scratch);
        }
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
// which reads it before loading a cached library): its interface version, the source's hash and
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
