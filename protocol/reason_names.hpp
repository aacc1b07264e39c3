#pragma once
// The names of the outcome reasons of common.capnp, as the runtime's `outcome.reason` and the
// load driver's reports spell them: one table per enum, read both ways.

#include <string_view>
#include <utility>

#include "protocol/common.capnp.h"
#include "tireless/outcome.hpp"

namespace tireless::proto {

namespace reason_tables {

using C = Completion::Reason;
using R = Rejection::Reason;
using X = Cancellation::Reason;

inline constexpr std::pair<C, std::string_view> completion[] = {
    {C::STOP_TOKEN, reason::stop_token}, {C::STOP_STRING, reason::stop_string},
    {C::MAX_TOKENS, reason::max_tokens}, {C::CONTEXT_FULL, reason::context_full}};
inline constexpr std::pair<R, std::string_view> rejection[] = {
    {R::OVERLOADED, reason::overloaded}, {R::QUOTA_EXCEEDED, reason::quota_exceeded},
    {R::UNAUTHENTICATED, reason::unauthenticated}, {R::INVALID, reason::invalid},
    {R::PROMPT_TOO_LONG, reason::prompt_too_long}, {R::SHUTTING_DOWN, reason::shutting_down}};
inline constexpr std::pair<X, std::string_view> cancellation[] = {
    {X::CLIENT, reason::client}, {X::DEADLINE, reason::deadline}, {X::SHUTDOWN, reason::shutdown}};

template <class E, size_t N>
constexpr std::string_view name_in(const std::pair<E, std::string_view> (&table)[N], E value,
                                   std::string_view unknown) {
  for (const auto& [e, name] : table) {
    if (e == value) return name;
  }
  return unknown;
}

// The value named `name`; the table's first value when no entry has that name.
template <class E, size_t N>
constexpr E value_in(const std::pair<E, std::string_view> (&table)[N], std::string_view name) {
  for (const auto& [e, n] : table) {
    if (n == name) return e;
  }
  return table[0].first;
}

}  // namespace reason_tables

// Unknown values (from a newer peer) read as the outcome kind's name.
constexpr std::string_view reason_name(Completion::Reason r) {
  return reason_tables::name_in(reason_tables::completion, r, "completed");
}
constexpr std::string_view reason_name(Rejection::Reason r) {
  return reason_tables::name_in(reason_tables::rejection, r, "rejected");
}
constexpr std::string_view reason_name(Cancellation::Reason r) {
  return reason_tables::name_in(reason_tables::cancellation, r, "cancelled");
}

// Unknown names read as the first reason of each list (stop_token, overloaded, client).
constexpr Completion::Reason completion_reason(std::string_view name) {
  return reason_tables::value_in(reason_tables::completion, name);
}
constexpr Rejection::Reason rejection_reason(std::string_view name) {
  return reason_tables::value_in(reason_tables::rejection, name);
}
constexpr Cancellation::Reason cancellation_reason(std::string_view name) {
  return reason_tables::value_in(reason_tables::cancellation, name);
}

}  // namespace tireless::proto
