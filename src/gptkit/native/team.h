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
//
// Part of decode_step.cpp's one translation unit.

#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdint>
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

namespace {

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

}  // namespace
