// Generate stream client reactor.
#include "tools/loadgen/stream_call.h"

#include <chrono>

namespace moeserve::loadgen {
namespace {

namespace v1 = moeserve::v1;

class GenerateCall : public grpc::ClientReadReactor<v1::GenerateResponse> {
 public:
  GenerateCall(v1::GenerateRequest request, const CallOptions& options, Clock::time_point origin,
               std::function<void(RequestResult)> done)
      : request_(std::move(request)), origin_(origin), done_(std::move(done)) {
    if (!options.api_key.empty()) ctx_.AddMetadata("authorization", "Bearer " + options.api_key);
    if (options.timeout_seconds > 0) {
      ctx_.set_deadline(std::chrono::system_clock::now() +
                        std::chrono::microseconds(static_cast<int64_t>(options.timeout_seconds * 1e6)));
    }
    result_.prompt_tokens = request_.has_token_ids() ? request_.token_ids().ids_size() : 0;
  }

  void Start(v1::Moeserve::Stub* stub) {
    sent_ = Clock::now();
    last_ = sent_;
    result_.send_seconds = Seconds(origin_, sent_);
    stub->async()->Generate(&ctx_, &request_, this);
    StartRead(&response_);
    StartCall();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // the stream ended; OnDone follows
    const auto now = Clock::now();
    if (response_.token_ids_size() > 0) {
      if (result_.output_tokens == 0) {
        result_.ttft_seconds = Seconds(sent_, now);
      } else {
        result_.itl_seconds.push_back(Seconds(last_, now));
      }
      last_ = now;
      result_.output_tokens += response_.token_ids_size();
    }
    if (!response_.finish_reason().empty()) got_final_ = true;
    if (response_.has_usage()) {
      result_.prompt_tokens = response_.usage().prompt_tokens();
      result_.cached_prompt_tokens = response_.usage().cached_prompt_tokens();
    }
    if (response_.has_receipt()) {
      const auto& rc = response_.receipt();
      result_.receipt = {rc.device_seconds(),          rc.prefill_device_seconds(), rc.decode_device_seconds(),
                         rc.transfer_device_seconds(), rc.kv_gb_seconds(),          rc.cost_usd()};
    }
    StartRead(&response_);
  }

  void OnDone(const grpc::Status& status) override {
    // As vLLM measures it: to the last message that carried tokens (not the trailers).
    result_.e2e_seconds = Seconds(sent_, result_.output_tokens > 0 ? last_ : Clock::now());
    // The server sends the last message and its OK status together, but this client's own
    // deadline can still fire between the two frames: a stream whose last message arrived is
    // complete, whatever the library says after it.
    result_.status_code = got_final_ ? 0 : static_cast<int>(status.error_code());
    result_.error = got_final_ ? "" : status.error_message();
    done_(std::move(result_));
    delete this;
  }

 private:
  static double Seconds(Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double>(b - a).count();
  }

  grpc::ClientContext ctx_;
  v1::GenerateRequest request_;
  v1::GenerateResponse response_;
  Clock::time_point origin_, sent_, last_;
  RequestResult result_;
  bool got_final_ = false;
  std::function<void(RequestResult)> done_;
};

}  // namespace

void StartGenerate(v1::Moeserve::Stub* stub, v1::GenerateRequest request, const CallOptions& options,
                   Clock::time_point origin, std::function<void(RequestResult)> done) {
  auto* call = new GenerateCall(std::move(request), options, origin, std::move(done));
  call->Start(stub);
}

}  // namespace moeserve::loadgen
