// libFuzzer target: the OpenAI-style HTTP API's request handling. The first byte picks what the
// rest is:
//   even: a whole HTTP/1.1 request, parsed by kj-http's server (in memory) and routed as the
//         gateway does: its body goes to parse_openai_request; the server answers with a status
//         line for every input, or closes the connection on a malformed request.
//   odd:  a request body for /v1/chat/completions (bit 1 clear) or /v1/completions (bit 1 set).
// parse_openai_request returns a request within the limits, or an OpenAI-shaped error with a
// message and a 4xx status; the response builders turn any outcome text into valid JSON.

#include <kj/async-io.h>
#include <kj/compat/http.h>
#include <kj/timer.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <variant>

#include "actors/request_checks.hpp"
#include "fuzz_limits.hpp"
#include "server/openai_api.hpp"

namespace {

using namespace tireless;

const decode_limits limits = fuzz_limits();

void check_accepted(const openai_call& c) {
  const request& q = c.req;
  const int inputs = !q.messages.empty() + !q.prompt.empty() + !q.prompt_tokens.empty();
  if (c.endpoint == openai_endpoint::chat_completions ? q.messages.empty() : inputs != 1) __builtin_trap();
  if (prompt_text_bytes(q) > limits.max_prompt_bytes) __builtin_trap();
  for (const message& m : q.messages) {
    if (m.role != "system" && m.role != "user" && m.role != "assistant") __builtin_trap();
    if (m.content.find('\0') != std::string::npos) __builtin_trap();
  }
  if (q.prompt.find('\0') != std::string::npos) __builtin_trap();
  if (q.max_tokens < 0 || q.stop.size() > limits.max_stop_sequences) __builtin_trap();
  for (const std::string& s : q.stop) {
    if (s.empty() || s.size() > limits.max_stop_bytes) __builtin_trap();
  }
  const sampling_options& s = q.sampling;
  if (!(s.temperature >= 0 && s.temperature <= 2) || !(s.top_p > 0 && s.top_p <= 1) || s.top_k < 0) __builtin_trap();
  if (!(s.min_p >= 0 && s.min_p <= 1) || !(s.repetition_penalty > 0)) __builtin_trap();
  if (!(std::fabs(s.presence_penalty) <= 2 && std::fabs(s.frequency_penalty) <= 2)) __builtin_trap();
  if (c.model != limits.model_name) __builtin_trap();
  if (q.timeout != limits.default_timeout || !q.manual_ack) __builtin_trap();
}

void check_valid_json(const std::string& text) {
  if (nlohmann::json::parse(text, nullptr, false).is_discarded()) __builtin_trap();
}

// Parses one body; returns the HTTP status the gateway would answer with before running it.
int parse_body(std::string_view body, openai_endpoint endpoint) {
  auto parsed = parse_openai_request(body, endpoint, limits, 7);
  if (auto* e = std::get_if<api_error>(&parsed)) {
    if (e->message.empty() || e->status < 400 || e->status > 499) __builtin_trap();
    check_valid_json(error_body(*e));
    return e->status;
  }
  const openai_call& call = std::get<openai_call>(parsed);
  check_accepted(call);
  // The builders on whatever text the body held (a model may write anything back).
  outcome o;
  o.kind = outcome_kind::completed;
  o.reason = std::string(reason::max_tokens);
  o.text = call.req.messages.empty() ? call.req.prompt : call.req.messages.back().content;
  o.degradations = call.req.stop;
  const response_id rid = make_response_id(call, 1, 0);
  check_valid_json(completion_body(rid, o));
  check_valid_json(text_chunk(rid, o.text));
  check_valid_json(final_chunk(rid, o));
  for (char ch : degradations_header(o.degradations)) {
    if (ch < 0x20 || ch > 0x7e) __builtin_trap();
  }
  return 200;
}

// The gateway's routing of a generation request, without a runtime: the body is read and
// parsed, and the status is the answer.
class fuzz_service final : public kj::HttpService {
 public:
  explicit fuzz_service(const kj::HttpHeaderTable& table) : table_(table) {}
  kj::Promise<void> request(kj::HttpMethod method, kj::StringPtr url, const kj::HttpHeaders&,
                            kj::AsyncInputStream& body, Response& response) override {
    const bool chat = url == "/v1/chat/completions";
    if (method != kj::HttpMethod::POST || (!chat && url != "/v1/completions")) {
      return response.sendError(404, "Not Found", table_);
    }
    return body.readAllText(1 << 16).then(
        [this, chat, &response](kj::String text) {
          const int status = parse_body(std::string_view(text.cStr(), text.size()),
                                        chat ? openai_endpoint::chat_completions : openai_endpoint::completions);
          return response.sendError(static_cast<unsigned>(status), "Status", table_);
        },
        [this, &response](kj::Exception&&) { return response.sendError(413, "Payload Too Large", table_); });
  }

 private:
  const kj::HttpHeaderTable& table_;
};

struct http_rig {
  kj::EventLoop loop;
  kj::WaitScope scope{loop};
  kj::TimerImpl timer{kj::origin<kj::TimePoint>()};
  kj::HttpHeaderTable table;
  fuzz_service service{table};
  kj::HttpServer server{timer, table, service};
};

// The request goes in, the client's side is closed for writing, and the server must answer
// or close within 100 virtual seconds (its timeouts run on a timer advanced here).
void serve_once(std::string_view bytes) {
  static http_rig* rig = new http_rig();
  auto pipe = kj::newTwoWayPipe();
  auto client = kj::mv(pipe.ends[1]);
  auto served = rig->server.listenHttp(kj::mv(pipe.ends[0])).then([] {}, [](kj::Exception&&) {}).eagerlyEvaluate(nullptr);
  auto sent = client->write(bytes.data(), bytes.size())
                  .then([&client] { client->shutdownWrite(); }, [](kj::Exception&&) {})
                  .eagerlyEvaluate(nullptr);
  auto reply = client->readAllText(1 << 20)
                   .then([](kj::String s) { return s; }, [](kj::Exception&&) { return kj::String(); })
                   .eagerlyEvaluate(nullptr);
  for (int i = 0; i < 100 && !reply.poll(rig->scope); ++i) {
    rig->timer.advanceTo(rig->timer.now() + 1 * kj::SECONDS);
  }
  if (!reply.poll(rig->scope)) __builtin_trap();  // neither answered nor closed
  const kj::String text = reply.wait(rig->scope);
  if (text.size() > 0 && !text.startsWith("HTTP/1.1 ")) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] & 1) {
    parse_body(rest, (data[0] & 2) ? openai_endpoint::completions : openai_endpoint::chat_completions);
  } else {
    serve_once(rest);
  }
  return 0;
}
