#pragma once

// The binary body idem_test_upstream answers for X-Test-Body-Size: n, so a test can check a
// replay byte for byte: every byte value appears, NULs included.

#include <cstddef>
#include <string>

namespace idem::proxy::test {

inline std::string binary_body(std::size_t size) {
  std::string out(size, '\0');
  for (std::size_t i = 0; i < size; ++i) out[i] = static_cast<char>((i * 7 + i / 256) & 0xff);
  return out;
}

}  // namespace idem::proxy::test
