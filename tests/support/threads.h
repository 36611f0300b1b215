#pragma once

// The threads of this process that have a given name (/proc/self/task/*/comm), for tests of
// a store's listener thread. Counting every thread of the process would count the
// sanitizers' own (ThreadSanitizer starts one beside the first thread the program creates).

#include <cstddef>
#include <filesystem>
#include <fstream>
#include <string>

namespace idem::testing {

inline std::size_t threads_named(const std::string& wanted) {
  std::size_t n = 0;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(task.path() / "comm");
    std::string name;
    if (std::getline(comm, name) && name == wanted) ++n;
  }
  return n;
}

}  // namespace idem::testing
