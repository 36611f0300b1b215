// The floor under a store's I/O loop (issue 25, docs/benchmarks.md "Where the time goes"):
// what handing one call to an I/O thread and back costs on this machine when the round trip
// itself costs nothing. CALLERS threads each hand a request to one of LOOPS I/O threads and
// wait for its answer, as idem's Redis connections do (a queue under a mutex that the I/O
// thread takes whole, one condition variable per call); the I/O thread "sends" the batch
// (nothing) and answers each call. No store, no socket: what is left is the hand-off.
//
//   handoff_floor CALLERS LOOPS OPS
//
// Prints calls per second, this process's CPU per call and context switches per call
// (getrusage around the measured calls). A store's calls at CALLERS callers can be no
// cheaper than this in a design where every caller blocks on its own call.

#include <sys/resource.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace {

struct Call {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
};

class Loop {
 public:
  Loop() : thread_([this] { run(); }) {}
  ~Loop() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  void execute(Call& call) {
    std::unique_lock lock(mu_);
    queue_.push_back(&call);
    const bool wake = !busy_;
    lock.unlock();
    if (wake) cv_.notify_all();
    std::unique_lock call_lock(call.mu);
    call.cv.wait(call_lock, [&] { return call.done; });
  }

 private:
  void run() {
    std::vector<Call*> batch;
    std::unique_lock lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      batch.swap(queue_);
      busy_ = true;
      lock.unlock();
      for (Call* call : batch) {
        {
          std::lock_guard call_lock(call->mu);
          call->done = true;
        }
        call->cv.notify_one();
      }
      batch.clear();
      lock.lock();
      busy_ = false;
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Call*> queue_;
  bool busy_ = false;
  bool stop_ = false;
  std::thread thread_;
};

struct Usage {
  double cpu_s;
  long switches;
};

Usage usage_now() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  const auto seconds = [](const timeval& t) {
    return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) / 1e6;
  };
  return {seconds(u.ru_utime) + seconds(u.ru_stime), u.ru_nvcsw + u.ru_nivcsw};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: handoff_floor CALLERS LOOPS OPS\n");
    return 2;
  }
  const int callers = std::atoi(argv[1]);
  const int loops = std::atoi(argv[2]);
  const long ops = std::atol(argv[3]);
  if (callers < 1 || loops < 1 || ops < callers) return 2;
  std::vector<std::unique_ptr<Loop>> io;
  for (int i = 0; i < loops; ++i) io.push_back(std::make_unique<Loop>());
  const Usage before = usage_now();
  const auto started = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int t = 0; t < callers; ++t) {
    threads.emplace_back([&, t] {
      Loop& loop = *io[static_cast<std::size_t>(t % loops)];
      for (long i = 0; i < ops / callers; ++i) {
        Call call;
        loop.execute(call);
      }
    });
  }
  for (auto& t : threads) t.join();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  const Usage after = usage_now();
  const double calls = static_cast<double>(ops / callers * callers);
  std::printf("callers=%d loops=%d calls/s=%.0f cpu_us/call=%.2f switches/call=%.2f\n", callers,
              loops, calls / seconds, (after.cpu_s - before.cpu_s) / calls * 1e6,
              static_cast<double>(after.switches - before.switches) / calls);
  return 0;
}
