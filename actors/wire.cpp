#include "actors/wire.hpp"

#include <bit>
#include <cstring>
#include <stdexcept>
#include <string>

#include <capnp/any.h>

#include "protocol/outcome_wire.hpp"

namespace tireless {

proto::Rejection::Reason to_wire(refusal r) {
  switch (r) {
    case refusal::overloaded: return proto::Rejection::Reason::OVERLOADED;
    case refusal::quota_exceeded: return proto::Rejection::Reason::QUOTA_EXCEEDED;
    case refusal::prompt_too_long: return proto::Rejection::Reason::PROMPT_TOO_LONG;
    case refusal::invalid: return proto::Rejection::Reason::INVALID;
  }
  return proto::Rejection::Reason::OVERLOADED;
}

namespace {

template <class List, class Values>
void fill(List list, const Values& values) {
  for (unsigned i = 0; i < values.size(); ++i) list.set(i, values[i]);
}

template <class T, class Reader>
std::vector<T> to_vector(Reader r) {
  std::vector<T> v;
  v.reserve(r.size());
  for (auto x : r) v.push_back(static_cast<T>(x));
  return v;
}

}  // namespace

owned<proto::Credits> to_wire(const engine_credits& c) {
  owned<proto::Credits> m(64);
  auto b = m.init();
  const engine_load& l = c.load;
  b.setMaxWaiting(c.max_waiting);
  auto tiers = b.initTiers(static_cast<unsigned>(l.tiers.size()));
  for (unsigned i = 0; i < l.tiers.size(); ++i) {
    const tier_load& t = l.tiers[i];
    auto w = tiers[i];
    w.setPriority(t.priority);
    w.setWaiting(t.waiting);
    w.setRunning(t.running);
    w.setDecodes(t.decodes);
    w.setContext(t.context);
    w.setTpotSeconds(t.tpot_seconds);
    w.setPromptTokens(t.prompt_tokens);
    w.setLaterTokens(t.later_tokens);
    w.setCachedShare(t.cached_share);
  }
  auto received = b.initReceivedByPriority(static_cast<unsigned>(c.received_by_priority.size()));
  unsigned i = 0;
  for (const auto& [priority, n] : c.received_by_priority) {
    received[i].setPriority(priority);
    received[i++].setCount(n);
  }
  fill(b.initStepModel(static_cast<unsigned>(l.step_model.size())), l.step_model);
  b.setStepObservations(l.step_observations);
  b.setMaxStepTokens(l.max_step_tokens);
  b.setMaxStepSeqs(l.max_step_seqs);
  b.setStepSeconds(l.step_seconds);
  b.setFinishedPerSecond(l.finished_per_second);
  b.setStepResidual(l.step_residual);
  return m;
}

engine_credits from_wire(proto::Credits::Reader r) {
  engine_credits c;
  engine_load& l = c.load;
  c.max_waiting = r.getMaxWaiting();
  for (auto w : r.getTiers()) {
    l.tiers.push_back({w.getPriority(), w.getWaiting(), w.getRunning(), w.getDecodes(), w.getContext(), w.getTpotSeconds(),
                       w.getPromptTokens(), w.getLaterTokens(), w.getCachedShare()});
  }
  for (auto x : r.getReceivedByPriority()) c.received_by_priority[x.getPriority()] = x.getCount();
  const auto model = r.getStepModel();
  for (unsigned i = 0; i < model.size() && i < l.step_model.size(); ++i) l.step_model[i] = model[i];
  l.step_observations = r.getStepObservations();
  l.max_step_tokens = r.getMaxStepTokens();
  l.max_step_seqs = r.getMaxStepSeqs();
  l.step_seconds = r.getStepSeconds();
  l.finished_per_second = r.getFinishedPerSecond();
  l.step_residual = r.getStepResidual();
  return c;
}

owned<proto::TokenChunk> to_wire(seq_id seq, const std::vector<token_id>& tokens, int64_t first_token_ns,
                                 const std::vector<token_logprob>& logprobs) {
  owned<proto::TokenChunk> m(8);  // words: one chunk of a decode step fits
  auto b = m.init();
  b.setRequestId(seq);
  fill(b.initTokens(static_cast<unsigned>(tokens.size())), tokens);
  if (first_token_ns >= 0) b.setFirstTokenNs(first_token_ns);
  if (!logprobs.empty()) {
    auto l = b.initLogprobs(static_cast<unsigned>(logprobs.size()));
    for (unsigned i = 0; i < logprobs.size(); ++i) to_wire(logprobs[i], l[i]);
  }
  return m;
}

std::pair<sequence_spec, std::vector<std::string>> sequence_of(proto::GenerateRequest::Reader r) {
  sequence_spec spec;
  spec.id = r.getRequestId();
  spec.priority = r.getTierPriority();
  spec.arrival = static_cast<uint64_t>(r.getArrivalNs());
  spec.prompt = to_vector<token_id>(r.getPrompt());
  spec.sampling = sampling_of(r.getSampling());
  spec.max_tokens = r.getMaxTokens();
  spec.stop_tokens = to_vector<token_id>(r.getStopTokens());
  spec.token_window = r.getTokenWindow();
  spec.ttft_target_ns = r.getTtftTargetNs();
  spec.tpot_target_ns = r.getTpotTargetNs();
  spec.start_by = r.getStartByNs();
  spec.expected_cached = r.getExpectedCachedTokens();
  std::vector<std::string> degradations;
  for (auto d : r.getDegradations()) degradations.emplace_back(d.cStr());
  return {std::move(spec), std::move(degradations)};
}

owned<proto::KvRequest> to_wire(const kv_request& r) {
  owned<proto::KvRequest> m(256);
  auto b = m.init();
  auto entries = b.initEntries(static_cast<unsigned>(r.entries.size()));
  for (unsigned i = 0; i < r.entries.size(); ++i) {
    const kv_entry& e = r.entries[i];
    auto eb = entries[i];
    eb.setSeq(e.seq);
    eb.setPositions(e.positions);
    eb.setAdmit(e.admit);
    eb.setPreemptable(e.preemptable);
    eb.setWriteFrom(e.write_from);
    if (e.admit) fill(eb.initPrompt(static_cast<unsigned>(e.prompt.size())), e.prompt);
  }
  fill(b.initReleases(static_cast<unsigned>(r.releases.size())), r.releases);
  auto commits = b.initCommits(static_cast<unsigned>(r.commits.size()));
  for (unsigned i = 0; i < r.commits.size(); ++i) {
    commits[i].setSeq(r.commits[i].seq);
    commits[i].setComputed(r.commits[i].computed);
    commits[i].setFirstBlock(r.commits[i].first_block);
    fill(commits[i].initTokens(static_cast<unsigned>(r.commits[i].tokens.size())), r.commits[i].tokens);
  }
  return m;
}

kv_request from_wire(proto::KvRequest::Reader r) {
  kv_request out;
  for (auto e : r.getEntries()) {
    kv_entry x;
    x.seq = e.getSeq();
    x.positions = e.getPositions();
    x.admit = e.getAdmit();
    x.preemptable = e.getPreemptable();
    x.write_from = e.getWriteFrom();
    if (x.admit) x.prompt = to_vector<token_id>(e.getPrompt());
    out.entries.push_back(std::move(x));
  }
  out.releases = to_vector<seq_id>(r.getReleases());
  for (auto c : r.getCommits()) {
    out.commits.push_back({c.getSeq(), to_vector<token_id>(c.getTokens()), c.getComputed(), c.getFirstBlock()});
  }
  return out;
}

owned<proto::KvReply> to_wire(const kv_reply& r) {
  owned<proto::KvReply> m(256);
  auto b = m.init();
  auto grants = b.initGrants(static_cast<unsigned>(r.grants.size()));
  for (unsigned i = 0; i < r.grants.size(); ++i) {
    const kv_grant& g = r.grants[i];
    grants[i].setSeq(g.seq);
    grants[i].setGranted(g.granted);
    grants[i].setCachedTokens(g.cached_tokens);
    grants[i].setTableFrom(g.table_from);
    fill(grants[i].initTable(static_cast<unsigned>(g.table.size())), g.table);
  }
  fill(b.initPreempted(static_cast<unsigned>(r.preempted.size())), r.preempted);
  auto copies = b.initCopies(static_cast<unsigned>(r.copies.size()));
  for (unsigned i = 0; i < r.copies.size(); ++i) {
    copies[i].setSrc(r.copies[i].first);
    copies[i].setDst(r.copies[i].second);
  }
  b.setFreeBlocks(r.stats.free);
  b.setTotalBlocks(r.stats.total);
  b.setCachedFreeBlocks(r.stats.cached_free);
  return m;
}

kv_reply from_wire(proto::KvReply::Reader r) {
  kv_reply out;
  for (auto g : r.getGrants()) {
    out.grants.push_back(
        {g.getSeq(), g.getGranted(), g.getCachedTokens(), g.getTableFrom(), to_vector<block_id>(g.getTable())});
  }
  out.preempted = to_vector<seq_id>(r.getPreempted());
  for (auto c : r.getCopies()) out.copies.emplace_back(c.getSrc(), c.getDst());
  out.stats.free = r.getFreeBlocks();
  out.stats.total = r.getTotalBlocks();
  out.stats.cached_free = r.getCachedFreeBlocks();
  out.stats.used = out.stats.total - out.stats.free;
  return out;
}

void set_sampling(proto::Sampling::Builder b, const sampling_params& p) {
  b.setTemperature(p.temperature);
  b.setTopK(p.top_k);
  b.setTopP(p.top_p);
  b.setSeed(p.seed);
  b.setMinP(p.min_p);
  b.setPresencePenalty(p.presence_penalty);
  b.setFrequencyPenalty(p.frequency_penalty);
  b.setRepetitionPenalty(p.repetition_penalty);
  b.setLogprobs(p.logprobs);
}

sampling_params sampling_of(proto::Sampling::Reader r) {
  sampling_params p;
  p.temperature = r.getTemperature();
  p.top_k = r.getTopK();
  p.top_p = r.getTopP();
  p.seed = r.getSeed();
  p.min_p = r.getMinP();
  p.presence_penalty = r.getPresencePenalty();
  p.frequency_penalty = r.getFrequencyPenalty();
  p.repetition_penalty = r.getRepetitionPenalty();
  p.logprobs = r.getLogprobs();
  return p;
}

owned<proto::StepRequest> to_wire(uint64_t step_id, const step_batch& batch,
                                  const std::vector<std::pair<block_id, block_id>>& copies,
                                  const std::vector<seq_id>& forget) {
  owned<proto::StepRequest> m(static_cast<unsigned>(64 + batch.seqs.size() * 16 + batch.n_tokens() / 2));
  auto b = m.init();
  b.setStepId(step_id);
  auto seqs = b.initSeqs(static_cast<unsigned>(batch.seqs.size()));
  for (unsigned i = 0; i < batch.seqs.size(); ++i) {
    const sequence_step& s = batch.seqs[i];
    auto sb = seqs[i];
    sb.setSeq(s.seq_id);
    fill(sb.initTokens(static_cast<unsigned>(s.tokens.size())), s.tokens);
    sb.setStartPos(s.start_pos);
    sb.setTableFrom(s.table_from);
    fill(sb.initBlockTable(static_cast<unsigned>(s.block_table.size() - s.table_from)),
         s.block_table.subspan(static_cast<size_t>(s.table_from)));
    sb.setSample(s.sample);
    set_sampling(sb.initSampling(), s.sampling);
    sb.setWantLogits(s.want_logits);
    if (!s.history.empty()) {
      const auto from = static_cast<size_t>(std::clamp(s.history_from, 0, s.start_pos));
      fill(sb.initHistory(static_cast<unsigned>(static_cast<size_t>(s.start_pos) - from)),
           s.history.subspan(from, static_cast<size_t>(s.start_pos) - from));
      sb.setHistoryFrom(static_cast<int32_t>(from));
      sb.setPromptLen(s.prompt_len);
    }
  }
  auto cb = b.initCopies(static_cast<unsigned>(copies.size()));
  for (unsigned i = 0; i < copies.size(); ++i) {
    cb[i].setSrc(copies[i].first);
    cb[i].setDst(copies[i].second);
  }
  fill(b.initForget(static_cast<unsigned>(forget.size())), forget);
  return m;
}

namespace {

// An Int32 list's elements in place: Cap'n Proto lays them out as little-endian int32, word
// aligned (this runs on little-endian machines only).
std::span<const int32_t> view_of(capnp::List<int32_t>::Reader list) {
  static_assert(std::endian::native == std::endian::little);
  const capnp::AnyList::Reader any(list);
  if (list.size() > 0 && any.getElementSize() != capnp::ElementSize::FOUR_BYTES) {
    throw std::runtime_error("a step request's Int32 list is not encoded as 32-bit elements");
  }
  const kj::ArrayPtr<const kj::byte> bytes = any.getRawBytes();
  return {reinterpret_cast<const int32_t*>(bytes.begin()), list.size()};
}

}  // namespace

void unpack(proto::StepRequest::Reader r, step_storage& out) {
  for (seq_id s : r.getForget()) {
    out.tables.erase(s);
    out.histories.erase(s);
  }
  const auto seqs = r.getSeqs();
  out.batch.seqs.resize(seqs.size());
  for (unsigned i = 0; i < seqs.size(); ++i) {
    auto s = seqs[i];
    std::vector<int32_t>& table = out.tables[s.getSeq()];
    const auto delta = s.getBlockTable();
    const uint32_t from = static_cast<uint32_t>(std::max(s.getTableFrom(), 0));
    if (from > table.size()) {
      throw std::runtime_error("a step's block table starts at block " + std::to_string(from) + " of sequence " +
                               std::to_string(s.getSeq()) + ", whose earlier blocks this shard never received");
    }
    const std::span<const int32_t> blocks = view_of(delta);
    table.resize(from);
    table.insert(table.end(), blocks.begin(), blocks.end());
    sequence_step& st = out.batch.seqs[i];
    st.seq_id = s.getSeq();
    st.tokens = view_of(s.getTokens());
    st.start_pos = s.getStartPos();
    st.block_table = table;
    st.sample = s.getSample();
    st.sampling = sampling_of(s.getSampling());
    st.want_logits = s.getWantLogits();
    st.history = {};
    if (st.sampling.penalized()) {
      std::vector<int32_t>& h = out.histories[st.seq_id];
      const uint32_t hfrom = static_cast<uint32_t>(std::max(s.getHistoryFrom(), 0));
      if (hfrom > h.size()) {
        throw std::runtime_error("a step's token history starts at position " + std::to_string(hfrom) +
                                 " of sequence " + std::to_string(st.seq_id) + ", whose earlier tokens this shard never received");
      }
      const std::span<const int32_t> before = view_of(s.getHistory());
      h.resize(hfrom);
      h.insert(h.end(), before.begin(), before.end());
      h.insert(h.end(), st.tokens.begin(), st.tokens.end());
      st.history = h;
      st.prompt_len = s.getPromptLen();
    }
  }
  out.copies.clear();
  for (auto c : r.getCopies()) out.copies.emplace_back(c.getSrc(), c.getDst());
}

owned<proto::StepReply> to_wire(uint64_t step_id, const step_result& r, double seconds) {
  owned<proto::StepReply> m(static_cast<unsigned>(16 + r.next.size() / 2 + r.logits.size() / 2));
  auto b = m.init();
  b.setStepId(step_id);
  fill(b.initNext(static_cast<unsigned>(r.next.size())), r.next);
  b.setSeconds(seconds);
  if (!r.logprobs.empty()) {
    auto l = b.initLogprobs(static_cast<unsigned>(r.logprobs.size()));
    for (unsigned i = 0; i < r.logprobs.size(); ++i) to_wire(r.logprobs[i], l[i]);
  }
  if (!r.logits.empty()) {
    auto d = b.initLogits(static_cast<unsigned>(r.logits.size() * sizeof(float)));
    std::memcpy(d.begin(), r.logits.data(), d.size());
  }
  return m;
}

void unpack(proto::StepReply::Reader r, step_result& out) {
  out.next = to_vector<token_id>(r.getNext());
  out.logprobs.clear();
  for (auto l : r.getLogprobs()) out.logprobs.push_back(from_wire(l));
  const auto d = r.getLogits();
  out.logits.resize(d.size() / sizeof(float));
  if (!d.size()) return;
  std::memcpy(out.logits.data(), d.begin(), d.size());
}

}  // namespace tireless
