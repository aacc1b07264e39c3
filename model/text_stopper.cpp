#include "model/text_stopper.hpp"

#include <algorithm>

namespace tireless {

text_stopper::text_stopper(const tokenizer& tok, std::vector<token_id> stop_tokens,
                           std::vector<std::string> stop_strings)
    : decoder_(tok), stop_tokens_(std::move(stop_tokens)), stop_strings_(std::move(stop_strings)) {
  std::erase_if(stop_strings_, [](const std::string& s) { return s.empty(); });
}

text_stopper::piece text_stopper::push(token_id id) {
  piece out;
  if (stopped_) return {"", true};
  if (std::find(stop_tokens_.begin(), stop_tokens_.end(), id) != stop_tokens_.end()) {
    std::string rest = finish();
    stopped_ = true;
    return {std::move(rest), true};
  }
  pending_ += decoder_.push(id);
  size_t cut = std::string::npos;
  for (const std::string& s : stop_strings_) cut = std::min(cut, pending_.find(s));
  if (cut != std::string::npos) {
    stopped_ = true;
    out.text = pending_.substr(0, cut);
    out.stopped = true;
    pending_.clear();
    return out;
  }
  // Hold back the longest tail of pending_ that begins some stop string.
  size_t hold = 0;
  for (const std::string& s : stop_strings_) {
    for (size_t n = std::min(s.size() - 1, pending_.size()); n > hold; --n) {
      if (pending_.compare(pending_.size() - n, n, s, 0, n) == 0) {
        hold = n;
        break;
      }
    }
  }
  out.text = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string text_stopper::finish() {
  if (stopped_) return {};  // what followed the stop was never to be shown
  std::string rest = std::move(pending_);
  pending_.clear();
  rest += decoder_.flush();
  return rest;
}

}  // namespace tireless
