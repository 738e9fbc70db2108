// OpenAI completions on the engine: whole responses and server-sent events.
#include "server/http_completions.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <mutex>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "models/stream_detokenizer.h"

namespace moeserve::server {
namespace {

using Json = nlohmann::json;

// Text from tokens, in whole characters, held back where it could begin a stop string; cut at
// the first stop string.
class TextStream {
 public:
  TextStream(const std::vector<std::string>& stop, const ParsedCompletion& p)
      : stop_(stop), include_stop_(p.include_stop_str), decoder_(p.tokenizer->tokenizer.get(), p.request.prompt) {
    for (const std::string& s : stop_) hold_ = std::max(hold_, s.size() - 1);
  }
  std::string Push(int32_t token) {
    pending_ += decoder_.Push(token);
    return Drain(false);
  }
  std::string Finish() {
    pending_ += decoder_.Flush();
    return Drain(true);
  }
  bool stopped() const { return stopped_; }
  const std::string& matched() const { return matched_; }  // the stop string, once stopped

 private:
  std::string Drain(bool final) {
    if (stopped_) return "";
    std::string out;
    if (CutAtStop(&pending_, stop_, include_stop_, &matched_)) {
      stopped_ = true;
      out.swap(pending_);
      return out;
    }
    size_t cut = pending_.size() - (final ? 0 : std::min(hold_, pending_.size()));
    while (cut > 0 && cut < pending_.size() &&
           (static_cast<unsigned char>(pending_[cut]) & 0xC0) == 0x80)
      --cut;
    out = pending_.substr(0, cut);
    pending_.erase(0, cut);
    return out;
  }

  std::vector<std::string> stop_;
  std::string matched_;
  bool include_stop_ = false;
  size_t hold_ = 0;
  StreamDetokenizer decoder_;
  std::string pending_;
  bool stopped_ = false;
};

std::string NewId(bool chat) {
  std::random_device rd;
  return absl::StrFormat("%s-%016x%08x", chat ? "chatcmpl" : "cmpl",
                         (static_cast<uint64_t>(rd()) << 32) | rd(), rd());
}

int64_t Now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Appends an event's tokens (and logprobs) to `out` through `text`.
void Take(const RequestEvent& ev, TextStream* text, CompletionText* out) {
  for (size_t i = 0; i < ev.tokens.size(); ++i) {
    if (text->stopped()) return;
    out->token_ids.push_back(ev.tokens[i]);
    if (i < ev.logprobs.size()) out->logprobs.push_back(ev.logprobs[i]);
    if (i < ev.token_logprobs.size()) out->chosen.push_back(ev.token_logprobs[i]);
    out->text += text->Push(ev.tokens[i]);
  }
}

// vLLM's stop_reason: the stop string that cut the text, or the stop token id the request named
// that ended it; null for an EOS and for the length limit.
Json StopReason(const TextStream& text, const RequestEvent& ev, const ParsedCompletion& p,
                std::optional<int32_t> last_token) {
  if (text.stopped()) return text.matched();
  if (ev.reason == FinishReason::kStop && last_token &&
      std::find(p.user_stop_ids.begin(), p.user_stop_ids.end(), *last_token) != p.user_stop_ids.end()) {
    return *last_token;
  }
  return nullptr;
}

// The finish reason of a request that ended normally, or its error.
std::optional<std::string> FinishReason(const RequestEvent& ev, bool stopped, absl::Status* error) {
  if (stopped) return "stop";
  switch (ev.reason) {
    case FinishReason::kLength:
      return "length";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kCancelled:
      *error = absl::UnavailableError(ev.message);
      break;
    case FinishReason::kDeadline:
      *error = absl::DeadlineExceededError(ev.message);
      break;
    case FinishReason::kError:
      *error = absl::Status(ev.error_code == absl::StatusCode::kUnavailable ? absl::StatusCode::kUnavailable
                                                                            : absl::StatusCode::kInternal,
                            ev.message);
      break;
  }
  return std::nullopt;
}

std::string Sse(const Json& j) { return absl::StrCat("data: ", JsonText(j), "\n\n"); }

}  // namespace

// One completion: events from the engine thread are queued and turned into the answer on the
// encoder thread (text, JSON, writes), so the engine never spends a step's time on them.
class Completion : public std::enable_shared_from_this<Completion> {
 public:
  Completion(Engine* engine, StreamEncoder* encoder, ParsedCompletion p, std::shared_ptr<HttpReply> reply,
             std::function<void()> on_end)
      : engine_(engine), encoder_(encoder), p_(std::move(p)), text_(p_.stop, p_), reply_(std::move(reply)),
        on_end_(std::move(on_end)), cid_(NewId(p_.chat)), created_(Now()) {}

  void set_id(uint64_t id) { id_ = id; }
  uint64_t id() const { return id_; }
  bool stream() const { return p_.stream; }
  const ParsedCompletion& parsed() const { return p_; }

  // Engine thread: queue, and post one drain to the encoder while events wait.
  void OnEvent(const RequestEvent& ev) {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(ev);
    if (posted_) return;
    posted_ = true;
    encoder_->Post([self = shared_from_this()] { self->Drain(); });
  }

  // The drain's grace is over: an error event and [DONE] end the stream; the request is cancelled.
  void EndWithError(const std::string& why) {
    {
      std::lock_guard<std::mutex> lock(out_mu_);
      if (answered_) return;
      answered_ = true;
      if (p_.stream) {
        reply_->Write(Sse(ToApiError(absl::UnavailableError(why)).ToJson()));
        reply_->Write("data: [DONE]\n\n");
        reply_->End();
      } else {
        const ApiError e = ToApiError(absl::UnavailableError(why));
        reply_->Send(e.http_status, "application/json", JsonText(e.ToJson()));
      }
    }
    engine_->Cancel(id_);
  }

 private:
  void Drain() {
    std::deque<RequestEvent> events;
    {
      std::lock_guard<std::mutex> lock(mu_);
      events.swap(events_);
      posted_ = false;
    }
    std::lock_guard<std::mutex> lock(out_mu_);
    for (const RequestEvent& ev : events) {
      if (!ev.tokens.empty()) last_token_ = ev.tokens.back();
      if (p_.stream) {
        StreamEvent(ev);
      } else {
        Take(ev, &text_, &whole_);
        if (ev.finished) FinishWhole(ev);
      }
      if (text_.stopped() && !stop_cancelled_ && !ev.finished) {  // a stop string: the rest is not wanted
        stop_cancelled_ = true;
        engine_->Cancel(id_);
      }
      if (ev.finished && on_end_) std::exchange(on_end_, nullptr)();
    }
  }

  void FinishWhole(const RequestEvent& ev) {
    if (answered_) return;
    answered_ = true;
    whole_.text += text_.Finish();
    absl::Status error;
    const auto reason = FinishReason(ev, text_.stopped(), &error);
    if (!reason) {
      const ApiError e = ToApiError(error);
      reply_->Send(e.http_status, "application/json", JsonText(e.ToJson()));
      return;
    }
    reply_->Send(200, "application/json",
                 JsonText(CompletionObject(p_, cid_, created_, whole_, *reason, ev, StopReason(text_, ev, p_, last_token_))));
  }

  void StreamEvent(const RequestEvent& ev) {
    if (answered_) return;
    // Tokens whose text is held back (part of a character, or of a possible stop string) wait
    // with their logprobs for the chunk that carries their text: none is dropped.
    Take(ev, &text_, &held_);
    if (!ev.finished) {
      if (held_.text.empty() && !first_) return;  // nothing new to say yet
      if (!reply_->Write(Sse(ChunkObject(p_, cid_, created_, held_, std::nullopt, first_)))) engine_->Cancel(id_);
      held_ = CompletionText();
      first_ = false;
      return;
    }
    answered_ = true;
    CompletionText delta = std::exchange(held_, CompletionText());
    delta.text += text_.Finish();
    absl::Status error;
    const auto reason = FinishReason(ev, text_.stopped(), &error);
    if (!delta.text.empty() || !delta.token_ids.empty()) {
      reply_->Write(Sse(ChunkObject(p_, cid_, created_, delta, std::nullopt, first_)));
    }
    if (reason) {
      reply_->Write(Sse(ChunkObject(p_, cid_, created_, {}, reason, false, StopReason(text_, ev, p_, last_token_))));
      if (p_.include_usage) {
        reply_->Write(Sse({{"id", cid_},
                           {"object", p_.chat ? "chat.completion.chunk" : "text_completion"},
                           {"created", created_},
                           {"model", p_.model},
                           {"choices", Json::array()},
                           {"usage", UsageObject(ev)}}));
      }
    } else {
      reply_->Write(Sse(ToApiError(error).ToJson()));
    }
    reply_->Write("data: [DONE]\n\n");
    reply_->End();
  }

  Engine* engine_;
  StreamEncoder* encoder_;
  CompletionText held_;  // streamed: tokens not yet sent, with their logprobs
  std::optional<int32_t> last_token_;  // the last token generated, for stop_reason
  const ParsedCompletion p_;
  std::mutex mu_;  // the queue
  std::deque<RequestEvent> events_;
  bool posted_ = false;
  std::mutex out_mu_;  // the answer: written by the encoder, or ended by the drain
  TextStream text_;
  CompletionText whole_;
  bool first_ = true, answered_ = false, stop_cancelled_ = false;
  std::shared_ptr<HttpReply> reply_;
  std::function<void()> on_end_;
  const std::string cid_;
  const int64_t created_;
  uint64_t id_ = 0;
};

void OpenStreams::Add(const std::shared_ptr<Completion>& c) {
  std::lock_guard<std::mutex> lock(mu_);
  std::erase_if(open_, [](const std::weak_ptr<Completion>& w) { return w.expired(); });
  open_.push_back(c);
}

void OpenStreams::EndAll(const std::string& why) {
  std::vector<std::shared_ptr<Completion>> open;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& w : open_) {
      if (auto c = w.lock()) open.push_back(std::move(c));
    }
  }
  for (const auto& c : open) c->EndWithError(why);
}

void RunCompletion(Engine* engine, StreamEncoder* encoder, OpenStreams* streams, ParsedCompletion p,
                   std::shared_ptr<HttpReply> reply, std::function<void()> on_end) {
  const bool stream = p.stream;
  auto c = std::make_shared<Completion>(engine, encoder, std::move(p), reply, on_end);
  auto id = engine->Submit(c->parsed().request, [c](const RequestEvent& ev) { c->OnEvent(ev); });
  if (!id.ok()) {
    const ApiError e = ToApiError(id.status());
    reply->Send(e.http_status, "application/json", JsonText(e.ToJson()));
    on_end();
    return;
  }
  c->set_id(*id);
  // A client that leaves cancels its request: the engine frees its KV within a step.
  reply->OnGone([engine, id = *id] { engine->Cancel(id); });
  if (stream) {
    reply->StartStream(200, "text/event-stream", {{"Cache-Control", "no-cache"}});
  }
  streams->Add(c);
}

}  // namespace moeserve::server
