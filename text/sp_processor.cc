// SpProcessor: loads the sentencepiece module once per process and calls through it.
#include "text/sp_processor.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>

#include "absl/strings/str_cat.h"

namespace moeserve {

struct SpProcessor::Api {
  void* (*load)(const char*, char*, size_t);
  void (*free_sp)(void*);
  int (*encode)(void*, const char*, size_t, int**, size_t*, char*, size_t);
  char* (*decode)(void*, const int*, size_t, size_t*);
  char* (*id_to_piece)(void*, int, size_t*);
  int (*piece_to_id)(void*, const char*, size_t);
  int (*size)(void*);
  int (*is_control)(void*, int);
  int (*is_unknown)(void*, int);
  int (*bos_id)(void*);
  int (*eos_id)(void*);
};

namespace {

// The module is loaded once and never unloaded (its handle is the process's); the path is
// fixed at build time.
absl::StatusOr<const SpProcessor::Api*> Module() {
  static std::once_flag once;
  static SpProcessor::Api* api = nullptr;
  static std::string error;
  std::call_once(once, [] {
    void* h = dlopen(MOESERVE_SP_MODULE, RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
    if (h == nullptr) {
      error = absl::StrCat("cannot load the sentencepiece module ", MOESERVE_SP_MODULE, ": ",
                           dlerror());
      return;
    }
    auto* a = new SpProcessor::Api();
    bool ok = true;
    auto sym = [&](auto** fn, const char* name) {
      *reinterpret_cast<void**>(fn) = dlsym(h, name);
      ok = ok && *fn != nullptr;
    };
    sym(&a->load, "moeserve_sp_load");
    sym(&a->free_sp, "moeserve_sp_free");
    sym(&a->encode, "moeserve_sp_encode");
    sym(&a->decode, "moeserve_sp_decode");
    sym(&a->id_to_piece, "moeserve_sp_id_to_piece");
    sym(&a->piece_to_id, "moeserve_sp_piece_to_id");
    sym(&a->size, "moeserve_sp_size");
    sym(&a->is_control, "moeserve_sp_is_control");
    sym(&a->is_unknown, "moeserve_sp_is_unknown");
    sym(&a->bos_id, "moeserve_sp_bos_id");
    sym(&a->eos_id, "moeserve_sp_eos_id");
    if (!ok) {
      error = absl::StrCat(MOESERVE_SP_MODULE, " lacks a function");
      delete a;
      return;
    }
    api = a;
  });
  if (api == nullptr) return absl::FailedPreconditionError(error);
  return api;
}

std::string Take(char* p, size_t n) {
  std::string s(p, n);
  std::free(p);
  return s;
}

}  // namespace

absl::StatusOr<std::unique_ptr<SpProcessor>> SpProcessor::Load(const std::string& path) {
  absl::StatusOr<const Api*> api = Module();
  if (!api.ok()) return api.status();
  char err[512] = {0};
  void* sp = (*api)->load(path.c_str(), err, sizeof(err));
  if (sp == nullptr)
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a sentencepiece model (", err, ")"));
  return std::unique_ptr<SpProcessor>(new SpProcessor(*api, sp));
}

SpProcessor::~SpProcessor() { api_->free_sp(sp_); }

absl::StatusOr<std::vector<int>> SpProcessor::Encode(absl::string_view text) const {
  int* ids = nullptr;
  size_t n = 0;
  char err[512] = {0};
  if (api_->encode(sp_, text.data(), text.size(), &ids, &n, err, sizeof(err)) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("text: ", err));
  }
  std::vector<int> out(ids, ids + n);
  std::free(ids);
  return out;
}

std::string SpProcessor::Decode(const std::vector<int>& ids) const {
  size_t n = 0;
  char* p = api_->decode(sp_, ids.data(), ids.size(), &n);
  return Take(p, n);
}

int SpProcessor::size() const { return api_->size(sp_); }
int SpProcessor::PieceToId(absl::string_view piece) const {
  return api_->piece_to_id(sp_, piece.data(), piece.size());
}
std::string SpProcessor::IdToPiece(int id) const {
  size_t n = 0;
  char* p = api_->id_to_piece(sp_, id, &n);
  return Take(p, n);
}
bool SpProcessor::IsControl(int id) const { return api_->is_control(sp_, id) != 0; }
bool SpProcessor::IsUnknown(int id) const { return api_->is_unknown(sp_, id) != 0; }
int SpProcessor::bos_id() const { return api_->bos_id(sp_); }
int SpProcessor::eos_id() const { return api_->eos_id(sp_); }

}  // namespace moeserve
