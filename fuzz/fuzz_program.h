// Program: a fuzz input read front to back as a program of bytes, integers that favour
// small values and the edges of their types, and byte strings (the grammar is
// requests_fuzzer.cc's). Reads past the end give zeros. Not thread-safe.
#ifndef KVARENA_FUZZ_FUZZ_PROGRAM_H_
#define KVARENA_FUZZ_FUZZ_PROGRAM_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <string>

namespace kvarena {

class Program {
 public:
  Program(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool done() const { return at_ >= size_; }
  uint8_t Peek() const { return at_ < size_ ? data_[at_] : 0; }  // the next Byte()
  uint8_t Byte() { return at_ < size_ ? data_[at_++] : 0; }
  bool Bool() { return Byte() & 1; }
  template <typename T>
  T Raw() {
    uint64_t v = 0;
    for (size_t i = 0; i < sizeof(T); ++i) v |= uint64_t(Byte()) << (8 * i);
    T t;
    std::memcpy(&t, &v, sizeof(T));
    return t;
  }
  // Integers a caller may send: mostly small, often at the edges of their types.
  template <typename T>
  T Int(uint64_t small = 24) {
    static constexpr uint64_t kEdges[] = {0,
                                          1,
                                          2,
                                          3,
                                          4,
                                          5,
                                          15,
                                          16,
                                          17,
                                          63,
                                          64,
                                          65,
                                          1023,
                                          1024,
                                          4096,
                                          (uint64_t{1} << 31) - 1,
                                          uint64_t{1} << 31,
                                          (uint64_t{1} << 32) - 1,
                                          uint64_t{1} << 32,
                                          uint64_t{1} << 62,
                                          (uint64_t{1} << 63) - 1,
                                          uint64_t{1} << 63,
                                          ~uint64_t{0}};
    const uint8_t s = Byte();
    if (s < 32) return T(s % (small + 1));
    if (s < 48) return T(kEdges[Byte() % std::size(kEdges)]);
    return Raw<T>();
  }
  std::string Bytes(size_t n) {
    std::string out;
    while (n-- > 0) out.push_back(char(Byte()));
    return out;
  }

 private:
  const uint8_t* const data_;
  const size_t size_;
  size_t at_ = 0;
};

}  // namespace kvarena

#endif  // KVARENA_FUZZ_FUZZ_PROGRAM_H_
