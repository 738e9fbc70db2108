// The request stream both front ends use (server/request_stream.h), in process: its text
// against a whole-text oracle (decode everything, then cut at the earliest stop string that
// ends past the min_tokens text) for random tokens, event boundaries, stop strings and options;
// and the one outcome table, as gRPC and HTTP each map it.
#include "server/request_stream.h"

#include <gtest/gtest.h>

#include <random>

#include "absl/strings/str_join.h"

#include "server/generate_reactor.h"
#include "server/openai_protocol.h"
#include "tests/test_util.h"

namespace moeserve::server {
namespace {

// The earliest stop string ending after `min_end` bytes of `text` (the longest at one place).
std::optional<std::pair<size_t, std::string>> OracleStop(const std::string& text, const std::vector<std::string>& stop,
                                                         size_t min_end) {
  for (size_t at = 0; at < text.size(); ++at) {
    std::optional<std::string> best;
    for (const std::string& s : stop) {
      if (text.compare(at, s.size(), s) == 0 && at + s.size() > min_end && (!best || s.size() > best->size())) best = s;
    }
    if (best) return std::make_pair(at, *best);
  }
  return std::nullopt;
}

std::string Text(const std::vector<int32_t>& ids) {
  std::string out;
  for (int32_t id : ids) out += static_cast<char>(id);
  return out;
}

TEST(RequestStreamTest, TextEqualsTheWholeTextCutAtTheFirstStopString) {
  const uint64_t seed = testing::FreshSeed();
  std::mt19937_64 gen(seed);
  ByteTokenizer tokenizer;
  const std::vector<int32_t> prompt = {ByteTokenizer::kBos, 'h', 'i'};
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(gen); };
  int stopped_cases = 0;
  for (int trial = 0; trial < 400; ++trial) {
    // ASCII from a small alphabet (so stop strings recur), and whole two-byte characters.
    std::vector<int32_t> ids;
    const int n = pick(1, 60);
    while (static_cast<int>(ids.size()) < n) {
      if (pick(0, 9) == 0) {
        ids.push_back(0xC3), ids.push_back(0xA9);  // é
      } else {
        ids.push_back("abc de"[pick(0, 5)]);
      }
    }
    GenerateRequest request;
    request.min_tokens = pick(0, 3) == 0 ? pick(1, n) : 0;
    const bool ends_on_stop_id = pick(0, 3) == 0;  // the engine stops on a stop id: the last token
    if (ends_on_stop_id) {
      ids.push_back('#');
      request.stop_ids = {'#'};
    }
    TextOptions options;
    options.include_stop_str = pick(0, 1) == 1;
    const std::string full = Text(ids);
    for (int k = pick(0, 3); k > 0; --k) {  // whole characters, as a client's strings are
      size_t from = static_cast<size_t>(pick(0, static_cast<int>(full.size()) - 1));
      size_t to = std::min(full.size(), from + static_cast<size_t>(pick(1, 4)));
      while (from > 0 && (static_cast<unsigned char>(full[from]) & 0xC0) == 0x80) --from;
      while (to < full.size() && (static_cast<unsigned char>(full[to]) & 0xC0) == 0x80) ++to;
      options.stop.push_back(pick(0, 4) == 0 ? "zz" : full.substr(from, to - from));  // "zz": never there
    }
    // The oracle. A stop id's text is left out (unless included); the protected text is that
    // of the first min_tokens tokens.
    std::vector<int32_t> shown;
    size_t protected_bytes = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
      const bool stop_id = ids[i] == '#';
      if (!stop_id || options.include_stop_str) shown.push_back(ids[i]);
      if (static_cast<int64_t>(i) + 1 == request.min_tokens) protected_bytes = shown.size();
    }
    const std::string shown_text = Text(shown);
    // Text arrives a character at a time: the first stop string complete in it wins (at one
    // moment, the earliest, then the longest).
    std::optional<std::pair<size_t, std::string>> cut;
    for (size_t end = 1; end <= shown_text.size() && !cut; ++end) {
      if (end < shown_text.size() && (static_cast<unsigned char>(shown_text[end]) & 0xC0) == 0x80) continue;
      cut = OracleStop(shown_text.substr(0, end), options.stop, protected_bytes);
    }
    std::string expected = shown_text;
    if (cut) expected = shown_text.substr(0, cut->first + (options.include_stop_str ? cut->second.size() : 0));

    RequestStream stream(&tokenizer, prompt, options, request);
    CompletionText out;
    for (size_t at = 0; at < ids.size();) {
      RequestEvent ev;
      const size_t take = std::min(ids.size() - at, static_cast<size_t>(pick(1, 4)));
      ev.tokens.assign(ids.begin() + static_cast<long>(at), ids.begin() + static_cast<long>(at + take));
      at += take;
      ev.finished = at == ids.size();
      ev.reason = ends_on_stop_id ? FinishReason::kStop : FinishReason::kLength;
      stream.Take(ev, &out);
    }
    out.text += stream.FinishText();
    const std::string why = "seed " + std::to_string(seed) + ", trial " + std::to_string(trial) + ", tokens \"" + full +
                            "\", min_tokens " + std::to_string(request.min_tokens) + ", include " +
                            std::to_string(options.include_stop_str) + ", stop \"" + absl::StrJoin(options.stop, "\", \"") + "\"";
    ASSERT_EQ(out.text, expected) << why;
    ASSERT_EQ(stream.stopped(), cut.has_value()) << why;
    const absl::StatusOr<std::string> outcome = stream.Outcome();
    ASSERT_TRUE(outcome.ok()) << why;
    EXPECT_EQ(*outcome, cut || ends_on_stop_id ? "stop" : "length") << why;
    // The tokens answered: the answer's, through the one that completed the stop string.
    ASSERT_LE(out.token_ids.size(), ids.size()) << why;
    EXPECT_TRUE(std::equal(out.token_ids.begin(), out.token_ids.end(), ids.begin())) << why;
    EXPECT_EQ(stream.answered_tokens(), static_cast<int64_t>(out.token_ids.size())) << why;
    EXPECT_EQ(stream.Final().usage.completion_tokens, stream.answered_tokens()) << why;
    if (cut) {
      ++stopped_cases;
      EXPECT_EQ(stream.matched(), cut->second) << why;
      // The last token answered is the one that completed the stop string's text.
      const std::vector<int32_t> before(out.token_ids.begin(), out.token_ids.end() - 1);
      EXPECT_LT(Text(before).size(), cut->first + cut->second.size()) << why;
    } else {
      EXPECT_EQ(out.token_ids.size(), ids.size()) << why;
    }
  }
  EXPECT_GT(stopped_cases, 50) << "too few trials hit a stop string to test anything";
}

// A stop string cuts the text: the caller is told once to cancel the rest, and a request the
// engine then ends as cancelled is still answered as "stop".
TEST(RequestStreamTest, AStopStringAsksForOneCancelAndEndsAsStop) {
  ByteTokenizer tokenizer;
  TextOptions options;
  options.stop = {"cd"};
  RequestStream stream(&tokenizer, {ByteTokenizer::kBos}, options, GenerateRequest());
  CompletionText out;
  RequestEvent ev;
  ev.tokens = {'a', 'b', 'c'};
  stream.Take(ev, &out);
  EXPECT_FALSE(stream.StopNow());
  ev.tokens = {'d', 'e'};
  stream.Take(ev, &out);
  EXPECT_TRUE(stream.StopNow());
  EXPECT_FALSE(stream.StopNow()) << "the cancel was asked twice";
  RequestEvent last;
  last.tokens = {'f'};
  last.finished = true;
  last.reason = FinishReason::kCancelled;
  stream.Take(last, &out);
  EXPECT_EQ(out.text + stream.FinishText(), "ab");
  EXPECT_EQ(out.token_ids, (std::vector<int32_t>{'a', 'b', 'c', 'd'}));
  ASSERT_TRUE(stream.Outcome().ok());
  EXPECT_EQ(*stream.Outcome(), "stop");
  EXPECT_EQ(stream.Final().usage.completion_tokens, 4);
}

// The one table, and both wires' mapping of it: a cancellation is CANCELLED on gRPC and 499 on
// HTTP, whichever front end the request came through.
TEST(RequestStreamTest, OneOutcomeTableForBothFrontEnds) {
  struct Case {
    FinishReason reason;
    absl::StatusCode error_code;
    absl::StatusCode status;
    grpc::StatusCode grpc;
    int http;
  };
  const Case cases[] = {
      {FinishReason::kLength, absl::StatusCode::kOk, absl::StatusCode::kOk, grpc::StatusCode::OK, 200},
      {FinishReason::kStop, absl::StatusCode::kOk, absl::StatusCode::kOk, grpc::StatusCode::OK, 200},
      {FinishReason::kCancelled, absl::StatusCode::kOk, absl::StatusCode::kCancelled, grpc::StatusCode::CANCELLED, 499},
      {FinishReason::kDeadline, absl::StatusCode::kOk, absl::StatusCode::kDeadlineExceeded,
       grpc::StatusCode::DEADLINE_EXCEEDED, 504},
      {FinishReason::kError, absl::StatusCode::kUnavailable, absl::StatusCode::kUnavailable,
       grpc::StatusCode::UNAVAILABLE, 503},
      {FinishReason::kError, absl::StatusCode::kInternal, absl::StatusCode::kInternal, grpc::StatusCode::INTERNAL, 500},
  };
  for (const Case& c : cases) {
    RequestEvent ev;
    ev.finished = true;
    ev.reason = c.reason;
    ev.error_code = c.error_code;
    ev.message = "why";
    const absl::Status s = OutcomeStatus(ev);
    EXPECT_EQ(s.code(), c.status) << FinishReasonName(c.reason);
    EXPECT_EQ(ToGrpcStatus(s).error_code(), c.grpc) << FinishReasonName(c.reason);
    if (!s.ok()) EXPECT_EQ(ToApiError(s).http_status, c.http) << FinishReasonName(c.reason);
  }
}

}  // namespace
}  // namespace moeserve::server
