// Must not compile: run<T> with a result type that has no idem::Codec<T>. The test
// run_without_codec_does_not_compile (tests/core/CMakeLists.txt) builds this file and
// passes only if the compiler stops at the static_assert that tells the user what to do.

#include <string_view>

#include "idem/executor.h"

namespace {
struct NoCodec {};
}  // namespace

int main(int argc, char**) {
  if (argc > 100) {
    idem::Executor* executor = nullptr;
    (void)executor->run<NoCodec>("s", "k", [](const idem::Attempt&) { return NoCodec{}; });
  }
  return 0;
}
