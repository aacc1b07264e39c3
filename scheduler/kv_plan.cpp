#include "scheduler/kv_plan.hpp"

#include <algorithm>

namespace tireless {

namespace {

class planner {
 public:
  planner(block_manager& b, const kv_request& r) : blocks_(b), req_(r), reply_() {
    reply_.grants.resize(r.entries.size());
    victim_.assign(r.entries.size(), false);
  }

  kv_reply run() {
    for (seq_id s : req_.releases) {
      if (blocks_.has(s)) blocks_.release(s);
    }
    for (const kv_commit& c : req_.commits) {
      if (blocks_.has(c.seq)) blocks_.commit_from(c.seq, c.first_block, c.tokens, c.computed);
    }
    for (size_t i = 0; i < req_.entries.size(); ++i) grant(i);
    reply_.stats = blocks_.stats();
    return std::move(reply_);
  }

 private:
  bool try_place(size_t i) {
    const kv_entry& e = req_.entries[i];
    kv_grant& g = reply_.grants[i];
    if (e.admit) {
      auto cached = blocks_.admit(e.seq, e.prompt, e.positions);
      if (!cached) return false;
      g.cached_tokens = *cached;
    } else if (!blocks_.grow(e.seq, e.positions)) {
      return false;
    }
    const int32_t first = std::max(e.write_from, g.cached_tokens);
    std::vector<std::pair<block_id, block_id>> copies;
    if (first < e.positions && !blocks_.prepare_write(e.seq, first, e.positions - 1, copies)) {
      if (e.admit) blocks_.release(e.seq);
      return false;
    }
    reply_.copies.insert(reply_.copies.end(), copies.begin(), copies.end());
    return true;
  }

  // Takes back the blocks of one running entry after i: the last preemptable one, else
  // (only when allow_protected) the last one at all. false when there is none.
  bool preempt_one_after(size_t i, bool allow_protected) {
    for (size_t j = req_.entries.size(); j-- > i + 1;) {
      const kv_entry& e = req_.entries[j];
      if (e.admit || victim_[j] || !blocks_.has(e.seq)) continue;
      if (!e.preemptable && !allow_protected) continue;
      victim_[j] = true;
      blocks_.release(e.seq);
      reply_.preempted.push_back(e.seq);
      return true;
    }
    return false;
  }

  void grant(size_t i) {
    const kv_entry& e = req_.entries[i];
    kv_grant& g = reply_.grants[i];
    g.seq = e.seq;
    if (victim_[i]) return;
    bool placed = try_place(i);
    // Running sequences may take from anyone behind them; protected ones only as a last
    // resort, so the step always makes progress. Admissions take only preemptable blocks.
    for (int pass = 0; !placed && pass < 2; ++pass) {
      const bool allow_protected = pass == 1 && !e.admit;
      if (pass == 1 && e.admit) break;
      while (!placed && preempt_one_after(i, allow_protected)) placed = try_place(i);
    }
    if (placed) {
      g.granted = true;
      // Only blocks from the first one the step writes can differ from the last grant's: it
      // grows the table there, and copy-on-write replaces shared blocks from there on.
      const auto table = blocks_.table(e.seq);
      const int32_t from = e.admit ? 0 : e.write_from / blocks_.config().block_size;
      g.table_from = std::min(from, static_cast<int32_t>(table.size()));
      g.table.assign(table.begin() + g.table_from, table.end());
      return;
    }
    if (!e.admit) {  // a running sequence that cannot continue: preempted itself
      victim_[i] = true;
      blocks_.release(e.seq);
      reply_.preempted.push_back(e.seq);
    }
  }

  block_manager& blocks_;
  const kv_request& req_;
  kv_reply reply_;
  std::vector<bool> victim_;
};

}  // namespace

kv_reply plan_kv(block_manager& blocks, const kv_request& request) {
  return planner(blocks, request).run();
}

}  // namespace tireless
