// Runs an engine step over a parallel layout of ep x pp ranks, each a thread that owns one
// device (on the CPU backend: a Backend of its own with its share of the cores).
//
//   - Expert parallelism (ep): in every stage, the experts are split over ep ranks (contiguous
//     or round-robin); each sequence belongs to one EP rank (its pool segment), which runs its
//     attention and keeps its KV in an arena of its own: the engine's block pool is cut into ep
//     segments (kvcache/block_pool.h) and rank e's arena holds segment e; every MoE layer is an all-to-all of hidden states to the
//     experts' owners and back (models/moe_model.h, ModelShard).
//   - Pipeline stages (pp): the layers are split into pp contiguous stages; each stage keeps KV
//     for its own layers only. The step's sequences are cut into micro-batches that flow
//     through the stages one after another, so stage s works on micro-batch m while stage s+1
//     works on m-1; hidden states go from stage to stage by send/recv.
// The output (logits of the rows that want them) is the same as one rank's, bit for bit on a
// batch-invariant backend: every row meets the same kernels in the same order.
//
// Under mpirun (Create's `processes`) every rank is a process: rank 0 holds its own shard
// and drives the steps (it plans every rank's sub-steps, sends each worker its own as a message,
// runs its part, and gathers the workers' statistics, logit rows and tokens); every other rank
// runs ServeSteps. The data plane is MPI (parallel/mpi_world.h).
#pragma once

#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "kernels/backend.h"
#include "kvcache/kv_storage.h"
#include "models/moe_model.h"
#include "runner/executor.h"
#include "runner/rank_step.h"
#include "runner/step_channel.h"
#include "parallel/comm_group.h"
#include "parallel/placement.h"
#include "parallel/process_ranks.h"
#include "parallel/routed_traffic.h"

namespace moeserve {

struct ParallelConfig {
  int64_t ep = 1;
  int64_t pp = 1;
  ExpertPlacement placement = ExpertPlacement::kContiguous;
  // The routing recorded for a balanced placement (--expert-load; parallel/expert_load.h).
  std::shared_ptr<const ExpertLoad> expert_load;
  // Extra copies of the hottest experts per MoE layer, with a balanced placement (--expert-replicas).
  int64_t expert_replicas = 0;
  int64_t micro_batches = 0;  // per step with pp > 1; 0: pp
  // Ranks per scale-up domain (0: one domain holds them all); roofline::ParallelLayout::domain_size
  // says how ranks fill domains. The roofline prices traffic by it, and with replicas the
  // placement spreads an expert's copies over domains and the dispatch uses the sender's own
  // domain's copy (parallel/placement.h).
  int64_t domain_size = 0;
  // How the ranks talk. Empty: in-process ranks exchanging host memory (the CPU backend). Else
  // NCCL, rank r (= stage * ep + ep rank) on GPU rank_devices[r]; the rank backends must be
  // on those GPUs.
  std::vector<int> nccl_devices;
  // The expert-parallel rows may travel as bf16 where every rank's expert GEMM rounds them to
  // bf16 anyway (false: always fp32, for comparison; --fp32-dispatch).
  bool bf16_dispatch = true;
  // Re-placing the experts while serving (vLLM's EPLB): every eplb_interval engine steps (0:
  // never), the engine re-places them from the routing of the last eplb_window steps
  // (ParallelExecutor::ReplaceExperts).
  int64_t eplb_interval = 0;
  int64_t eplb_window = 1000;
  bool enabled() const { return ep * pp > 1; }
  // EP ranks per domain within a stage's EP group when the group spans several domains, else 0.
  int64_t EpDomainSize() const { return domain_size > 0 && domain_size < ep ? domain_size : 0; }
  // The eplb_ fields: an interval >= 0, a positive one only over EP ranks (ep >= 2), a window
  // of a step or more (runner/expert_replacement.cc).
  absl::Status ValidateEplb() const;
  // Checks the layout against the model: ep <= experts, pp <= layers; under mpirun, that the
  // job's `processes` are ep x pp (0: not a job).
  absl::Status Validate(const ModelConfig& config, int processes = 0) const;
  std::string Name() const;  // "ep2 pp1"
  // The EP ranks holding every expert of every layer of `model` (parallel/placement.h).
  ExpertHolderTable Holders(const ModelConfig& model) const;
};

// Which layers and experts one rank holds.
struct RankLayout {
  int64_t rank = 0, stage = 0, ep_rank = 0;
  int64_t layer_begin = 0, layer_end = 0;
  std::vector<std::vector<int32_t>> experts;  // [layer - layer_begin]: the routed experts it holds
  double weight_bytes = 0;        // the weights on its device (its layers, its experts, replicated dense)
  double kv_bytes_per_token = 0;  // KV of one token of a sequence it owns (its layers)
};

using BackendFactory = std::function<std::unique_ptr<Backend>(int rank, int num_ranks)>;
// Under mpirun with --eplb-interval: reads a shard of the checkpoint (the experts a
// re-placement gives this process's rank) onto the backend the process loaded its weights on.
using ExpertSource = std::function<absl::StatusOr<std::unique_ptr<ModelWeights>>(const WeightShard&)>;

// A re-placement changes a layer only where its busiest rank gets at least this much lighter:
// below it, copying experts would cost more than the balance it buys.
inline constexpr double kEplbMinGain = 0.02;

// What one re-placement of the experts while serving did (ParallelExecutor::ReplaceExperts).
struct ExpertReplacement {
  int64_t layers_changed = 0;   // MoE layers whose placement changed
  int64_t experts_copied = 0;   // (rank, layer, expert) copies made onto ranks that lacked them
  double bytes_copied = 0;      // their weights' bytes
  double seconds = 0;           // wall time, copies included
  // The busiest rank's tokens over the mean rank's, summed over the MoE layers, under the load
  // re-placed for: before and after (1 is even).
  double imbalance_before = 1, imbalance_after = 1;
};

// The weights rank `rank` (= stage * ep + ep rank) of the layout holds: its stage's layers and
// its experts. What a process rank reads from the checkpoint.
WeightShard RankWeightShard(const ParallelConfig& config, const ModelConfig& model, int64_t rank);
// Collective over process ranks that each loaded their shard: every rank gets the digests of
// the weights the others read, so that each one's content_digest (the prefix cache's model
// fingerprint, which also places sequences on EP ranks) is the whole model's.
absl::Status ShareWeightDigests(ProcessRanks* ranks, ModelWeights* weights);

class ParallelExecutor final : public Executor {
 public:
  // Each rank copies its shard of `weights` (held on `weights_backend`) onto its own device,
  // within that device's capacity. `weights` may be released (ReleaseTensors) once Create
  // returns, but must outlive the executor: its config and digests are still read (experts a
  // re-placement moves come from the ranks that hold them, or from `expert_source`). `kv`
  // describes the whole cache (all layers, the engine's block count and size, cut into ep
  // segments as BlockPool(num_blocks, ep) cuts it); each rank gets an arena of its stage's
  // layers for its segment's blocks.
  // Rank 0 ends the workers' loops (ShutdownWorkers); worker threads are joined.
  ~ParallelExecutor();
  // `processes` (not owned): under mpirun, the job whose processes the ranks are (this process
  // runs rank processes->rank()); null: every rank a thread of this process.
  static absl::StatusOr<std::unique_ptr<ParallelExecutor>> Create(const ParallelConfig& config,
                                                                  const ModelWeights* weights,
                                                                  Backend* weights_backend, const KvLayout& kv,
                                                                  const BackendFactory& backends,
                                                                  ProcessRanks* processes = nullptr,
                                                                  ExpertSource expert_source = nullptr);

  // The engine's Executor: how a step is cut (each EP rank's pool segment, as
  // BlockPool(num_blocks, ep) cuts it, and the pipeline's micro-batches), a step, the tiers'
  // view of the KV (on rank 0 under mpirun: the workers' pieces travel as messages,
  // runner/remote_kv.h), health.
  const StepCut& cut() const override { return cut_; }
  absl::Status Execute(const StepParts& step, RunnerOutput* out) override {
    return Run(step, out->logits, &out->stats, &out->parallel, out->sampled);
  }
  absl::StatusOr<KvTierDevices> TierDevices() override;
  const ParallelExecutor* parallel() const override { return this; }

  // One step written in cut()'s parts. With step.sampling, `sampled` receives each logit row's
  // token (sampled on the last stage's devices); without step.logits_to_host, `logits` stays
  // empty.
  absl::Status Run(const StepParts& step, std::vector<float>* logits, ForwardStats* stats, ParallelStepStats* pstats,
                   std::vector<int32_t>* sampled = nullptr);
  // The same for a flat step (CutStep): each sequence runs on the EP rank whose pool segment
  // holds its blocks, and one whose blocks span segments is refused.
  absl::Status Forward(const ForwardInput& in, std::vector<float>* logits,
                       ForwardStats* stats, ParallelStepStats* pstats, std::vector<int32_t>* sampled = nullptr);

  const ParallelConfig& config() const { return config_; }
  // The whole cache the ranks' arenas cut up (Create's `kv`).
  const KvLayout& cache_layout() const { return kv_; }
  const std::vector<RankLayout>& layout() const { return layout_; }
  // Every layer's expert placement now (ReplaceExperts changes it).
  const ExpertHolderTable& holders() const { return holders_; }
  // Where the routed rows are expected to travel under this placement (the roofline's prices).
  const RoutedTraffic& traffic() const { return traffic_; }
  // One line per rank: "rank 0: stage 0 layers [0, 2) ep 0 experts 0-3".
  std::string Describe() const;
  // KV bytes held by the arenas of all ranks.
  size_t kv_bytes() const;
  // Where pool block `block` lives: one piece per stage, on the ranks of its EP segment (under
  // mpirun, those of other processes as remote pieces: their rank and arena block).
  void BlockParts(int32_t block, std::vector<KvBlockPart>* parts) const;
  // The backends of the ranks this process holds (all of them without mpirun), rank order.
  std::vector<Backend*> backends() const;
  // Bytes in use on each of those ranks' devices (weights, KV arena, workspaces), and capacity.
  std::vector<std::pair<size_t, size_t>> device_bytes() const;

  // Re-places the experts while serving (EPLB; --eplb-interval), from the routing in `load`:
  // per MoE layer, the balanced placement of `load` with the layout's replicas and domains
  // (parallel/placement.h), where it leaves that layer's busiest rank at least kEplbMinGain
  // lighter under `load` than the current one. One layer at a time (a rank needs room for one
  // layer's new experts beside its old ones): every rank copies the layer's experts it gains
  // (thread ranks from a rank of their stage that holds them, process ranks from
  // `expert_source`), then all switch and free the ones they dropped. A copy that fails
  // stops there: the layers switched so far stay switched on every rank, the layer and the rest
  // keep their placement (the error says how many). The output of a
  // step does not change: placement moves work, not arithmetic. Between steps, from rank 0's
  // thread. Under mpirun every process reads the experts it gains from the checkpoint (Create's
  // `expert_source`), and rank 0 has the workers stage, then commit or drop, each layer
  // (ReplaceOp); a lost worker loses the job, as in a step.
  absl::StatusOr<ExpertReplacement> ReplaceExperts(const ExpertLoad& load);

  // Process ranks: a worker process's loop (WorkerLoop over MPI messages), until rank 0 sends
  // the shutdown message (OK) or a step fails (its error; the job must end).
  absl::Status ServeSteps();
  // Rank 0: ends the workers' loops. Idempotent.
  absl::Status ShutdownWorkers();
  // Process ranks: a step failed because a rank was lost or failed. The job cannot go on.
  bool lost() const override { return lost_; }
  // The job, when the ranks are its processes; null for threads.
  ProcessRanks* processes() const { return processes_; }
  // Whether the expert-parallel rows travel as bf16 (every rank that holds experts rounds them
  // to bf16 in its GEMM anyway), halving the dispatch's bytes.
  bool bf16_dispatch() const { return bf16_dispatch_; }

 private:
  struct Rank {
    RankLayout layout;
    std::unique_ptr<Backend> backend;
    std::unique_ptr<ModelWeights> weights;  // its shard, on its device
    std::unique_ptr<MoeModel> model;
    Communicator* ep = nullptr;  // this stage's EP group
    Communicator* pp = nullptr;  // this EP index's pipeline
    DeviceBuffer hidden_in;      // the previous stage's hidden states (stages after the first)
  };
  ParallelExecutor(const ParallelConfig& config, ProcessRanks* processes) : config_(config), processes_(processes) {}
  // Every rank's layers, experts and KV segment (layout_, cut_).
  void PlanLayout(const ModelConfig& c);
  // This process's rank of an MPI job: its groups, its shard, the step channel to the others.
  absl::Status JoinProcesses(Backend* weights_backend, const BackendFactory& backends);
  // Every rank a thread of this process: the groups, the shards, the workers' threads.
  absl::Status StartThreads(Backend* weights_backend, const BackendFactory& backends);
  // Builds rank `l` (its device, shard, model and KV arena), which this process holds.
  absl::Status AddRank(const RankLayout& l, Backend* weights_backend, const BackendFactory& backends);
  // A step's sub-steps ([ep rank][micro-batch]), each checked before any rank starts.
  absl::Status CheckStep(const StepParts& step) const;
  // Runs the sub-steps of local rank `i` (index into ranks_).
  absl::Status RunRank(size_t i, const std::vector<SubStep>& subs, RankStepResult* out);
  // Local rank `i` runs its part of a step; where failures are not fatal, a failed rank aborts
  // its groups so that its peers return.
  absl::Status RunPart(size_t i, const std::vector<SubStep>& subs, RankStepResult* out);
  // A worker rank (`rank` of the layout, local index `local`): take a step from the channel,
  // run it, reply; until shut down, or a fatal failure.
  absl::Status WorkerLoop(int rank, size_t local);
  // Rank 0: every worker gets its sub-steps, rank 0 runs its own, the results come back. A
  // failed step resets the groups (threads) or loses the layout (processes).
  absl::Status RunRanks(const std::vector<std::vector<SubStep>>& subs, std::vector<RankStepResult>* results);
  absl::Status LoseStep(const absl::Status& s);
  KvLayout SegmentLayout(int64_t ep_rank, int64_t layers) const;
  // The index in ranks_ of rank `rank` of the layout, or -1 where another process holds it.
  int64_t HeldIndex(int64_t rank) const;
  // ReplaceExperts' step for one layer: every rank of its stage (workers too, under mpirun)
  // stages the layer's experts it gains under `row` (the layer's new holders), then all commit
  // and holders_ takes the row; a failed copy leaves the layer as it was. The dispatch tables
  // of this process's ranks are the caller's to rebuild.
  absl::Status SwitchLayer(int64_t layer, const std::vector<std::vector<int32_t>>& row, ExpertReplacement* r);
  // This process's ranks' side of a layer's switch: StageLayer stages (into staged_) the
  // experts they gain, counted into `reply` (under mpirun read from the checkpoint and checked
  // against the digests the job loaded); CommitLayer puts them in use and takes the row into
  // holders_ (FollowHolders then updates layouts and dispatch).
  absl::Status StageLayer(int64_t layer, const std::vector<std::vector<int32_t>>& row, ReplaceReply* reply);
  void CommitLayer(int64_t layer, const std::vector<std::vector<int32_t>>& row);
  // Rank 0 and every worker: the ranks' layouts and dispatch tables follow holders_.
  void FollowHolders();
  // A worker's answer to one of rank 0's ReplaceOps.
  absl::Status ServeReplace(const ReplaceOp& op, ReplaceReply* reply);
  // Rank 0 under mpirun: one phase of a layer's switch sent to every worker, then their answers
  // (the first worker's own failure into `failed`, their copies added to `total`; after a
  // commit, `committed`, each worker's weight bytes into layout_); the return is the
  // transport's (LoseStep: the job is lost).
  absl::Status SendPhase(const ReplaceOp& op);
  absl::Status ReceivePhase(absl::Status* failed, ReplaceReply* total, bool committed = false);
  // Chooses the dispatch's wire for every rank at once (processes: agreed by all).
  absl::Status ChooseDispatchWire();

  ParallelConfig config_;
  ProcessRanks* processes_ = nullptr;
  const ModelWeights* weights_ = nullptr;
  Backend* weights_backend_ = nullptr;         // where weights_ lived, and expert_source_ reads to
  ExpertSource expert_source_;                 // under mpirun: where they come from instead
  std::vector<std::pair<size_t, StagedExperts>> staged_;  // a layer's copies between stage and commit
  int64_t staged_layer_ = -1;
  std::vector<std::vector<int32_t>> staged_row_;  // its new holders
  std::vector<RankLayout> layout_;             // every rank's, index = stage * ep + ep_rank
  ExpertHolderTable holders_;                  // every layer's expert placement (PlanLayout)
  RoutedTraffic traffic_;                      // ExpectedTraffic of holders_
  std::vector<Rank> ranks_;                    // the ranks this process holds, rank order
  std::vector<KvStorage> rank_kv_;             // one arena per held rank: its layers, its segment
  KvLayout kv_;                                // the whole cache, as the engine sees it
  StepCut cut_;                                // each EP rank's pool segment, the micro-batches
  // Per stage, per EP index (process ranks: this process's group of each kind only).
  std::vector<std::unique_ptr<CommGroup>> ep_comms_, pp_comms_;
  std::unique_ptr<StepChannel> channel_;  // how rank 0 reaches the workers
  std::unique_ptr<KvRemotePieces> remote_kv_;  // rank 0 under mpirun: the workers' KV pieces
  std::vector<std::thread> worker_threads_;  // in-process: one per rank after the first, for the executor's life
  bool lost_ = false;
  std::string lost_why_;  // what lost it
  bool bf16_dispatch_ = false;
  uint64_t clock_id_ = MachineClockId();  // whose steady clock this process's spans read
};

}  // namespace moeserve
