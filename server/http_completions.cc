// OpenAI completions on the engine: whole responses and server-sent events.
#include "server/http_completions.h"

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "models/stream_detokenizer.h"

namespace moeserve::server {
namespace {

using Json = nlohmann::json;

// What the engine's callback hands over (on the engine thread) to the HTTP thread.
struct Job {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<RequestEvent> events;
  bool ended = false;  // the final event is queued
  uint64_t id = 0;
};

// Text from tokens, in whole characters, held back where it could begin a stop string; cut at
// the first stop string.
class TextStream {
 public:
  TextStream(const std::vector<std::string>& stop, const ParsedCompletion& p)
      : stop_(stop), decoder_(p.tokenizer->tokenizer.get(), p.request.prompt) {
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

 private:
  std::string Drain(bool final) {
    if (stopped_) return "";
    std::string out;
    if (CutAtStop(&pending_, stop_)) {
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
    out->text += text->Push(ev.tokens[i]);
  }
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

std::string Sse(const Json& j) { return absl::StrCat("data: ", j.dump(), "\n\n"); }

}  // namespace

void RunCompletion(Engine* engine, ParsedCompletion p, httplib::Response& res,
                   std::function<void()> on_end) {
  auto job = std::make_shared<Job>();
  auto id = engine->Submit(p.request, [job](const RequestEvent& ev) {
    std::lock_guard<std::mutex> lock(job->mu);
    job->events.push_back(ev);
    if (ev.finished) job->ended = true;
    job->cv.notify_all();
  });
  if (!id.ok()) {
    const ApiError e = ToApiError(id.status());
    res.status = e.http_status;
    res.set_content(e.ToJson().dump(), "application/json");
    on_end();
    return;
  }
  job->id = *id;
  const std::string cid = NewId(p.chat);
  const int64_t created = Now();

  if (!p.stream) {  // wait for the whole answer on this thread
    TextStream text(p.stop, p);
    CompletionText out;
    bool cancelled = false;
    RequestEvent final_event;
    for (bool ended = false; !ended;) {
      std::deque<RequestEvent> events;
      {
        std::unique_lock<std::mutex> lock(job->mu);
        job->cv.wait(lock, [&] { return !job->events.empty(); });
        events.swap(job->events);
      }
      for (const RequestEvent& ev : events) {
        Take(ev, &text, &out);
        if (ev.finished) {
          ended = true;
          final_event = ev;
        }
      }
      if (text.stopped() && !cancelled && !ended) {  // a stop string: the rest is not wanted
        engine->Cancel(job->id);
        cancelled = true;
      }
    }
    out.text += text.Finish();
    absl::Status error;
    const auto reason = FinishReason(final_event, text.stopped(), &error);
    if (!reason) {
      const ApiError e = ToApiError(error);
      res.status = e.http_status;
      res.set_content(e.ToJson().dump(), "application/json");
    } else {
      res.set_content(CompletionObject(p, cid, created, out, *reason, final_event).dump(),
                      "application/json");
    }
    on_end();
    return;
  }

  // Streaming: httplib calls the provider until it finishes the stream or the client is gone.
  struct StreamState {
    explicit StreamState(const ParsedCompletion& p) : text(p.stop, p) {}
    TextStream text;
    bool first = true, cancelled = false, done = false;
  };
  auto state = std::make_shared<StreamState>(p);
  auto parsed = std::make_shared<ParsedCompletion>(std::move(p));
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [engine, job, state, parsed, cid, created](size_t, httplib::DataSink& sink) -> bool {
        std::deque<RequestEvent> events;
        {
          std::unique_lock<std::mutex> lock(job->mu);
          job->cv.wait_for(lock, std::chrono::milliseconds(100),
                           [&] { return !job->events.empty(); });
          events.swap(job->events);
        }
        auto write = [&](const Json& j) {
          const std::string s = Sse(j);
          return sink.write(s.data(), s.size());
        };
        if (events.empty()) return sink.is_writable();  // still there: wait on
        for (const RequestEvent& ev : events) {
          CompletionText delta;
          Take(ev, &state->text, &delta);
          if (state->text.stopped() && !state->cancelled && !ev.finished) {
            engine->Cancel(job->id);
            state->cancelled = true;
          }
          if (ev.finished) {
            delta.text += state->text.Finish();
            absl::Status error;
            const auto reason = FinishReason(ev, state->text.stopped(), &error);
            if (!delta.text.empty() &&
                !write(ChunkObject(*parsed, cid, created, delta, std::nullopt, state->first))) {
              return false;
            }
            state->first = false;
            if (reason) {
              if (!write(ChunkObject(*parsed, cid, created, {}, reason, false))) return false;
              if (parsed->include_usage) {
                const Json usage = {
                    {"id", cid},
                    {"object", parsed->chat ? "chat.completion.chunk" : "text_completion"},
                    {"created", created},
                    {"model", parsed->model},
                    {"choices", Json::array()},
                    {"usage", UsageObject(ev)}};
                if (!write(usage)) return false;
              }
            } else if (!write(ToApiError(error).ToJson())) {
              return false;
            }
            const std::string end = "data: [DONE]\n\n";
            sink.write(end.data(), end.size());
            state->done = true;
            sink.done();
            return true;
          }
          if (delta.text.empty() && !state->first) continue;  // nothing new to say yet
          if (!write(ChunkObject(*parsed, cid, created, delta, std::nullopt, state->first))) {
            engine->Cancel(job->id);  // the client is gone
            return false;
          }
          state->first = false;
        }
        return true;
      },
      [engine, job, state, on_end](bool) {
        if (!state->done) engine->Cancel(job->id);  // gone mid-stream: the engine frees its KV
        on_end();
      });
}

}  // namespace moeserve::server
