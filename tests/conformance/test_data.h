#pragma once

// Deterministic test data for the conformance suite.

#include <cstddef>
#include <cstdint>
#include <string>

namespace idem::testing {

// `size` pseudo-random bytes (every byte value occurs, NUL included), the same for the
// same `seed`, so a round trip can be checked byte for byte.
inline std::string binary_payload(std::size_t size, std::uint64_t seed) {
  std::string out(size, '\0');
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ULL + 0x2545F4914F6CDD1DULL;
  for (std::size_t i = 0; i < size; ++i) {
    // xorshift64*: cheap, and good enough that no byte pattern repeats in a payload.
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    out[i] = static_cast<char>((x * 0x2545F4914F6CDD1DULL) >> 56);
  }
  return out;
}

// Every byte value once, 0x00 to 0xff.
inline std::string all_bytes() {
  std::string out(256, '\0');
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<char>(i);
  return out;
}

}  // namespace idem::testing
