// The OpenAI-style API's bodies (server/openai_api.hpp), without HTTP: what a request body
// becomes, which error each outcome is, and what the responses and stream chunks hold.

#include "server/openai_api.hpp"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace tireless {
namespace {

using json = nlohmann::json;

decode_limits limits() {
  decode_limits l;
  l.model_name = "smollm2";
  l.max_prompt_bytes = 1000;
  l.max_prompt_tokens = 100;
  l.stream_window = 8;
  return l;
}

openai_call parse_ok(const json& body, openai_endpoint e = openai_endpoint::chat_completions) {
  auto r = parse_openai_request(body.dump(), e, limits(), 99);
  if (auto* err = std::get_if<api_error>(&r)) ADD_FAILURE() << err->message;
  return std::get<openai_call>(r);
}

api_error parse_error(const std::string& body, openai_endpoint e = openai_endpoint::chat_completions) {
  auto r = parse_openai_request(body, e, limits(), 99);
  EXPECT_TRUE(std::holds_alternative<api_error>(r)) << body;
  return std::holds_alternative<api_error>(r) ? std::get<api_error>(r) : api_error{};
}

const json hi = json::array({{{"role", "user"}, {"content", "Hi"}}});

TEST(openai_api, defaults_are_openais_and_a_request_without_a_seed_gets_the_servers) {
  const openai_call c = parse_ok({{"model", "smollm2"}, {"messages", hi}});
  EXPECT_EQ(c.req.sampling.temperature, 1.0f);
  EXPECT_EQ(c.req.sampling.top_p, 1.0f);
  EXPECT_EQ(c.req.sampling.seed, 99u);
  EXPECT_EQ(c.req.max_tokens, 0);  // the server's default
  EXPECT_FALSE(c.stream);
  EXPECT_TRUE(c.req.manual_ack);
  EXPECT_EQ(c.req.token_window, 8);
  ASSERT_EQ(c.req.messages.size(), 1u);
  EXPECT_EQ(c.req.messages[0].content, "Hi");
}

TEST(openai_api, every_parameter_users_send_reaches_the_request) {
  const openai_call c = parse_ok({{"messages", hi}, {"temperature", 0.5}, {"top_p", 0.9}, {"top_k", 40},
                                  {"min_p", 0.05}, {"seed", 7}, {"stop", "END"}, {"presence_penalty", 0.5},
                                  {"frequency_penalty", -1}, {"repetition_penalty", 1.2}, {"max_tokens", 5},
                                  {"max_completion_tokens", 9}, {"stream", true},
                                  {"stream_options", {{"include_usage", true}}}, {"user", "u"}, {"n", 1}});
  const sampling_options& s = c.req.sampling;
  EXPECT_FLOAT_EQ(s.temperature, 0.5f);
  EXPECT_FLOAT_EQ(s.top_p, 0.9f);
  EXPECT_EQ(s.top_k, 40);
  EXPECT_FLOAT_EQ(s.min_p, 0.05f);
  EXPECT_EQ(s.seed, 7u);
  EXPECT_FLOAT_EQ(s.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(s.frequency_penalty, -1.0f);
  EXPECT_FLOAT_EQ(s.repetition_penalty, 1.2f);
  EXPECT_EQ(c.req.max_tokens, 9);  // max_completion_tokens, OpenAI's newer name, wins
  EXPECT_EQ(c.req.stop, std::vector<std::string>{"END"});
  EXPECT_TRUE(c.stream);
  EXPECT_TRUE(c.include_usage);
}

TEST(openai_api, messages_take_text_parts_and_developer_is_a_system_message) {
  const openai_call c = parse_ok(
      {{"messages", {{{"role", "developer"}, {"content", "Be brief."}},
                     {{"role", "user"}, {"content", {{{"type", "text"}, {"text", "a"}}, {{"type", "text"}, {"text", "b"}}}}}}}});
  ASSERT_EQ(c.req.messages.size(), 2u);
  EXPECT_EQ(c.req.messages[0].role, "system");
  EXPECT_EQ(c.req.messages[1].content, "ab");
}

TEST(openai_api, a_completion_prompt_is_a_string_one_string_or_token_ids) {
  EXPECT_EQ(parse_ok({{"prompt", "abc"}}, openai_endpoint::completions).req.prompt, "abc");
  EXPECT_EQ(parse_ok({{"prompt", {"abc"}}}, openai_endpoint::completions).req.prompt, "abc");
  EXPECT_EQ(parse_ok({{"prompt", {1, 2, 3}}}, openai_endpoint::completions).req.prompt_tokens,
            (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(parse_error(R"({"prompt": ["a", "b"]})", openai_endpoint::completions).param, "prompt");
  EXPECT_EQ(parse_error(R"({"prompt": [1, -2]})", openai_endpoint::completions).param, "prompt");
}

TEST(openai_api, wrong_types_and_ranges_are_refused_naming_the_field_and_unknown_fields_are_ignored) {
  EXPECT_EQ(parse_error(R"({"messages": [{"role":"user","content":"x"}], "temperature": "hot"})").param, "temperature");
  EXPECT_EQ(parse_error(R"({"messages": [{"role":"user","content":"x"}], "temperature": 2.5})").param, "temperature");
  EXPECT_EQ(parse_error(R"({"messages": [{"role":"user","content":"x"}], "max_tokens": 1.5})").param, "max_tokens");
  EXPECT_EQ(parse_error(R"({"messages": [{"role":"user","content":"x"}], "n": 3})").param, "n");
  EXPECT_EQ(parse_error(R"({"messages": [{"role":"user","content":"x"}], "logprobs": 2})").param, "logprobs");
  EXPECT_EQ(parse_error(R"({"messages": [{"role":"user","content":"x"}], "top_logprobs": 2})").param, "top_logprobs");
  EXPECT_EQ(parse_error(R"({"messages": [{"role":"user","content":"x"}], "logprobs": true, "top_logprobs": 21})").param,
            "top_logprobs");
  EXPECT_EQ(parse_error(R"({"prompt": "x", "logprobs": true})", openai_endpoint::completions).param, "logprobs");
  EXPECT_EQ(parse_error(R"({"prompt": "x", "logprobs": 99})", openai_endpoint::completions).param, "logprobs");
  EXPECT_EQ(parse_error(R"({"messages": [{"role":"tool","content":"x"}]})").param, "messages[0].role");
  EXPECT_EQ(parse_error(R"({"messages": []})").param, "messages");
  EXPECT_EQ(parse_error("not json").status, 400);
  const api_error model = parse_error(R"({"model": "gpt-4o", "messages": [{"role":"user","content":"x"}]})");
  EXPECT_EQ(model.status, 404);
  EXPECT_EQ(model.code, "model_not_found");
  parse_ok({{"messages", hi}, {"tools", nullptr}, {"frobnicate", {{"a", 1}}}, {"temperature", nullptr}});
}

TEST(openai_api, a_prompt_over_the_byte_limit_is_refused_with_the_hint_to_split) {
  const api_error e = parse_error(json{{"prompt", std::string(1001, 'a')}}.dump(), openai_endpoint::completions);
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.code, "context_length_exceeded");
  EXPECT_NE(e.message.find("Split"), std::string::npos) << e.message;
}

TEST(openai_api, each_refusal_has_its_status_and_a_load_refusal_its_retry_hint) {
  auto status_of = [](outcome_kind k, std::string_view why) {
    outcome o;
    o.kind = k;
    o.reason = why;
    o.retry_after_ms = 1500;
    return error_of(o);
  };
  EXPECT_EQ(status_of(outcome_kind::rejected, reason::unauthenticated).status, 401);
  EXPECT_EQ(status_of(outcome_kind::rejected, reason::invalid).status, 400);
  EXPECT_EQ(status_of(outcome_kind::rejected, reason::prompt_too_long).status, 400);
  EXPECT_EQ(status_of(outcome_kind::rejected, reason::shutting_down).status, 503);
  EXPECT_EQ(status_of(outcome_kind::cancelled, reason::deadline).status, 504);
  EXPECT_EQ(status_of(outcome_kind::failed, reason::error).status, 500);
  const api_error busy = status_of(outcome_kind::rejected, reason::overloaded);
  EXPECT_EQ(busy.status, 429);
  EXPECT_EQ(busy.retry_after_ms, 1500);
  const json body = json::parse(error_body(busy));
  EXPECT_EQ(body["error"]["retry_after_ms"], 1500);
  EXPECT_EQ(body["error"]["type"], "rate_limit_error");
  EXPECT_TRUE(body["error"]["param"].is_null());
}

TEST(openai_api, a_capped_answer_says_length_and_lists_its_degradations) {
  const openai_call c = parse_ok({{"messages", hi}});
  outcome o;
  o.kind = outcome_kind::completed;
  o.reason = reason::max_tokens;
  o.text = "Hello";
  o.prompt_tokens = 5;
  o.completion_tokens = 1;
  o.degradations = {"max_tokens capped from 512 to 64 (tier free, pressure 0.90)", "caf\xc3\xa9"};
  const response_id rid = make_response_id(c, 42, 1700000000);
  const json whole = json::parse(completion_body(rid, o));
  EXPECT_EQ(whole["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(whole["choices"][0]["message"]["content"], "Hello");
  EXPECT_EQ(whole["usage"]["total_tokens"], 6);
  EXPECT_EQ(whole["degradations"].size(), 2u);
  const json last = json::parse(final_chunk(rid, o));
  EXPECT_EQ(last["object"], "chat.completion.chunk");
  EXPECT_EQ(last["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(last["degradations"].size(), 2u);
  EXPECT_EQ(degradations_header(o.degradations),
            "max_tokens capped from 512 to 64 (tier free, pressure 0.90); caf??");
  o.reason = reason::stop_token;
  EXPECT_EQ(finish_reason_of(o), "stop");
}

TEST(openai_api, logprobs_are_asked_for_as_each_endpoint_names_them) {
  EXPECT_EQ(parse_ok({{"messages", hi}}).req.sampling.logprobs, -1);
  EXPECT_EQ(parse_ok({{"messages", hi}, {"logprobs", false}}).req.sampling.logprobs, -1);
  EXPECT_EQ(parse_ok({{"messages", hi}, {"logprobs", true}}).req.sampling.logprobs, 0);
  EXPECT_EQ(parse_ok({{"messages", hi}, {"logprobs", true}, {"top_logprobs", 5}}).req.sampling.logprobs, 5);
  EXPECT_EQ(parse_ok({{"prompt", "x"}, {"logprobs", 3}}, openai_endpoint::completions).req.sampling.logprobs, 3);
  EXPECT_EQ(parse_ok({{"prompt", "x"}, {"logprobs", nullptr}}, openai_endpoint::completions).req.sampling.logprobs, -1);
}

TEST(openai_api, logprobs_appear_in_each_endpoints_shape_with_the_tokens_bytes) {
  outcome o;
  o.kind = outcome_kind::completed;
  o.reason = reason::stop_token;
  o.text = "Hi!";
  o.tokens = {7, 9};
  o.logprobs = {{7, -0.25f, {{7, -0.25f}, {3, -2.0f}}}, {9, -1.5f, {{4, -0.5f}}}};
  const token_bytes_fn bytes = [](int32_t t) { return t == 7 ? std::string("Hi") : t == 9 ? "!" : "\xe2\x80"; };

  const response_id chat = make_response_id(parse_ok({{"messages", hi}, {"logprobs", true}, {"top_logprobs", 2}}), 1, 0, bytes);
  const json c = json::parse(completion_body(chat, o))["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0]["token"], "Hi");
  EXPECT_FLOAT_EQ(c[0]["logprob"].get<float>(), -0.25f);
  EXPECT_EQ(c[0]["bytes"], json::array({72, 105}));
  EXPECT_EQ(c[0]["top_logprobs"].size(), 2u);
  EXPECT_EQ(c[0]["top_logprobs"][1]["bytes"], json::array({0xe2, 0x80}));  // part of a character: bytes exact
  EXPECT_EQ(c[1]["top_logprobs"][0]["token"], "\xef\xbf\xbd");  // ... and U+FFFD in the text
  // Streamed: a chunk carries its tokens' logprobs; one without asks none.
  const json chunk = json::parse(text_chunk(chat, "Hi", std::span(o.logprobs).first(1)));
  EXPECT_EQ(chunk["choices"][0]["logprobs"]["content"].size(), 1u);
  EXPECT_TRUE(json::parse(text_chunk(chat, "Hi"))["choices"][0]["logprobs"].is_null());
  EXPECT_TRUE(json::parse(completion_body(make_response_id(parse_ok({{"messages", hi}}), 1, 0, bytes), o))
                  ["choices"][0]["logprobs"].is_null());

  const response_id legacy =
      make_response_id(parse_ok({{"prompt", "x"}, {"logprobs", 1}}, openai_endpoint::completions), 1, 0, bytes);
  const json l = json::parse(completion_body(legacy, o))["choices"][0]["logprobs"];
  EXPECT_EQ(l["tokens"], json::array({"Hi", "!"}));
  EXPECT_EQ(l["text_offset"], json::array({0, 2}));
  EXPECT_FLOAT_EQ(l["token_logprobs"][1].get<float>(), -1.5f);
  EXPECT_TRUE(l["top_logprobs"][1].contains("!"));  // the chosen token always, as vLLM's
  EXPECT_EQ(l["top_logprobs"][1].size(), 2u);
  EXPECT_EQ(json::parse(final_chunk(legacy, o, std::span(o.logprobs).last(1), 2))["choices"][0]["logprobs"]["text_offset"],
            json::array({2}));
  // Without a tokenizer (the sim backend) tokens are named by id, as vLLM does.
  const json ids = json::parse(completion_body(make_response_id(parse_ok({{"prompt", "x"}, {"logprobs", 0}},
                                                                         openai_endpoint::completions), 1, 0), o));
  EXPECT_EQ(ids["choices"][0]["logprobs"]["tokens"][0], "token_id:7");
}

}  // namespace
}  // namespace tireless
