#pragma once
// UTF-8 for the tokenizers, in one place: how long a character is, and
// where a text stops being valid (ICU's U8_NEXT does the decoding).

#include <cstddef>
#include <cstdint>
#include <string_view>

#include <unicode/utf8.h>

namespace fsdp::data {

// The length in bytes of the UTF-8 character that starts with `lead`
// (a continuation or invalid byte counts by its high bits, as the
// tokenizers' readers step over text already checked).
inline size_t utf8_length(unsigned char lead) { return lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4; }

// The offset of the first byte of `s` that does not begin a valid UTF-8
// character, or -1 when all of it is valid.
inline int64_t first_invalid_utf8(std::string_view s) {
  for (int32_t i = 0, n = static_cast<int32_t>(s.size()); i < n;) {
    const int32_t at = i;
    UChar32 c;
    U8_NEXT(reinterpret_cast<const uint8_t*>(s.data()), i, n, c);
    if (c < 0) return at;
  }
  return -1;
}

}  // namespace fsdp::data
