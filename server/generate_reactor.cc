// Generate stream reactor.
#include "server/generate_reactor.h"

#include "server/wire.h"

namespace moeserve::server {

grpc::Status ToGrpcStatus(const absl::Status& s) {
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

GenerateReactor::GenerateReactor(Engine* engine, grpc::CallbackServerContext* ctx, const grpc::ByteBuffer& raw,
                                 const RequestLimits& limits,
                                 std::shared_ptr<const ModelTokenizer> tokenizer,
                                 const absl::StatusOr<std::string>& tenant, DrainGate* gate,
                                 StreamEncoder* encoder)
    : engine_(engine), encoder_(encoder), tokenizer_(std::move(tokenizer)) {
  if (gate != nullptr) {
    if (!gate->TryEnter()) {
      finished_ = true;
      Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the server is shutting down"));
      return;
    }
    entered_gate_ = gate;
  }
  if (!tenant.ok()) {
    finished_ = true;
    Finish(ToGrpcStatus(tenant.status()));
    return;
  }
  v1::GenerateRequest request;
  if (absl::Status s = ParseRequest(raw, &request); !s.ok()) {
    finished_ = true;
    Finish(ToGrpcStatus(s));
    return;
  }
  TextOptions text;
  auto req = ToEngineRequest(request, engine->model_config(), limits, *tokenizer_, &text);
  if (!req.ok()) {
    finished_ = true;
    Finish(ToGrpcStatus(req.status()));
    return;
  }
  req->cache_tenant = *tenant;
  stream_.emplace(tokenizer_->tokenizer.get(), req->prompt, text, *req);
  const auto deadline = ctx->deadline();
  if (deadline != std::chrono::system_clock::time_point::max()) {
    req->deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(deadline - std::chrono::system_clock::now());
  }
  // Hold the lock across Submit so that events arriving at once wait for id_.
  std::lock_guard<std::mutex> lock(mu_);
  auto id = engine_->Submit(*std::move(req), [this](const RequestEvent& ev) { OnEvent(ev); });
  if (!id.ok()) {
    finished_ = true;
    Finish(ToGrpcStatus(id.status()));
    return;
  }
  id_ = *id;
  if (cancel_requested_) engine_->Cancel(*id_);
}

void GenerateReactor::OnEvent(const RequestEvent& ev) {
  std::lock_guard<std::mutex> lock(mu_);
  if (encoder_ == nullptr) return AppendLocked(ev);
  // On the engine thread: keep the event and hand the encoding to the encoder thread, once
  // per batch of events (the stream cannot end while it is posted: its final event is in it).
  raw_.push_back(ev);
  if (!encode_posted_) {
    encode_posted_ = true;
    encoder_->Post([this] { Encode(); });
  }
}

void GenerateReactor::Encode() {
  std::lock_guard<std::mutex> lock(mu_);
  encode_posted_ = false;
  std::deque<RequestEvent> events;
  events.swap(raw_);
  for (const RequestEvent& ev : events) AppendLocked(ev);
}

namespace {

// The last message's usage (completion_tokens: the tokens answered), timing and receipt.
void SetFinal(const RequestEvent& ev, v1::GenerateResponse* r) {
  v1::Usage* u = r->mutable_usage();
  u->set_prompt_tokens(ev.usage.prompt_tokens);
  u->set_cached_prompt_tokens(ev.usage.cached_prompt_tokens);
  u->set_completion_tokens(ev.usage.completion_tokens);
  u->set_cached_prompt_tokens_ddr(ev.usage.cached_prompt_tokens_ddr);
  u->set_cached_prompt_tokens_flash(ev.usage.cached_prompt_tokens_flash);
  u->set_preemptions(ev.preemptions);
  u->set_swaps(ev.swaps);
  v1::Timing* t = r->mutable_timing();
  t->set_queue_seconds(ev.timing.queue_seconds);
  t->set_time_to_first_token_seconds(ev.timing.ttft_seconds);
  t->set_time_per_output_token_seconds(ev.timing.tpot_seconds);
  t->set_e2e_seconds(ev.timing.e2e_seconds);
  v1::Receipt* rc = r->mutable_receipt();
  rc->set_queue_seconds(ev.receipt.queue_seconds);
  rc->set_prefill_seconds(ev.receipt.prefill_seconds);
  rc->set_decode_seconds(ev.receipt.decode_seconds);
  rc->set_steps(ev.receipt.steps);
  rc->set_mean_batch_size(ev.receipt.mean_batch_size);
  rc->set_cached_tokens(ev.receipt.cached_tokens);
  rc->set_device_seconds(ev.receipt.device_seconds);
  rc->set_cost_usd(ev.receipt.cost_usd);
  rc->set_prefill_device_seconds(ev.receipt.prefill_device_seconds);
  rc->set_decode_device_seconds(ev.receipt.decode_device_seconds);
  rc->set_transfer_device_seconds(ev.receipt.transfer_device_seconds);
  rc->set_kv_gb_seconds(ev.receipt.kv_gb_seconds);
}

}  // namespace

void GenerateReactor::AppendLocked(const RequestEvent& ev) {
  CompletionText piece;
  stream_->Take(ev, &piece);  // text through the stop strings; no tokens after one
  if (id_ && stream_->StopNow()) engine_->Cancel(*id_);  // a stop string: the rest is not wanted
  if (piece.token_ids.empty() && !ev.finished) return;
  // Coalesce into the last queued response while a write is in flight.
  if (queue_.empty() || !queue_.back().finish_reason().empty()) queue_.emplace_back();
  v1::GenerateResponse& r = queue_.back();
  r.mutable_text()->append(piece.text);
  for (size_t i = 0; i < piece.token_ids.size(); ++i) {
    r.add_token_ids(piece.token_ids[i]);
    if (i >= piece.logprobs.size()) continue;
    v1::TokenInfo* info = r.add_logprobs();
    if (i < piece.chosen.size()) info->set_logprob(piece.chosen[i]);
    for (const auto& lp : piece.logprobs[i]) {
      v1::TokenLogprob* t = info->add_top_logprobs();
      t->set_token_id(lp.token);
      t->set_logprob(lp.logprob);
    }
  }
  if (ev.finished) {
    // The held text first: it may complete a stop string, which makes the reason "stop".
    const std::string rest = stream_->FinishText();
    const absl::StatusOr<std::string> reason = stream_->Outcome();
    if (reason.ok()) {
      r.mutable_text()->append(rest);
      r.set_finish_reason(*reason);
      if (stream_->stopped()) r.set_stop_string(stream_->matched());
      SetFinal(stream_->Final(), &r);
      final_status_ = grpc::Status::OK;
    } else {
      final_status_ = ToGrpcStatus(reason.status());
      queue_.clear();  // nothing more reaches a failed stream
    }
  }
  WriteNextLocked();
}

void GenerateReactor::WriteNextLocked() {
  if (writing_ || finished_) return;
  if (!queue_.empty() && !client_gone_) {
    SerializeResponse(queue_.front(), &in_flight_);
    queue_.pop_front();
    if (queue_.empty() && final_status_.has_value() && final_status_->ok()) {
      // The last message and the OK status in one operation, so the server does not act on a
      // deadline or cancellation between them. OnDone follows, not OnWriteDone.
      finished_ = true;
      StartWriteAndFinish(&in_flight_, grpc::WriteOptions(), *final_status_);
      return;
    }
    writing_ = true;
    StartWrite(&in_flight_);
    return;
  }
  if (final_status_.has_value()) {
    finished_ = true;
    Finish(*final_status_);
  }
}

void GenerateReactor::OnWriteDone(bool ok) {
  std::lock_guard<std::mutex> lock(mu_);
  writing_ = false;
  if (!ok && !client_gone_) {
    // The client is gone: stop generating; Finish follows the engine's final event.
    client_gone_ = true;
    queue_.clear();
    if (id_) engine_->Cancel(*id_);
  }
  WriteNextLocked();
}

void GenerateReactor::OnCancel() {
  std::lock_guard<std::mutex> lock(mu_);
  client_gone_ = true;
  queue_.clear();
  if (id_) {
    engine_->Cancel(*id_);
  } else {
    cancel_requested_ = true;
  }
}

}  // namespace moeserve::server
