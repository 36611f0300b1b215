#include "stores/sqlite/sqlite_wake.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>
#include <ctime>
#include <utility>

namespace idem::sqlite {

namespace {

constexpr std::uint32_t kSlots = 512;
// A listener wakes this often even without a signal (tv_nsec must stay below a second).
constexpr long kListenTimeoutNs = 500'000'000L;

std::atomic_ref<std::uint32_t> atomic(std::uint32_t& word) {
  return std::atomic_ref<std::uint32_t>(word);
}

void futex_wait(std::uint32_t* word, std::uint32_t expected) noexcept {
  timespec timeout{0, kListenTimeoutNs};
  // EAGAIN (the word moved), EINTR and ETIMEDOUT all mean: look again.
  (void)::syscall(SYS_futex, word, FUTEX_WAIT, expected, &timeout, nullptr, 0);
}

void futex_wake_all(std::uint32_t* word) noexcept {
  (void)::syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

}  // namespace

// The shared page. Its words are only ever touched through std::atomic_ref; the file starts
// as zeros, which is a valid page.
struct WakeSignal::Page {
  std::uint32_t listeners;  // processes' store objects that have watches now
  std::uint32_t pad0[15];
  std::uint32_t word;  // the futex: moves on every signal
  std::uint32_t pad1[15];
  std::uint32_t slots[kSlots];  // moves when a record of the slot changes
};

std::unique_ptr<WakeSignal> WakeSignal::open(const std::string& db_path) {
  const std::string path = db_path + "-wake";
  struct stat db {};
  const mode_t mode = ::stat(db_path.c_str(), &db) == 0 ? (db.st_mode & 0666) : 0644;
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, mode);
  if (fd < 0) return nullptr;
  const std::size_t size = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  struct stat st {};
  void* map = MAP_FAILED;
  // Only ever grown: another process may have mapped it already.
  if (::fstat(fd, &st) == 0 && sizeof(Page) <= size &&
      (static_cast<std::size_t>(st.st_size) >= size ||
       ::ftruncate(fd, static_cast<off_t>(size)) == 0)) {
    map = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  ::close(fd);
  if (map == MAP_FAILED) return nullptr;
  return std::unique_ptr<WakeSignal>(new WakeSignal(map, size));
}

WakeSignal::WakeSignal(void* map, std::size_t size)
    : map_(map),
      size_(size),
      page_(static_cast<Page*>(map)),
      watchers_([this] { start_listening(); }, [this] { stop_listening(); }) {}

WakeSignal::~WakeSignal() {
  if (thread_.joinable()) {
    stop_.store(true);
    // Wakes every listener of the file, ours among them; the others find no slot moved.
    atomic(page_->word).fetch_add(1);
    futex_wake_all(&page_->word);
    thread_.join();
  }
  if (counted_) atomic(page_->listeners).fetch_sub(1);
  ::munmap(map_, size_);
}

void WakeSignal::notify(std::string_view scope, std::string_view key) noexcept {
  if (atomic(page_->listeners).load() == 0) return;
  const std::uint64_t hash = detail::stable_record_hash(scope, key);
  atomic(page_->slots[hash % kSlots]).fetch_add(1);
  atomic(page_->word).fetch_add(1);
  futex_wake_all(&page_->word);
}

std::unique_ptr<RecordWatch> WakeSignal::watch(std::string_view scope, std::string_view key,
                                               std::function<void()> changed) {
  return watchers_.add(detail::stable_record_hash(scope, key), std::move(changed));
}

// Under the watchers' lock (RecordWatchers' hooks).
void WakeSignal::start_listening() {
  if (!counted_) {
    atomic(page_->listeners).fetch_add(1);
    counted_ = true;
  }
  if (!thread_.joinable()) {
    // The slots as they are before the watch that starts listening asks the store again, so
    // a signal sent between that question and the thread's first look is not taken for the
    // state the thread starts from.
    seen_ = std::make_unique<std::uint32_t[]>(kSlots);
    for (std::uint32_t i = 0; i < kSlots; ++i) seen_[i] = atomic(page_->slots[i]).load();
    thread_ = std::thread([this] { listen(); });
    // Named here, not in the thread, so it has its name before anyone can look: an operator
    // (top -H, /proc/PID/task/*/comm) sees what it is. 15 characters at most.
    ::pthread_setname_np(thread_.native_handle(), "idem-sqlitewake");
  }
}

void WakeSignal::stop_listening() {
  if (counted_) {
    atomic(page_->listeners).fetch_sub(1);
    counted_ = false;
  }
}

void WakeSignal::listen() {
  std::uint32_t* const seen = seen_.get();
  while (!stop_.load()) {
    // The word first, then the slots: a signal after the slots were read moves the word,
    // and the wait below returns at once.
    const std::uint32_t word = atomic(page_->word).load();
    bool moved = false;
    bool changed[kSlots] = {};
    for (std::uint32_t i = 0; i < kSlots; ++i) {
      const std::uint32_t now = atomic(page_->slots[i]).load();
      if (now != seen[i]) {
        seen[i] = now;
        changed[i] = moved = true;
      }
    }
    if (moved) watchers_.notify_if([&](std::uint64_t hash) { return changed[hash % kSlots]; });
    futex_wait(&page_->word, word);
  }
}

}  // namespace idem::sqlite
