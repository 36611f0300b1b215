#pragma once

// posix_spawn attributes that start a child the way a shell would: no signal blocked, and
// the signals a test runner may block or ignore (ctest, gtest death tests) back at their
// default dispositions, so the child reacts to them as it would for a user.

#include <signal.h>
#include <spawn.h>

namespace idem::testing {

class ShellSpawnAttributes {
 public:
  ShellSpawnAttributes() {
    posix_spawnattr_init(&attr_);
    sigset_t none;
    sigemptyset(&none);
    sigset_t defaults;
    sigemptyset(&defaults);
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGPIPE, SIGCHLD}) sigaddset(&defaults, sig);
    posix_spawnattr_setsigmask(&attr_, &none);
    posix_spawnattr_setsigdefault(&attr_, &defaults);
    posix_spawnattr_setflags(&attr_, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  }
  ~ShellSpawnAttributes() { posix_spawnattr_destroy(&attr_); }
  ShellSpawnAttributes(const ShellSpawnAttributes&) = delete;
  ShellSpawnAttributes& operator=(const ShellSpawnAttributes&) = delete;
  const posix_spawnattr_t* get() const { return &attr_; }

 private:
  posix_spawnattr_t attr_;
};

}  // namespace idem::testing
