#pragma once
// Python pickles of plain data (dicts, lists, ints, floats, strings, bools),
// written as a stream: protocol 2 and only the opcodes PyTorch's memory
// viewer (MemoryViz.js) reads as well as Python's pickle. Light header.

#include <cstdint>
#include <string>
#include <vector>

namespace fsdp::io {

class PickleWriter {
 public:
  PickleWriter();
  // Containers: items (lists) or key, value pairs (dicts) between begin and end.
  void begin_dict();
  void end_dict();
  void begin_list();
  void end_list();
  void value(int64_t v);
  void value(double v);
  void value(bool v);
  void value(const std::string& v);
  void value(const char* v) { value(std::string(v)); }
  // The pickle, closed with STOP.
  std::string finish();

 private:
  // Items are appended 1000 at a time, as CPython's pickler does: a reader
  // may pass one batch's items as a function's arguments (MemoryViz.js).
  static constexpr int kBatch = 1000;
  struct Open {
    bool list;
    int items = 0;  // in the current batch (a dict's keys and values both count)
  };
  void item();
  std::string out_;
  std::vector<Open> open_;
};

}  // namespace fsdp::io
