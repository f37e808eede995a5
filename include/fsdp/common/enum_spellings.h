#pragma once
// [Note: enum spellings]
// Each enum that is read from text (configuration values, flags,
// environment variables) has one table of its spellings, in enumerator
// order: parsing, --help's alternatives and printing all read it. The table
// is checked against the enum when it compiles: entry i is enumerator i, no
// spelling repeats, and there are as many entries as the enum has
// enumerators (an enumerator added without a spelling is a compile error,
// not a value that prints as garbage). Specialise EnumSpellings<E> in
// namespace fsdp, beside the enum. Light header: no LibTorch.

#include <cstddef>
#include <iterator>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace fsdp {

template <typename E>
struct Spelling {
  E value;
  const char* name;
};

template <typename E>
struct EnumSpellings;  // kTable: {enumerator, spelling}, in enumerator order

namespace detail {

// Whether V is a named enumerator. GCC and Clang spell a template argument
// that names an enumerator by its name ("[with auto V =
// fsdp::train::Precision::kBf16]") and any other value as a cast
// ("(fsdp::train::Precision)3"), so counting the named values from 0 counts
// the enumerators of a dense enum.
template <auto V>
constexpr bool names_an_enumerator() {
  constexpr std::string_view signature = __PRETTY_FUNCTION__;
  constexpr size_t eq = signature.rfind("= ");
  return eq != std::string_view::npos && signature[eq + 2] != '(';
}

template <typename E, int I = 0>
constexpr size_t enumerator_count() {
  if constexpr (names_an_enumerator<static_cast<E>(I)>()) {
    return enumerator_count<E, I + 1>();
  } else {
    return I;
  }
}

template <typename E>
constexpr bool spellings_in_enumerator_order() {
  const auto& table = EnumSpellings<E>::kTable;
  for (size_t i = 0; i < std::size(table); ++i) {
    if (static_cast<size_t>(table[i].value) != i) return false;
    for (size_t j = 0; j < i; ++j) {
      if (std::string_view(table[i].name) == std::string_view(table[j].name)) return false;
    }
  }
  return true;
}

template <typename E, typename = void>
constexpr bool kHasSpellings = false;
template <typename E>
constexpr bool kHasSpellings<E, std::void_t<decltype(EnumSpellings<E>::kTable)>> = true;

inline char lower_ascii(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; }

}  // namespace detail

template <typename E>
const auto& spelling_table() {
  static_assert(detail::kHasSpellings<E>, "an enum read from text needs its EnumSpellings<E> table");
  static_assert(std::size(EnumSpellings<E>::kTable) == detail::enumerator_count<E>(),
                "EnumSpellings<E>::kTable must spell every enumerator of E, no more");
  static_assert(detail::spellings_in_enumerator_order<E>(),
                "EnumSpellings<E>::kTable must list E's enumerators in declaration order, each spelling once");
  return EnumSpellings<E>::kTable;
}

template <typename E>
std::vector<std::string> spellings() {
  std::vector<std::string> out;
  for (const auto& s : spelling_table<E>()) out.emplace_back(s.name);
  return out;
}

template <typename E>
const char* spelling_of(E value) {
  const auto& table = spelling_table<E>();
  const auto i = static_cast<size_t>(value);
  return i < std::size(table) ? table[i].name : "?";
}

// The enumerator `text` spells (ASCII case ignored), or none.
template <typename E>
std::optional<E> parse_spelling(std::string_view text) {
  for (const auto& s : spelling_table<E>()) {
    const std::string_view name = s.name;
    if (name.size() != text.size()) continue;
    bool same = true;
    for (size_t i = 0; i < name.size() && same; ++i) same = detail::lower_ascii(text[i]) == name[i];
    if (same) return s.value;
  }
  return std::nullopt;
}

// "a, b or c" (or "'a', 'b' or 'c'"): the spellings for a message naming
// what was expected.
template <typename E>
std::string spellings_text(bool quoted = false) {
  const auto names = spellings<E>();
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) {
    out += i == 0 ? "" : i + 1 == names.size() ? " or " : ", ";
    out += quoted ? "'" + names[i] + "'" : names[i];
  }
  return out;
}

}  // namespace fsdp
