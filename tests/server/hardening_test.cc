// End-to-end tests of the hardening an outside probe asked for: unparseable requests, oversized
// metadata beside healthy streams on one connection, tenant-isolated prefix caches (API keys
// file and cache_salt), and start-up refusals that name the flag.
#include <grpcpp/generic/generic_stub.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <atomic>
#include <fstream>
#include <random>
#include <thread>

#include "tests/server/grpc_client.h"

namespace moeserve::testing {
namespace {

// Sends raw bytes as a Generate request (a client that does not use the generated stub).
grpc::Status SendRawGenerate(const std::shared_ptr<grpc::Channel>& channel,
                             const std::string& bytes) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  grpc::CompletionQueue cq;
  auto call = stub.PrepareCall(&ctx, "/moeserve.v1.Moeserve/Generate", &cq);
  void* tag = nullptr;
  bool ok = false;
  call->StartCall(reinterpret_cast<void*>(1));
  cq.Next(&tag, &ok);
  grpc::Slice slice(bytes);
  grpc::ByteBuffer request(&slice, 1);
  call->Write(request, grpc::WriteOptions().set_last_message(),
              reinterpret_cast<void*>(2));  // and half-closes
  cq.Next(&tag, &ok);
  grpc::ByteBuffer response;
  for (;;) {  // read until the stream ends
    call->Read(&response, reinterpret_cast<void*>(4));
    cq.Next(&tag, &ok);
    if (!ok) break;
  }
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(5));
  cq.Next(&tag, &ok);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  return status;
}

TEST(E2eHardeningTest, UnparseableRequestsGetInvalidArgumentWithTheReason) {
  ServerProcess server;
  ASSERT_TRUE(server.Start({"--preset", "tiny"})) << server.log();
  auto stub = v1::Moeserve::NewStub(server.channel());
  v1::GenerateRequest good = IdsRequest({256, 1, 2, 3}, 4);
  good.set_text("hello");
  const std::string good_bytes = good.SerializeAsString();
  // Invalid UTF-8 in `text`: the wire bytes of a text prompt with one byte replaced.
  std::string bad_utf8 = good_bytes;
  const size_t at = bad_utf8.find("hello");
  ASSERT_NE(at, std::string::npos);
  bad_utf8[at + 2] = static_cast<char>(0xC3);  // a lead byte followed by 'l'
  std::mt19937 gen(std::random_device{}());
  std::string garbage(64, '\0');
  for (char& c : garbage) c = static_cast<char>(gen());
  garbage[0] = static_cast<char>(0xFF);  // field 31, wire type 7: never valid
  struct Case {
    std::string name, bytes, reason;
  };
  const std::vector<Case> cases = {
      {"garbage bytes", garbage, "malformed or truncated"},
      {"a truncated message", good_bytes.substr(0, good_bytes.size() - 3),
       "malformed or truncated"},
      {"invalid UTF-8 in text", bad_utf8, "text: invalid UTF-8 at byte 2"},
  };
  for (const Case& c : cases) {
    const grpc::Status s = SendRawGenerate(server.channel(), c.bytes);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << c.name << ": " << s.error_message();
    EXPECT_NE(s.error_message().find(c.reason), std::string::npos)
        << c.name << ": " << s.error_message();
    EXPECT_TRUE(Stream(stub.get(), IdsRequest({256, 5}, 3)).status.ok()) << "after " << c.name;
  }
  EXPECT_TRUE(SendRawGenerate(server.channel(), good_bytes).ok())
      << "the same path serves a good request";
  EXPECT_TRUE(EventuallyIdle(stub.get()));
  EXPECT_EQ(server.Stop(SIGTERM), 0) << server.log();
}

// One call with oversized metadata on a connection that carries other streams is refused alone:
// the streams already running and those started right after it finish normally.
TEST(E2eHardeningTest, OversizedMetadataIsRefusedAloneOnASharedConnection) {
  ServerProcess server;
  ASSERT_TRUE(server.Start({"--preset", "tiny"})) << server.log();
  auto stub = v1::Moeserve::NewStub(server.channel());  // one channel, one HTTP/2 connection
  for (const size_t big : {20u << 10, 60u << 10, 100u << 10}) {
    constexpr int kTokens = 300;  // long enough to be mid-stream when the oversized call arrives
    std::vector<Streamed> before(3), after(3);
    std::vector<std::thread> threads;
    std::atomic<int> streaming{0};  // "before" streams that have received their first message
    auto run = [&](Streamed* out, int i) {
      grpc::ClientContext ctx;
      ctx.AddMetadata("x-small", std::string(100 + i, 'b'));
      v1::GenerateRequest req = IdsRequest({256, 7, static_cast<int32_t>(i)}, kTokens);
      req.set_ignore_eos(true);
      auto reader = stub->Generate(&ctx, req);
      v1::GenerateResponse r;
      while (reader->Read(&r)) {
        if (out->ids.empty() && i < 10) ++streaming;
        out->ids.insert(out->ids.end(), r.token_ids().begin(), r.token_ids().end());
      }
      out->status = reader->Finish();
    };
    for (int i = 0; i < 3; ++i) threads.emplace_back(run, &before[i], i);
    // The oversized call goes out while all three are mid-stream on the same connection.
    for (int w = 0; w < 2000 && streaming.load() < 3; ++w)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ASSERT_EQ(streaming.load(), 3) << "the first streams did not start";
    grpc::ClientContext ctx;
    // Many indexable entries, as well as one large value: both reach the limit.
    for (int i = 0; i < 64; ++i)
      ctx.AddMetadata("x-entry-" + std::to_string(i), std::string(big / 128, 'e'));
    ctx.AddMetadata("x-big", std::string(big / 2, 'a'));
    Streamed refused = Stream(stub.get(), IdsRequest({256, 8}, 40), &ctx);
    for (int i = 0; i < 3; ++i) threads.emplace_back(run, &after[i], 10 + i);
    for (auto& t : threads) t.join();
    EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
        << big << " bytes: " << refused.status.error_message();
    for (int i = 0; i < 3; ++i) {
      EXPECT_TRUE(before[i].status.ok())
          << big << " bytes, stream before #" << i << ": " << before[i].status.error_message();
      EXPECT_TRUE(after[i].status.ok())
          << big << " bytes, stream after #" << i << ": " << after[i].status.error_message();
      EXPECT_EQ(before[i].ids.size(), static_cast<size_t>(kTokens));
      EXPECT_EQ(after[i].ids.size(), static_cast<size_t>(kTokens));
    }
  }
  // Metadata within the limit is served.
  grpc::ClientContext ctx;
  ctx.AddMetadata("x-fine", std::string(4000, 'f'));
  EXPECT_TRUE(Stream(stub.get(), IdsRequest({256, 9}, 3), &ctx).status.ok());
  EXPECT_TRUE(EventuallyIdle(stub.get()));
  EXPECT_EQ(server.Stop(SIGTERM), 0) << server.log();
}

std::string WriteKeysFile(const std::string& dir, const std::string& contents, mode_t mode = 0600) {
  const std::string path = dir + "/keys";
  std::ofstream(path) << contents;
  chmod(path.c_str(), mode);
  return path;
}

Streamed AsTenant(v1::Moeserve::Stub* stub, const std::string& key,
                  const std::vector<int32_t>& prompt, const std::string& salt = "") {
  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization", "Bearer " + key);
  v1::GenerateRequest req = IdsRequest(prompt, 4);
  req.set_cache_salt(salt);
  return Stream(stub, req, &ctx);
}

// Prefixes are shared only within a tenant and salt: another tenant sending the same prompt
// never gets cached tokens (so cannot learn that the prompt was sent), the same tenant does,
// and a salt splits a tenant's cache further. Output is the same either way.
TEST(E2eHardeningTest, TenantsAndSaltsNeverShareCachedPrefixes) {
  const std::string dir = MakeTempDir("tenants");
  const std::string keys =
      WriteKeysFile(dir, "# tenant key\nalice key-alice-1\nbob   key-bob-1\nalice key-alice-2\n");
  ServerProcess server;
  ASSERT_TRUE(server.Start({"--preset", "tiny", "--api-keys-file", keys, "--host-kv-mb", "16"}))
      << server.log();
  auto stub = v1::Moeserve::NewStub(server.channel());
  std::mt19937 gen(std::random_device{}());
  std::vector<int32_t> prompt = {256};
  for (int i = 0; i < 70; ++i)
    prompt.push_back(static_cast<int32_t>(gen() % 256));  // four full blocks

  const Streamed first = AsTenant(stub.get(), "key-alice-1", prompt);
  ASSERT_TRUE(first.status.ok()) << first.status.error_message();
  EXPECT_EQ(first.last.usage().cached_prompt_tokens(), 0);
  const Streamed bob = AsTenant(stub.get(), "key-bob-1", prompt);
  ASSERT_TRUE(bob.status.ok()) << bob.status.error_message();
  EXPECT_EQ(bob.last.usage().cached_prompt_tokens(), 0)
      << "bob learned that alice sent this prompt";
  EXPECT_EQ(bob.ids, first.ids);
  const Streamed alice =
      AsTenant(stub.get(), "key-alice-2", prompt);  // the same tenant, another key
  EXPECT_EQ(alice.last.usage().cached_prompt_tokens(), 64);
  EXPECT_EQ(alice.ids, first.ids);
  const Streamed salted = AsTenant(stub.get(), "key-alice-1", prompt, "session-42");
  EXPECT_EQ(salted.last.usage().cached_prompt_tokens(), 0)
      << "a salt shares nothing with the unsalted cache";
  EXPECT_EQ(
      AsTenant(stub.get(), "key-alice-1", prompt, "session-42").last.usage().cached_prompt_tokens(),
      64);
  EXPECT_EQ(
      AsTenant(stub.get(), "key-bob-1", prompt, "session-42").last.usage().cached_prompt_tokens(),
      0)
      << "the same salt in another tenant is another namespace";
  EXPECT_EQ(AsTenant(stub.get(), "key-unknown", prompt).status.error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  const Streamed long_salt = AsTenant(stub.get(), "key-bob-1", prompt, std::string(300, 's'));
  EXPECT_EQ(long_salt.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(long_salt.status.error_message().rfind("cache_salt:", 0), 0u)
      << long_salt.status.error_message();
  EXPECT_EQ(server.Stop(SIGTERM), 0) << server.log();
  std::filesystem::remove_all(dir);
}

// A bad keys file stops start-up with a message naming the flag and what is wrong.
TEST(E2eHardeningTest, BadApiKeysFilesAreRefusedNamingTheFlag) {
  const std::string dir = MakeTempDir("badkeys");
  struct Case {
    std::string contents;
    mode_t mode;
    std::string says;
  };
  const std::vector<Case> cases = {
      {"alice k1\n", 0644, "mode 0644"},
      {"alice\n", 0600, "line 1: expected \"TENANT KEY\""},
      {"alice k1\nbob k1\n", 0600, "line 2: this key is already given to tenant \"alice\""},
      {"al/ice k1\n", 0600, "tenant \"al/ice\""},
      {"# nothing\n", 0600, "holds no"},
  };
  for (const Case& c : cases) {
    const std::string keys = WriteKeysFile(dir, c.contents, c.mode);
    std::string out, err;
    EXPECT_EQ(RunCommand(
                  {"serve", "--preset", "tiny", "--listen", "127.0.0.1:0", "--api-keys-file", keys},
                  &out, &err),
              2)
        << c.contents;
    EXPECT_NE(err.find("--api-keys-file"), std::string::npos) << err;
    EXPECT_NE(err.find(c.says), std::string::npos) << "expected '" << c.says << "' in: " << err;
  }
  std::string out, err;
  EXPECT_EQ(
      RunCommand({"serve", "--preset", "tiny", "--api-key", "k", "--api-keys-file", dir + "/keys"},
                 &out, &err),
      2);
  EXPECT_NE(err.find("exclude each other"), std::string::npos) << err;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace moeserve::testing
