// An LD_PRELOAD library for redis-server in the clock-step tests: it moves the wall clock
// that Redis reads (gettimeofday, clock_gettime of the realtime clocks, time) by an offset
// the test changes while the server runs, and leaves the monotonic clocks alone, as an NTP
// step does. Redis 7.0 reads gettimeofday for TIME and for key expiry (mstime/ustime, and
// the time snapshot a script runs at), so both follow the shift.
//
// The offset is a signed 64-bit count of microseconds at the start of the file named by
// IDEM_CLOCK_SHIFT_FILE, mapped shared, so a write by the test is seen by the server's
// next clock read. No allocation and no dlsym: every call goes straight to the kernel.
// (libfaketime finds the real functions with dlsym and allocates while it starts, which
// deadlocks under the jemalloc Redis is linked with.)

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>

namespace {

const std::int64_t kNoShift = 0;
const std::int64_t* g_shift = nullptr;  // read and set atomically

std::int64_t shift_us() noexcept {
  const std::int64_t* p = __atomic_load_n(&g_shift, __ATOMIC_ACQUIRE);
  if (p == nullptr) {
    p = &kNoShift;
    // getenv, open and mmap allocate nothing.
    if (const char* path = std::getenv("IDEM_CLOCK_SHIFT_FILE")) {
      const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
      if (fd >= 0) {
        void* m = ::mmap(nullptr, sizeof(std::int64_t), PROT_READ, MAP_SHARED, fd, 0);
        if (m != MAP_FAILED) p = static_cast<const std::int64_t*>(m);
        ::close(fd);
      }
    }
    // A thread that lost the race keeps its mapping unused: harmless.
    const std::int64_t* expected = nullptr;
    if (!__atomic_compare_exchange_n(&g_shift, &expected, p, false, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE)) {
      p = expected;
    }
  }
  return __atomic_load_n(p, __ATOMIC_RELAXED);
}

bool is_wall_clock(clockid_t clock) noexcept {
  return clock == CLOCK_REALTIME || clock == CLOCK_REALTIME_COARSE;
}

void shift(timespec* ts) noexcept {
  constexpr std::int64_t kNs = 1'000'000'000;
  std::int64_t ns = static_cast<std::int64_t>(ts->tv_sec) * kNs + ts->tv_nsec + shift_us() * 1000;
  ts->tv_sec = static_cast<time_t>(ns / kNs);
  ns %= kNs;
  if (ns < 0) {
    ns += kNs;
    ts->tv_sec -= 1;
  }
  ts->tv_nsec = static_cast<long>(ns);
}

}  // namespace

extern "C" {

int clock_gettime(clockid_t clock, timespec* ts) noexcept {
  const long rc = ::syscall(SYS_clock_gettime, clock, ts);
  if (rc == 0 && is_wall_clock(clock)) shift(ts);
  return static_cast<int>(rc);
}

int gettimeofday(timeval* __restrict tv, void* __restrict) noexcept {
  timespec ts{};
  const int rc = clock_gettime(CLOCK_REALTIME, &ts);
  // glibc declares tv non-null.
  if (rc == 0) {
    tv->tv_sec = ts.tv_sec;
    tv->tv_usec = static_cast<suseconds_t>(ts.tv_nsec / 1000);
  }
  return rc;
}

time_t time(time_t* out) noexcept {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  if (out != nullptr) *out = ts.tv_sec;
  return ts.tv_sec;
}

}  // extern "C"
