#pragma once
// What every actor reports about itself: the largest mailbox it saw (sampled by the actor in
// its own handlers, as CAF 0.17 requires) and how many messages it handled.

#include <cstdint>
#include <string>

namespace tireless {

struct mailbox_stats {
  std::string actor;
  int64_t max_mailbox = 0;
  int64_t handled = 0;
};

// Record in a handler: mailbox_stats s; ... note_mailbox(s, self->mailbox().size());
inline void note_mailbox(mailbox_stats& s, size_t size) {
  ++s.handled;
  if (static_cast<int64_t>(size) > s.max_mailbox) s.max_mailbox = static_cast<int64_t>(size);
}

}  // namespace tireless
