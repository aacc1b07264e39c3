# The messages between the runtime's actors. In one process they travel as owned Cap'n
# Proto messages (no re-encoding); across processes the same bytes travel over Cap'n Proto
# RPC, so an actor can move without its code changing.
@0xfded03575c71a266;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("tireless::proto");

using Common = import "common.capnp";

# session → admission → engine: a request ready to run.
struct GenerateRequest {
  requestId @0 :UInt64;
  tenant @1 :Text;
  tier @2 :Text;
  tierPriority @3 :Int32;       # higher is more important
  prompt @4 :List(Int32);
  sampling @5 :Common.Sampling;
  maxTokens @6 :Int32;
  stopTokens @7 :List(Int32);
  arrivalNs @8 :Int64;          # on the runtime's clock
  deadlineNs @9 :Int64 = -1;    # on the runtime's clock; -1: none
  tokenWindow @10 :Int32 = 0;   # tokens the engine may send before the session acks; 0: no limit
  degradations @11 :List(Text); # what admission did to it, for the outcome
  ttftTargetNs @12 :Int64 = 0;  # the engine's first-token deadline is arrival + this; 0: none
  tpotTargetNs @13 :Int64 = 0;  # then one token per this; 0: none (set by admission's policy)
  startByNs @14 :Int64 = 0;     # not started by then: refused before any prefill; 0: never
  retryToken @15 :UInt64;       # the client's reservation, from an earlier refusal (0: none)
  expectedCachedTokens @16 :Int32 = 0;  # of the prompt, expected in the prefix cache (admission's prefix index)
}

# engine → session: tokens generated for a request, in order.
struct TokenChunk {
  requestId @0 :UInt64;
  tokens @1 :List(Int32);
  firstTokenNs @2 :Int64 = -1;  # set on the chunk that carries the first token
  logprobs @3 :List(Common.TokenLogprob);  # one per token when the request asked for them
}

# engine → admission, the one credit protocol (scheduler/engine_credits.hpp): the waiting room
# (admission's credit for priority p is maxWaiting less the requests of priority >= p waiting
# there or sent and not yet received) and the load its time-to-first-token predictions read.
struct Credits {
  maxWaiting @0 :Int32;
  tiers @1 :List(TierLoad);                    # by priority, highest first
  receivedByPriority @2 :List(PriorityCount);  # generate messages received, ever
  stepModel @3 :List(Float64);    # step_time_model coefficients, fitted on the engine's steps
  stepObservations @4 :Int64;
  maxStepTokens @5 :Int32;        # the engine's limits per step
  maxStepSeqs @6 :Int32;
  stepSeconds @7 :Float64;        # a step's time budget now (0: only maxStepTokens limits it)
  finishedPerSecond @8 :Float64;  # requests the engine completes per second (moving average)
  stepResidual @9 :Float64;       # median actual / predicted step time lately
}

# One priority's share of the engine (scheduler/engine_load.hpp, tier_load).
struct TierLoad {
  priority @0 :Int32;
  waiting @1 :Int32;
  running @2 :Int32;
  decodes @3 :Int32;
  context @4 :Float64;       # positions the decodes attend, summed
  tpotSeconds @5 :Float64;
  promptTokens @6 :Int64;    # not yet computed, due before a newcomer of the tier
  laterTokens @7 :Int64;     # not yet computed, due after it
  cachedShare @8 :Float64;   # of its prompts' tokens found in the prefix cache lately
}

struct PriorityCount {
  priority @0 :Int32;
  count @1 :Int64;
}

# engine → kv_manager, once per step: what the step needs, in keep order (the entries the
# engine would keep last come last; they are preempted first).
struct KvRequest {
  entries @0 :List(KvEntry);
  releases @1 :List(UInt64);   # sequences that ended since the last request
  commits @2 :List(KvCommit);  # sequences whose computed prefix grew
}

struct KvEntry {
  seq @0 :UInt64;
  positions @1 :Int32;         # positions the sequence must hold after this step
  admit @2 :Bool;              # a new (or preempted) sequence; prompt is set
  prompt @3 :List(Int32);
  preemptable @4 :Bool = true; # false when it already used its preemptions
  writeFrom @5 :Int32;         # the first position this step writes
}

struct KvCommit {
  seq @0 :UInt64;
  tokens @1 :List(Int32);      # from full block firstBlock to computed
  computed @2 :Int32;
  firstBlock @3 :Int32;        # the blocks before it were committed before (a delta)
}

struct KvReply {
  grants @0 :List(KvGrant);    # one per entry, same order
  preempted @1 :List(UInt64);  # running sequences whose blocks were taken back
  copies @2 :List(BlockCopy);  # to make before the step
  freeBlocks @3 :Int32;
  totalBlocks @4 :Int32;
  cachedFreeBlocks @5 :Int32;
}

struct KvGrant {
  seq @0 :UInt64;
  granted @1 :Bool;
  cachedTokens @2 :Int32;      # for admitted sequences: prompt tokens already in the cache
  table @3 :List(Int32);       # the sequence's block table from tableFrom on, when granted
  tableFrom @4 :Int32;         # the blocks before it are those of the last grant (a delta)
}

struct BlockCopy {
  src @0 :Int32;
  dst @1 :Int32;
}

# engine → shard: one step of the model.
struct StepRequest {
  stepId @0 :UInt64;
  seqs @1 :List(SeqStep);
  copies @2 :List(BlockCopy);
  forget @3 :List(UInt64);     # sequences that ended: the shard drops its copy of their tables
}

struct SeqStep {
  seq @0 :UInt64;
  tokens @1 :List(Int32);
  startPos @2 :Int32;
  blockTable @3 :List(Int32);  # from tableFrom on: the shard keeps each sequence's table
  sample @4 :Bool;
  sampling @5 :Common.Sampling;
  wantLogits @6 :Bool;
  tableFrom @7 :Int32;         # the shard has the blocks before it from earlier steps
  history @8 :List(Int32);     # penalties only: the tokens at [historyFrom, startPos)
  historyFrom @9 :Int32;       # the shard has the history before it from earlier steps
  promptLen @10 :Int32;        # the history's first promptLen tokens are the prompt
}

struct StepReply {
  stepId @0 :UInt64;
  next @1 :List(Int32);        # per sequence: the sampled token or -1
  seconds @2 :Float64;         # how long the step took (virtual on the sim backend)
  logits @3 :Data;             # float32 [sequences with wantLogits][vocab]
  logprobs @4 :List(Common.TokenLogprob);  # empty, or per sequence (those that asked: sampling.logprobs >= 0)
}

# attention shard → expert shard: one MoE layer's tokens routed to this shard's experts, and
# nothing else (a token none of whose experts live here is not sent). The same message goes to
# an expert shard actor in this process and, as the ExpertShard interface's argument, to a
# tireless-shard process over Cap'n Proto RPC.
enum Activations {
  f32 @0;
  f16 @1;                      # IEEE half: half the bytes, rounded (not bit-equal to f32)
  int8 @2;                     # per row: an f32 scale (max |x| / 127), then one int8 per value
}

struct ExpertRequest {
  layer @0 :Int32;
  rows @1 :Int32;              # token rows in x
  width @2 :Int32;
  x @3 :Data;                  # [rows][width] normalized hidden states, in `activations`
  slotRow @4 :List(Int32);     # per (token, expert) pair this shard computes: its row in x
  slotExpert @5 :List(Int32);  # and its expert
  activations @6 :Activations;
}

struct ExpertReply {
  y @0 :Data;                  # [pairs][width] unweighted expert outputs, in the request's order and activations
  micros @1 :UInt32;           # the shard's compute time
}

# A tireless-shard process's bootstrap interface.
interface ExpertShard {
  info @0 () -> (model :Text, layers :Int32, experts :Int32, width :Int32, held :List(Int32), pid :Int64);
  run @1 (request :ExpertRequest) -> (reply :ExpertReply);
  hold @2 (experts :List(Int32)) -> (held :List(Int32));  # pack more experts (replicas, or a fenced shard's)
}
