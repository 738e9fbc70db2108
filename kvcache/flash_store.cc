// Flash tier: verified block records in a directory.
#include "kvcache/flash_store.h"

#include <xxhash.h>

#include <bit>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/file_util.h"
#include "core/status.h"

namespace moeserve {

static_assert(std::endian::native == std::endian::little, "records are little-endian and copied as such");

namespace {

namespace fs = std::filesystem;

template <typename T>
void Put(uint8_t*& p, T v) {
  std::memcpy(p, &v, sizeof(v));
  p += sizeof(v);
}
template <typename T>
T Take(const uint8_t*& p) {
  T v;
  std::memcpy(&v, p, sizeof(v));
  p += sizeof(v);
  return v;
}

constexpr size_t kChecksummedBytes = FlashRecordHeader::kBytes - 8;

}  // namespace

void FlashRecordHeader::Encode(uint8_t out[kBytes]) const {
  uint8_t* p = out;
  std::memcpy(p, kMagic, sizeof(kMagic));
  p += sizeof(kMagic);
  Put<uint32_t>(p, kVersion);
  Put<uint32_t>(p, static_cast<uint32_t>(kBytes));
  Put<uint64_t>(p, model_fingerprint);
  Put<uint64_t>(p, block_hash.lo);
  Put<uint64_t>(p, block_hash.hi);
  Put<uint32_t>(p, layer_begin);
  Put<uint32_t>(p, layer_end);
  Put<uint32_t>(p, dtype);
  Put<uint32_t>(p, block_tokens);
  Put<uint64_t>(p, payload_bytes);
  Put<uint64_t>(p, payload_checksum);
  Put<double>(p, retain_until);
  Put<uint64_t>(p, XXH3_64bits(out, kChecksummedBytes));
}

absl::StatusOr<FlashRecordHeader> FlashRecordHeader::Decode(const uint8_t in[kBytes]) {
  if (std::memcmp(in, kMagic, sizeof(kMagic)) != 0) return absl::DataLossError("bad magic");
  const uint8_t* p = in + sizeof(kMagic);
  const uint32_t version = Take<uint32_t>(p);
  const uint32_t header_bytes = Take<uint32_t>(p);
  // Another format's header has another length, so its checksum is not where ours is: the
  // version decides first (foreign, left alone), the checksum after (corrupt).
  if (version != kVersion || header_bytes != kBytes) {
    return absl::FailedPreconditionError(absl::StrCat("format version ", version, " (this build reads ", kVersion, ")"));
  }
  uint64_t stored;
  std::memcpy(&stored, in + kChecksummedBytes, sizeof(stored));
  if (stored != XXH3_64bits(in, kChecksummedBytes)) return absl::DataLossError("header checksum mismatch");
  FlashRecordHeader h;
  h.model_fingerprint = Take<uint64_t>(p);
  h.block_hash.lo = Take<uint64_t>(p);
  h.block_hash.hi = Take<uint64_t>(p);
  h.layer_begin = Take<uint32_t>(p);
  h.layer_end = Take<uint32_t>(p);
  h.dtype = Take<uint32_t>(p);
  h.block_tokens = Take<uint32_t>(p);
  h.payload_bytes = Take<uint64_t>(p);
  h.payload_checksum = Take<uint64_t>(p);
  h.retain_until = Take<double>(p);
  return h;
}

absl::StatusOr<std::unique_ptr<FlashStore>> FlashStore::Open(const FlashStoreOptions& options) {
  if (options.dir.empty()) return absl::InvalidArgumentError("flash store: the directory is empty");
  if (options.budget_bytes < FlashRecordHeader::kBytes) {
    return absl::InvalidArgumentError(absl::StrCat("flash store: budget of ", options.budget_bytes,
                                                   " bytes holds no record"));
  }
  auto lock = FlashDirLock::Acquire(options.dir);
  if (!lock.ok()) return absl::Status(lock.status().code(), absl::StrCat("flash store: ", lock.status().message()));
  FlashStoreOptions resolved = options;
  resolved.dir = lock->path();  // records are named from the resolved directory
  std::unique_ptr<FlashStore> store(new FlashStore(std::move(resolved), std::move(*lock)));
  store->stats_.budget_bytes = options.budget_bytes;
  if (absl::Status s = store->Scan(); !s.ok()) return s;
  return store;
}

std::string FlashStore::PathOf(const BlockHash& hash) const {
  return absl::StrFormat("%s/%016x%016x.kvb", options_.dir, hash.hi, hash.lo);
}

bool FlashStore::Foreign(const FlashRecordHeader& h) const {
  return h.model_fingerprint != options_.model_fingerprint || !options_.ShapeMatches(h);
}

absl::Status FlashStore::Scan() {
  struct Found {
    BlockHash hash;
    uint64_t bytes;
    fs::file_time_type mtime;
    double retain_until;
  };
  std::vector<Found> found;
  std::error_code list_ec;
  // Each entry has its own error code: junk in the directory is skipped and counted, and only a
  // directory that cannot be listed at all stops the open.
  for (fs::directory_iterator it(options_.dir, list_ec), end; !list_ec && it != end; it.increment(list_ec)) {
    const fs::directory_entry& entry = *it;
    const std::string name = entry.path().filename().string();
    if (name == FlashDirLock::kLockFile) continue;
    std::error_code ec;
    const fs::file_status st = entry.symlink_status(ec);
    if (ec || !fs::is_regular_file(st)) {  // directories, links, devices: not ours to read or delete
      ++stats_.skipped_other;
      continue;
    }
    auto remove = [&](int64_t* counter) {
      std::error_code rm_ec;
      fs::remove(entry.path(), rm_ec);
      ++*counter;
    };
    if (absl::StrContains(name, ".kvb.tmp.")) {  // a writer died before its rename
      remove(&stats_.dropped_incomplete);
      continue;
    }
    if (!absl::EndsWith(name, ".kvb")) {
      ++stats_.skipped_other;
      continue;
    }
    const uint64_t size = entry.file_size(ec);
    uint8_t buf[FlashRecordHeader::kBytes];
    std::ifstream f(entry.path(), std::ios::binary);
    if (ec || size < FlashRecordHeader::kBytes || !f.read(reinterpret_cast<char*>(buf), sizeof(buf))) {
      remove(&stats_.dropped_truncated);
      continue;
    }
    auto h = FlashRecordHeader::Decode(buf);
    const bool foreign = h.ok() ? Foreign(*h) : h.status().code() != absl::StatusCode::kDataLoss;
    if (foreign) {  // another model's, format's or block shape's: left alone unless asked
      if (options_.purge_foreign) {
        remove(&stats_.dropped_foreign);
      } else {
        ++stats_.skipped_foreign;
      }
      continue;
    }
    if (!h.ok()) {
      remove(&stats_.dropped_corrupt);
      continue;
    }
    if (size != FlashRecordHeader::kBytes + h->payload_bytes) {
      remove(&stats_.dropped_truncated);
      continue;
    }
    if (name != fs::path(PathOf(h->block_hash)).filename().string()) {  // renamed or copied over another
      remove(&stats_.dropped_corrupt);
      continue;
    }
    found.push_back({h->block_hash, size, entry.last_write_time(ec), h->retain_until});
  }
  if (list_ec) {
    return absl::UnavailableError(absl::StrCat("flash store: cannot list ", options_.dir, ": ", list_ec.message()));
  }
  // Most recently written first, as the LRU order.
  std::sort(found.begin(), found.end(), [](const Found& a, const Found& b) { return a.mtime > b.mtime; });
  for (const Found& f : found) {
    records_.Put(f.hash, f.bytes, f.retain_until, /*newest=*/false);
    stats_.bytes += f.bytes;
  }
  stats_.records = static_cast<int64_t>(records_.size());
  // The budget may have shrunk since the last run.
  MakeRoomLocked(0, /*may_evict_retained=*/true);
  return absl::OkStatus();
}

void FlashStore::EraseLocked(const BlockHash& hash) {
  if (!records_.Contains(hash)) return;
  std::error_code ec;
  fs::remove(PathOf(hash), ec);
  UnindexLocked(hash);
}

void FlashStore::UnindexLocked(const BlockHash& hash) {
  const auto e = records_.Take(hash);
  if (!e) return;
  stats_.bytes -= e->value;
  stats_.records = static_cast<int64_t>(records_.size());
}

bool FlashStore::MakeRoomLocked(uint64_t bytes, bool may_evict_retained) {
  const double now = options_.clock();
  auto fits = [&] { return stats_.bytes + reserved_ + bytes <= options_.budget_bytes; };
  if (fits()) return true;
  // Ordinary (or expired) records first, least recently used first; retained ones only after.
  uint64_t freed = 0;
  const uint64_t over = stats_.bytes + reserved_ + bytes - options_.budget_bytes;
  for (const BlockHash& victim :
       records_.Victims(now, may_evict_retained, [&](const auto& e) { return (freed += e.value) >= over; })) {
    EraseLocked(victim);
    ++stats_.evictions;
  }
  return fits();
}

absl::Status FlashStore::Put(const BlockHash& hash, uint32_t layer_begin, uint32_t layer_end, DType dtype,
                             uint32_t block_tokens, const void* payload, size_t bytes, double retain_until) {
  const uint64_t file_bytes = FlashRecordHeader::kBytes + bytes;
  if (file_bytes > options_.budget_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("flash store: a record of ", file_bytes,
                                                   " bytes exceeds the budget of ", options_.budget_bytes));
  }
  FlashRecordHeader h;
  h.model_fingerprint = options_.model_fingerprint;
  h.block_hash = hash;
  h.layer_begin = layer_begin;
  h.layer_end = layer_end;
  h.dtype = static_cast<uint32_t>(dtype);
  h.block_tokens = block_tokens;
  h.payload_bytes = bytes;
  h.payload_checksum = XXH3_64bits(payload, bytes);
  h.retain_until = retain_until;
  uint8_t header[FlashRecordHeader::kBytes];
  h.Encode(header);

  {
    std::lock_guard<std::mutex> lock(mu_);
    if (const auto* e = records_.Find(hash); e != nullptr && e->retain_until > retain_until) {
      // A later deadline wins: rewrite the header with the old one.
      h.retain_until = retain_until = e->retain_until;
      h.Encode(header);
    }
    EraseLocked(hash);
    if (!MakeRoomLocked(file_bytes, retain_until > options_.clock())) {
      ++stats_.refused_retained;
      return absl::ResourceExhaustedError(absl::StrCat("flash store: the budget of ", options_.budget_bytes,
                                                       " bytes is held by retained records"));
    }
    reserved_ += file_bytes;
  }
  // The slow part (write, fsync, rename) runs without the lock, so reads of other records
  // proceed meanwhile; the rename makes the record visible whole or not at all.
  absl::Status written = [&]() -> absl::Status {
    ASSIGN_OR_RETURN(AtomicFileWriter writer, AtomicFileWriter::Create(PathOf(hash), 0600));
    RETURN_IF_ERROR(writer.Append(header, sizeof(header)));
    RETURN_IF_ERROR(writer.Append(payload, bytes));
    return writer.Commit();
  }();
  std::lock_guard<std::mutex> lock(mu_);
  reserved_ -= file_bytes;
  if (!written.ok()) return written;
  if (const auto old = records_.Take(hash)) stats_.bytes -= old->value;  // written meanwhile by another Put
  records_.Put(hash, file_bytes, retain_until);
  stats_.bytes += file_bytes;
  stats_.records = static_cast<int64_t>(records_.size());
  ++stats_.writes;
  return absl::OkStatus();
}

absl::Status FlashStore::Get(const BlockHash& hash, void* out, size_t bytes, double* retain_until) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!records_.Contains(hash)) {
    ++stats_.misses;
    return absl::NotFoundError("flash store: no such block");
  }
  const std::string path = PathOf(hash);
  std::ifstream f(path, std::ios::binary);
  uint8_t header[FlashRecordHeader::kBytes];
  auto drop = [&](int64_t* counter, absl::string_view why) {
    EraseLocked(hash);
    ++*counter;
    ++stats_.misses;
    return absl::NotFoundError(absl::StrCat("flash store: record dropped: ", why));
  };
  if (!f.read(reinterpret_cast<char*>(header), sizeof(header))) return drop(&stats_.dropped_truncated, "truncated");
  auto h = FlashRecordHeader::Decode(header);
  if (!h.ok()) return drop(&stats_.dropped_corrupt, h.status().message());
  if (Foreign(*h) || h->payload_bytes != bytes) {  // not ours (any more): forgotten, left in place
    UnindexLocked(hash);
    ++stats_.dropped_foreign;
    ++stats_.misses;
    return absl::NotFoundError("flash store: record skipped: another model or block shape");
  }
  if (!(h->block_hash == hash)) return drop(&stats_.dropped_corrupt, "the header names another block");
  if (!f.read(static_cast<char*>(out), static_cast<std::streamsize>(bytes)) || f.peek() != EOF) {
    return drop(&stats_.dropped_truncated, "length differs from the header");
  }
  if (XXH3_64bits(out, bytes) != h->payload_checksum) return drop(&stats_.dropped_corrupt, "payload checksum mismatch");
  const auto* e = records_.Find(hash, /*touch=*/true);
  if (retain_until != nullptr) *retain_until = e->retain_until;
  ++stats_.hits;
  return absl::OkStatus();
}

bool FlashStore::Contains(const BlockHash& hash) const {
  std::lock_guard<std::mutex> lock(mu_);
  return records_.Contains(hash);
}

void FlashStore::Erase(const BlockHash& hash) {
  std::lock_guard<std::mutex> lock(mu_);
  EraseLocked(hash);
}

FlashStoreStats FlashStore::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  FlashStoreStats s = stats_;
  s.retained = records_.Retained(options_.clock());
  return s;
}

}  // namespace moeserve
