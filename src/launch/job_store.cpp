#include "fsdp/launch/job_store.h"

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "fsdp/common/error.h"
#include "fsdp/common/error_text.h"

namespace fsdp::launch {
namespace {

class TcpJobStore : public JobStore {
 public:
  explicit TcpJobStore(c10::intrusive_ptr<c10d::TCPStore> store) : store_(std::move(store)) {}

  int64_t add(const std::string& key, int64_t delta) override { return store_->add(key, delta); }

  void set(const std::string& key, const std::string& value) override {
    store_->set(key, std::vector<uint8_t>(value.begin(), value.end()));
  }

  std::optional<std::string> get_if_set(const std::string& key) override {
    if (!store_->check({key})) return std::nullopt;
    const auto bytes = store_->get(key);
    return std::string(bytes.begin(), bytes.end());
  }

 private:
  c10::intrusive_ptr<c10d::TCPStore> store_;
};

}  // namespace

std::unique_ptr<JobStore> open_tcp_job_store(const std::string& addr, int port, bool serve,
                                             std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions opts;
  opts.port = static_cast<std::uint16_t>(port);
  opts.isServer = serve;
  opts.waitWorkers = false;
  opts.timeout = timeout;
  try {
    return std::make_unique<TcpJobStore>(c10::make_intrusive<c10d::TCPStore>(addr, opts));
  } catch (const std::exception& e) {
    throw Error(std::string("fsdp launch: ") + (serve ? "cannot serve" : "cannot reach") + " the job store at " +
                addr + ":" + std::to_string(port) + (serve ? "" : " (node 0's launcher)") + ": " + error_text(e));
  }
}

}  // namespace fsdp::launch
