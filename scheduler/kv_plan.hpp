#pragma once
// What the engine asks of the KV pool for one step, and the answer: the kv_manager's
// decision, as plain values. The order of the entries is the engine's policy (the entry it
// would keep last comes last); plan_kv() is the mechanism: it grants in that order and, when
// the pool runs short, takes blocks back from the end of the list (preemption).

#include <cstdint>
#include <utility>
#include <vector>

#include "scheduler/block_manager.hpp"

namespace tireless {

struct kv_entry {
  seq_id seq = 0;
  int32_t positions = 0;       // positions the sequence must hold after this step
  bool admit = false;          // new (or preempted) sequence: prompt is set
  std::vector<token_id> prompt;
  bool preemptable = true;     // false once it used its preemptions (still taken as a last resort)
  int32_t write_from = 0;      // the first position the step writes (copy-on-write below it)
};

struct kv_commit {
  seq_id seq = 0;
  std::vector<token_id> tokens;  // the sequence's tokens from full block first_block to `computed`
  int32_t computed = 0;
  int32_t first_block = 0;       // the blocks before it were committed before (a delta)
};

struct kv_request {
  std::vector<kv_entry> entries;
  std::vector<seq_id> releases;
  std::vector<kv_commit> commits;
};

struct kv_grant {
  seq_id seq = 0;
  bool granted = false;
  int32_t cached_tokens = 0;
  // The sequence's block table from index table_from on (a delta): the blocks before it are
  // those of the last grant. An admission's grant carries the whole table (table_from = 0).
  int32_t table_from = 0;
  std::vector<block_id> table;
};

struct kv_reply {
  std::vector<kv_grant> grants;  // one per entry, same order
  std::vector<seq_id> preempted;
  std::vector<std::pair<block_id, block_id>> copies;
  block_stats stats;
};

// Applies releases and commits, then grants the entries in order. An entry that does not
// fit takes blocks from running entries after it, last first (preemptable ones before the
// others); a running entry that still does not fit is preempted itself; an admission that
// does not fit is deferred (granted = false, nothing held).
kv_reply plan_kv(block_manager& blocks, const kv_request& request);

}  // namespace tireless
