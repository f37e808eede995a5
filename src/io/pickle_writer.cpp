#include "fsdp/io/pickle_writer.h"

#include <cstring>

namespace fsdp::io {
namespace {

constexpr char kProto = '\x80', kEmptyDict = '}', kEmptyList = ']', kMark = '(', kSetItems = 'u', kAppends = 'e',
               kBinInt = 'J', kBinInt1 = 'K', kBinInt2 = 'M', kLong1 = '\x8a', kBinUnicode = 'X', kBinFloat = 'G',
               kNewTrue = '\x88', kNewFalse = '\x89', kStop = '.';

void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

}  // namespace

PickleWriter::PickleWriter() {
  out_.push_back(kProto);
  out_.push_back('\x02');
}

void PickleWriter::item() {
  if (open_.empty()) return;
  Open& o = open_.back();
  ++o.items;
  // A dict's batch ends after a value, never between a key and its value.
  if (o.items < (o.list ? kBatch : 2 * kBatch)) return;
  out_.push_back(o.list ? kAppends : kSetItems);
  out_.push_back(kMark);
  o.items = 0;
}

void PickleWriter::begin_dict() {
  out_.push_back(kEmptyDict);
  out_.push_back(kMark);
  open_.push_back({false});
}

void PickleWriter::end_dict() {
  out_.push_back(kSetItems);
  open_.pop_back();
  item();
}

void PickleWriter::begin_list() {
  out_.push_back(kEmptyList);
  out_.push_back(kMark);
  open_.push_back({true});
}

void PickleWriter::end_list() {
  out_.push_back(kAppends);
  open_.pop_back();
  item();
}

void PickleWriter::value(int64_t v) {
  if (v >= 0 && v < 256) {
    out_.push_back(kBinInt1);
    put_le(out_, static_cast<uint64_t>(v), 1);
  } else if (v >= 0 && v < 65536) {
    out_.push_back(kBinInt2);
    put_le(out_, static_cast<uint64_t>(v), 2);
  } else if (v >= INT32_MIN && v <= INT32_MAX) {
    out_.push_back(kBinInt);
    put_le(out_, static_cast<uint64_t>(static_cast<uint32_t>(static_cast<int32_t>(v))), 4);
  } else {
    // Little-endian two's complement, 8 bytes: enough for any int64.
    out_.push_back(kLong1);
    out_.push_back('\x08');
    put_le(out_, static_cast<uint64_t>(v), 8);
  }
  item();
}

void PickleWriter::value(double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  out_.push_back(kBinFloat);
  for (int i = 7; i >= 0; --i) out_.push_back(static_cast<char>((bits >> (8 * i)) & 0xff));  // big-endian
  item();
}

void PickleWriter::value(bool v) {
  out_.push_back(v ? kNewTrue : kNewFalse);
  item();
}

void PickleWriter::value(const std::string& v) {
  out_.push_back(kBinUnicode);
  put_le(out_, v.size(), 4);
  out_ += v;
  item();
}

std::string PickleWriter::finish() {
  out_.push_back(kStop);
  return std::move(out_);
}

}  // namespace fsdp::io
