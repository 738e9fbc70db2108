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
#include "server/completion_choice.h"

namespace moeserve::server {
namespace {

using Json = nlohmann::json;

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
std::string Sse(const Json& j) { return absl::StrCat("data: ", JsonText(j), "\n\n"); }

}  // namespace

// One completion of `n` choices, each a request in the engine: events from the engine thread are
// queued and turned into the answer on the encoder thread (text, JSON, writes), so the engine
// never spends a step's time on them.
class Completion : public std::enable_shared_from_this<Completion> {
 public:
  Completion(Engine* engine, StreamEncoder* encoder, ParsedCompletion p, std::shared_ptr<HttpReply> reply,
             std::function<void()> on_end)
      : engine_(engine), encoder_(encoder), p_(std::move(p)), reply_(std::move(reply)),
        on_end_(std::move(on_end)), cid_(NewId(p_.chat)), created_(Now()) {
    for (size_t i = 0; i < p_.prompts.size() * static_cast<size_t>(p_.best_of); ++i) {
      choices_.emplace_back(p_, static_cast<int>(i));
    }
    expected_ = choices_.size();
  }

  void set_engine_id(int index, uint64_t id) {
    std::lock_guard<std::mutex> lock(out_mu_);
    choices_[static_cast<size_t>(index)].engine_id = id;
  }
  const ParsedCompletion& parsed() const { return p_; }

  // Engine thread: queue, and post one drain to the encoder while events wait (once started).
  void OnEvent(int index, const RequestEvent& ev) {
    std::lock_guard<std::mutex> lock(mu_);
    events_.emplace_back(index, ev);
    if (posted_ || !started_) return;
    posted_ = true;
    encoder_->Post([self = shared_from_this()] { self->Drain(); });
  }

  // The answer can take the events: the stream has started (or the answer is whole, or already
  // given). Until then they wait, since a chunk written before StartStream is refused as if the
  // client had left: a request whose first events came before its handler started the stream
  // answered an empty stream and was cancelled.
  void Start() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      started_ = true;
      if (posted_ || events_.empty()) return;
      posted_ = true;
    }
    encoder_->Post([self = shared_from_this()] { self->Drain(); });
  }

  // Every choice submitted so far is cancelled (the client left).
  void CancelAll() {
    std::lock_guard<std::mutex> lock(out_mu_);
    CancelAllLocked();
  }

  // Choice `submitted` could not be submitted, and the caller answers with why: the choices
  // before it are cancelled, and the completion ends once they have.
  void Abandon(int submitted) {
    std::lock_guard<std::mutex> lock(out_mu_);
    answered_ = true;
    expected_ = static_cast<size_t>(submitted);
    CancelAllLocked();
    if (finished_ >= expected_ && on_end_) std::exchange(on_end_, nullptr)();
  }

  // The drain's grace is over: an error event and [DONE] end the stream; the requests are cancelled.
  void EndWithError(const std::string& why) {
    std::lock_guard<std::mutex> lock(out_mu_);
    if (!answered_) {
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
    CancelAllLocked();
  }

 private:
  void CancelAllLocked() {
    for (const CompletionChoice& c : choices_) {
      if (c.engine_id != 0 && !c.stream.ended()) engine_->Cancel(c.engine_id);
    }
  }

  void Drain() {
    // A whole answer's connection is not watched while it waits: look at its socket once per
    // batch of events, so a client that left cancels its choices (OnGone's callback) within a step.
    if (!p_.stream) reply_->CheckGone();
    std::deque<std::pair<int, RequestEvent>> events;
    {
      std::lock_guard<std::mutex> lock(mu_);
      events.swap(events_);
      posted_ = false;
    }
    std::lock_guard<std::mutex> lock(out_mu_);
    for (const auto& [index, ev] : events) {
      CompletionChoice& c = choices_[static_cast<size_t>(index)];
      c.Take(ev, p_);
      if (ev.finished) ++finished_;
      if (p_.stream) StreamEvent(index, ev.finished);
      if (c.engine_id != 0 && c.stream.StopNow()) engine_->Cancel(c.engine_id);  // a stop string: the rest is not wanted
      if (finished_ == expected_) {
        if (!p_.stream) FinishWhole();
        if (on_end_) std::exchange(on_end_, nullptr)();
      }
    }
  }

  void FinishWhole() {
    if (answered_) return;
    answered_ = true;
    std::vector<Json> objects;
    for (CompletionChoice& c : choices_) {
      c.taken.text += c.stream.FinishText();
      const absl::StatusOr<std::string> reason = c.stream.Outcome();
      if (!reason.ok()) {
        const ApiError e = ToApiError(reason.status());
        reply_->Send(e.http_status, "application/json", JsonText(e.ToJson()));
        return;
      }
      CompletionText answer = c.Answer(p_);
      if (!p_.want_logprobs) answer.chosen.clear(), answer.logprobs.clear();  // best_of's, not the client's
      objects.push_back(ChoiceObject(p_, 0, answer, *reason, c.StopReason(p_), c.PromptLogprobs(p_)));
      if (p_.return_token_ids) {  // vLLM's: the generated ids, and (completions) the prompt's
        objects.back()["token_ids"] = c.taken.token_ids;
        if (!p_.chat) objects.back()["prompt_token_ids"] = p_.prompts[static_cast<size_t>(c.prompt_index)];
      }
    }
    // Each prompt's n answers: its candidates with the highest mean logprob per token (all of
    // them, in order, unless best_of > n).
    Json out = Json::array();
    const size_t per = static_cast<size_t>(p_.best_of);
    for (size_t k = 0; k < p_.prompts.size(); ++k) {
      std::vector<size_t> order(per);
      for (size_t i = 0; i < per; ++i) order[i] = k * per + i;
      if (p_.best_of > p_.n) {
        std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
          return choices_[a].MeanLogprob() > choices_[b].MeanLogprob();
        });
      }
      for (int j = 0; j < p_.n; ++j) {
        out.push_back(objects[order[static_cast<size_t>(j)]]);
        out.back()["index"] = static_cast<int>(k) * p_.n + j;
      }
    }
    Json answer = CompletionObject(p_, cid_, created_, out, MergedFinal(choices_));
    if (p_.chat && p_.return_token_ids) answer["prompt_token_ids"] = p_.prompts[0];
    if (p_.chat && p_.request.prompt_logprobs >= 0) answer["prompt_logprobs"] = choices_[0].PromptLogprobs(p_);
    reply_->Send(200, "application/json", JsonText(answer));
  }

  // return_token_ids: a choice's first chunk carries its prompt's ids, as vLLM's.
  Json WithPromptIds(Json chunk, const CompletionChoice& c) const {
    if (!p_.return_token_ids || !c.first) return chunk;
    const std::vector<int32_t>& prompt = p_.prompts[static_cast<size_t>(c.prompt_index)];
    if (p_.chat) {
      chunk["prompt_token_ids"] = prompt;
    } else {
      chunk["choices"][0]["prompt_token_ids"] = prompt;
    }
    return chunk;
  }

  // Tokens whose text is held back (part of a character, or of a possible stop string) wait
  // with their logprobs for the chunk that carries their text: none is dropped.
  void StreamEvent(int index, bool finished) {
    if (answered_) return;
    CompletionChoice& c = choices_[static_cast<size_t>(index)];
    if (c.first && p_.echo && !c.echoed) {  // the prompt's text opens the choice's stream
      if (!p_.return_token_ids) c.taken.text.insert(0, p_.prompt_texts[static_cast<size_t>(c.prompt_index)]);
      c.echoed = true;
    }
    if (!finished) {
      if (c.taken.text.empty() && !c.first) return;  // nothing new to say yet
      if (!reply_->Write(Sse(WithPromptIds(ChunkObject(p_, cid_, created_, c.taken, std::nullopt, c.first, nullptr, index), c)))) {
        CancelAllLocked();
      }
      c.taken = CompletionText();
      c.first = false;
      return;
    }
    CompletionText delta = std::exchange(c.taken, CompletionText());
    delta.text += c.stream.FinishText();
    const absl::StatusOr<std::string> reason = c.stream.Outcome();
    if (!reason.ok()) {  // the whole answer ends with the error
      answered_ = true;
      reply_->Write(Sse(ToApiError(reason.status()).ToJson()));
      reply_->Write("data: [DONE]\n\n");
      reply_->End();
      CancelAllLocked();
      return;
    }
    if (!delta.text.empty() || !delta.token_ids.empty()) {
      reply_->Write(Sse(WithPromptIds(ChunkObject(p_, cid_, created_, delta, std::nullopt, c.first, nullptr, index), c)));
    }
    reply_->Write(Sse(ChunkObject(p_, cid_, created_, {}, *reason, false, c.StopReason(p_), index)));
    if (finished_ < expected_) return;
    answered_ = true;
    if (p_.include_usage) {
      reply_->Write(Sse({{"id", cid_},
                         {"object", p_.chat ? "chat.completion.chunk" : "text_completion"},
                         {"created", created_},
                         {"model", p_.model},
                         {"system_fingerprint", p_.system_fingerprint.empty() ? Json(nullptr) : Json(p_.system_fingerprint)},
                         {"choices", Json::array()},
                         {"usage", UsageObject(MergedFinal(choices_))}}));
    }
    reply_->Write("data: [DONE]\n\n");
    reply_->End();
  }

  Engine* engine_;
  StreamEncoder* encoder_;
  const ParsedCompletion p_;
  std::mutex mu_;  // the queue
  std::deque<std::pair<int, RequestEvent>> events_;
  bool posted_ = false, started_ = false;
  std::mutex out_mu_;  // the answer: written by the encoder, or ended by the drain
  std::vector<CompletionChoice> choices_;
  size_t finished_ = 0, expected_ = 0;  // choices ended; choices that will end (n, or fewer submitted)
  bool answered_ = false;
  std::shared_ptr<HttpReply> reply_;
  std::function<void()> on_end_;
  const std::string cid_;
  const int64_t created_;
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
  const ParsedCompletion& parsed = c->parsed();
  const int choices = static_cast<int>(parsed.prompts.size()) * parsed.best_of;
  for (int i = 0; i < choices; ++i) {
    GenerateRequest r = parsed.request;
    r.prompt = parsed.prompts[static_cast<size_t>(i / parsed.best_of)];
    // Choice i of a seeded request samples from seed + i % n (choice 0 is the n = 1 answer);
    // unseeded ones get the engine's per-request streams, distinct already.
    if (r.sampling.seed) *r.sampling.seed += static_cast<uint64_t>(i % parsed.best_of);
    auto id = engine->Submit(r, [c, i](const RequestEvent& ev) { c->OnEvent(i, ev); });
    if (!id.ok()) {  // the queue is full: none of the choices runs
      c->Abandon(i);     // ends the completion (on_end) once the choices before i have ended
      const ApiError e = ToApiError(id.status());
      reply->Send(e.http_status, "application/json", JsonText(e.ToJson()));
      c->Start();  // the earlier choices' events, to count their ends
      return;
    }
    c->set_engine_id(i, *id);
  }
  // A client that leaves cancels its requests: the engine frees their KV within a step.
  reply->OnGone([weak = std::weak_ptr<Completion>(c)] {
    if (auto alive = weak.lock()) alive->CancelAll();
  });
  if (stream) {
    reply->StartStream(200, "text/event-stream", {{"Cache-Control", "no-cache"}});
  }
  c->Start();
  streams->Add(c);
}

}  // namespace moeserve::server
