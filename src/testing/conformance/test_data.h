#pragma once

// Deterministic test data for the conformance suite.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace idem::testing {

// `size` pseudo-random bytes (NUL and high bytes among them), the same for the same
// `seed`, so a round trip can be checked byte for byte.
inline std::string binary_payload(std::size_t size, std::uint64_t seed) {
  std::string out(size, '\0');
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ULL + 0x2545F4914F6CDD1DULL;
  // Eight bytes per step: 64 MiB payloads are built quickly even under sanitizers.
  for (std::size_t i = 0; i < size; i += sizeof(x)) {
    // xorshift64*: cheap, and good enough that no byte pattern repeats in a payload.
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    const std::uint64_t word = x * 0x2545F4914F6CDD1DULL;
    std::memcpy(out.data() + i, &word, std::min(sizeof(word), size - i));
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
