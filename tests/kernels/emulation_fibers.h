// The threads of the host model of CUDA (tests/kernels/cuda_emulation.h): a CTA's threads as
// fibers of the one host thread, run in turns by a scheduler (emu::fiber::Run), with the
// barrier those turns end at (emu::Barrier). Independent of CUDA: the model includes it.
#pragma once

#include <sys/mman.h>
#include <ucontext.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#ifdef __SANITIZE_ADDRESS__
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

// On x86-64 a switch saves the callee-saved registers on the stack it leaves and swaps stack
// pointers (sy_emu_fiber_switch below): no system call, and nothing AddressSanitizer intercepts
// (its swapcontext interceptor clears the shadow of the whole stack it enters, at every
// switch), which the annotations in Switch replace. Elsewhere, swapcontext.
#if defined(__x86_64__)
// sy_emu_fiber_switch(void** save_sp, void* load_sp). Weak: each test program that includes
// this header defines it once.
asm(R"(
  .text
  .weak sy_emu_fiber_switch
  .type sy_emu_fiber_switch, @function
sy_emu_fiber_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size sy_emu_fiber_switch, .-sy_emu_fiber_switch
)");
extern "C" void sy_emu_fiber_switch(void** save_sp, void* load_sp);
#endif

namespace emu::fiber {
struct Context {
#if defined(__x86_64__)
  void* sp = nullptr;  // the saved stack pointer, registers pushed below it
#else
  ucontext_t uc;
#endif
  void* fake_stack = nullptr;  // AddressSanitizer's, kept while the fiber is switched away
  const void* stack_bottom = nullptr;
  size_t stack_size = 0;
};
inline Context scheduler;             // the host thread's own stack
inline std::vector<Context> threads;  // the running launch's
inline std::vector<char> done;  // not vector<bool>: its bit proxies are calls at -Og
inline int current = -1;
// What each thread waits for: a barrier's phase counter to move past `seen` (none: runnable).
struct Wait {
  const uint64_t* phase = nullptr;
  uint64_t seen = 0;
};
inline std::vector<Wait> waits;
// The order of turns: the lowest-numbered thread that can run runs (up) or the highest, so one
// warp runs ahead through its warp-level steps until it waits at __syncthreads, and then the
// next; the direction is drawn anew (a fixed pseudo-random sequence) each time the whole CTA
// passes a barrier, so each stretch between two __syncthreads runs its warps first to last in
// some CTAs and last to first in others.
inline bool up = true;
inline bool phase_moved = false;  // a barrier completed in this turn (the scan starts over)
inline uint64_t order_draws = 0x9e3779b97f4a7c15u;
inline void DrawOrder() {
  order_draws = order_draws * 6364136223846793005u + 1442695040888963407u;
  up = (order_draws >> 63) != 0;
}
inline void (*body)(void* arg, int thread) = nullptr;
inline void* body_arg = nullptr;
inline void (*swap_state)(int thread) = nullptr;  // the model's per-thread globals <-> thread's

// Switches the host thread from `from` to `to` (`from_ends`: never to be resumed), telling
// AddressSanitizer which stack is live.
inline void Switch(Context& from, Context& to, bool from_ends) {
#ifdef __SANITIZE_ADDRESS__
  __sanitizer_start_switch_fiber(from_ends ? nullptr : &from.fake_stack, to.stack_bottom,
                                 to.stack_size);
#endif
#if defined(__x86_64__)
  sy_emu_fiber_switch(&from.sp, to.sp);
#else
  swapcontext(&from.uc, &to.uc);
#endif
#ifdef __SANITIZE_ADDRESS__
  __sanitizer_finish_switch_fiber(from.fake_stack, nullptr, nullptr);
#endif
}

// The running thread's turn ends; it resumes here at its next one.
inline void Yield() { Switch(threads[current], scheduler, false); }

inline void Entry() {
#ifdef __SANITIZE_ADDRESS__
  __sanitizer_finish_switch_fiber(nullptr, &scheduler.stack_bottom, &scheduler.stack_size);
#endif
  body(body_arg, current);
  done[current] = true;
  Switch(threads[current], scheduler, true);
  std::abort();  // an ended fiber is never resumed
}

inline constexpr size_t kStackBytes = size_t{1} << 20;  // AddressSanitizer's frames are large
// Reused by every launch. When a thread ends, its frames have returned (AddressSanitizer
// clears their markings as they do) except Entry's and the last switch's, at the top, whose
// markings the next launch clears (kLiveTop bytes; the whole stack would cost more than the
// tests).
inline std::vector<unsigned char*> stacks;
inline constexpr size_t kLiveTop = size_t{64} << 10;

// Runs body(arg, t) for t in [0, n) as fibers in turns until every one has returned. When no
// live thread can run, each waits for a barrier that those still to arrive will never reach:
// one line and abort (a GPU would hang).
inline void Run(int n, void (*fn)(void*, int), void* arg) {
  while (static_cast<int>(stacks.size()) < n) {
    void* p = mmap(nullptr, kStackBytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
    if (p == MAP_FAILED) {
      std::fprintf(stderr, "emu: mmap of a %zu-byte fiber stack failed\n", kStackBytes);
      std::abort();
    }
    mprotect(p, 4096, PROT_NONE);  // a guard page below the stack
    stacks.push_back(static_cast<unsigned char*>(p));
  }
  threads.assign(n, Context{});
  done.assign(n, false);
  waits.assign(n, Wait{});
  body = fn;
  body_arg = arg;
  for (int t = 0; t < n; ++t) {
    Context& c = threads[t];
    c.stack_bottom = stacks[t] + 4096;
    c.stack_size = kStackBytes - 4096;
#ifdef __SANITIZE_ADDRESS__
    __asan_unpoison_memory_region(stacks[t] + kStackBytes - kLiveTop, kLiveTop);
#endif
#if defined(__x86_64__)
    // The first switch pops six zero registers and returns into Entry, with the stack
    // pointer as a call leaves it (16-byte aligned before the return address).
    auto* top = reinterpret_cast<void**>(stacks[t] + kStackBytes);
    top[-1] = nullptr;  // Entry's own return address: it never returns
    top[-2] = reinterpret_cast<void*>(&Entry);
    for (int r = 3; r <= 8; ++r) top[-r] = nullptr;
    c.sp = top - 8;
#else
    getcontext(&c.uc);
    c.uc.uc_stack.ss_sp = const_cast<void*>(c.stack_bottom);
    c.uc.uc_stack.ss_size = c.stack_size;
    c.uc.uc_link = nullptr;
    makecontext(&c.uc, &Entry, 0);
#endif
  }
  // Threads before the last one to run could not run then, and still cannot unless a barrier
  // completed in its turn: only then does the scan start over.
  for (int live = n, from = 0; live > 0;) {
    int t = -1;
    for (int i = from; i < n && t < 0; ++i) {
      const int c = up ? i : n - 1 - i;
      if (!done[c] && (waits[c].phase == nullptr || *waits[c].phase != waits[c].seen)) t = c;
    }
    if (t < 0) {
      std::fprintf(stderr, "emu: %d of the CTA's %d threads wait at barriers that the others "
                   "never reach (a __syncthreads or warp operation not reached by every "
                   "thread; a GPU would hang)\n", live, n);
      std::abort();
    }
    current = t;
    phase_moved = false;
    swap_state(t);
    Switch(scheduler, threads[t], false);
    swap_state(t);
    live -= done[t];
    from = phase_moved ? 0 : (up ? t : n - 1 - t);
  }
  current = -1;
}
}  // namespace emu::fiber

namespace emu {
// A barrier of `count` fibers: each arrival but the last ends the arriving thread's turn until
// the last arrives.
class Barrier {
 public:
  explicit Barrier(int count) : count_(count) {}
  void arrive_and_wait() {
    if (++arrived_ == count_) {
      arrived_ = 0;
      ++phase_;
      fiber::phase_moved = true;
      if (count_ == static_cast<int>(fiber::threads.size())) fiber::DrawOrder();
      return;
    }
    fiber::waits[fiber::current] = {&phase_, phase_};
    fiber::Yield();  // resumed once phase_ has moved
    fiber::waits[fiber::current] = {};
  }

 private:
  int count_, arrived_ = 0;
  uint64_t phase_ = 0;
};
}  // namespace emu
