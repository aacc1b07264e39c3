# The public service of tireless: what Cap'n Proto RPC clients in any language call.
#
# Schema evolution: fields are only ever added (never renumbered or retyped), each with a
# default that means "as before", so old clients keep working against new servers and new
# clients against old servers (unknown fields are ignored by Cap'n Proto readers).
@0xf9610d8f649fee81;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("tireless::rpc");

using Common = import "common.capnp";

# The bootstrap interface a client gets on connecting.
interface Inference {
  # Starts a generation. Tokens stream to `sink` (flow-controlled: a slow sink slows the
  # request, then pauses it); the outcome is delivered to sink.done() and is also the result
  # of generation.outcome(). Bad input, unknown keys and overload are outcomes (rejected),
  # not RPC errors. Dropping the returned Generation (or disconnecting) cancels the request.
  generate @0 (request :GenerateRequest, sink :TokenSink) -> (generation :Generation);

  # The models this server serves.
  models @1 () -> (models :List(ModelInfo));

  # Liveness and load, without authentication.
  health @2 () -> (health :Health);

  # Counters for the tenant that owns apiKey (and the whole server's load).
  stats @3 (apiKey :Text) -> (stats :Stats);
}

struct GenerateRequest {
  apiKey @0 :Text;               # the tenant's key; the request is refused without a valid one
  model @1 :Text;                # "" or the served model's name
  input :union {
    messages @2 :List(ChatMessage);  # a chat, formatted with the model's chat template
    text @3 :Text;                   # raw text, sent to the model as is (valid UTF-8)
    tokens @4 :List(Int32);          # token ids
  }
  sampling @5 :Common.Sampling;  # unset: greedy
  maxTokens @6 :Int32 = -1;      # -1: the server's default; otherwise 1 .. context - prompt
  stop @7 :List(Text);           # stop sequences; the text stops before the first one
  timeoutMs @8 :Int64 = 0;       # 0: the server's default deadline; otherwise at most that
  clientRequestId @9 :Text;      # echoed in logs, for the client's own tracing
  # text input only: control tokens written as text ("<|im_start|>") become control tokens.
  # Otherwise every text is tokenized as plain text (chat message contents always are: only
  # the chat template places control tokens, so no one can write another role's turn).
  parseSpecialTokens @10 :Bool = false;
  # A retry of a request refused for load: that refusal's Rejection.retryToken. Back at or
  # after its retryAfterMs, it holds the room reserved for it (it is not shed again).
  retryToken @11 :UInt64;
}

struct ChatMessage {
  role @0 :Text;     # "system", "user" or "assistant"
  content @1 :Text;
}

# Implemented by the client. The server calls tokens() as tokens arrive (never more than a
# window ahead of what the client has taken) and done() exactly once at the end.
interface TokenSink {
  tokens @0 (chunk :TokenChunk) -> stream;
  done @1 (outcome :Common.Outcome);
  # Returns once the client has handled every tokens() call made before it (calls on one
  # capability arrive in order, and a streaming call holds back the calls after it until it
  # returns). The server uses it to stay at most a window of tokens ahead of what the client
  # has taken. A client that does not implement it (written before it existed) gets the
  # transport's coarser flow control instead.
  sync @2 ();
}

struct TokenChunk {
  text @0 :Text;          # complete UTF-8 characters only
  ids @1 :List(Int32);    # the token ids this chunk covers
  logprobs @2 :List(Common.TokenLogprob);  # one per id when sampling.logprobs >= 0
}

# A generation in progress, private to the client that started it.
interface Generation {
  cancel @0 ();                                  # ends it (outcome: cancelled, client)
  status @1 () -> (state :State, tokens :Int32);  # tokens: generated so far
  outcome @2 () -> (outcome :Common.Outcome);    # resolves at the end

  enum State {
    running @0;
    finished @1;
  }
}

struct ModelInfo {
  name @0 :Text;
  description @1 :Text;
  contextLength @2 :Int32;
  vocabSize @3 :Int32;
}

struct Health {
  ok @0 :Bool;
  accepting @1 :Bool;        # false while shutting down
  running @2 :Int32;
  queued @3 :Int32;
  kvFreeBlocks @4 :Int32;
  kvTotalBlocks @5 :Int32;
  openStreams @6 :Int32;     # generations whose outcome has not reached their client yet
  connections @7 :Int32;     # client connections open now
  problem @8 :Text;          # why ok is false ("" while ok): what broke and what to do
}

struct Stats {
  tenant @0 :Text;           # "" when the key is unknown (then only server-wide fields are set)
  completed @1 :Int64;       # this tenant's requests, by outcome
  rejected @2 :Int64;
  cancelled @3 :Int64;
  failed @4 :Int64;
  promptTokens @5 :Int64;
  completionTokens @6 :Int64;
  serverRunning @7 :Int32;
  serverQueued @8 :Int32;
  # The whole server since it started. Every generate() call ends in exactly one outcome: at
  # rest, serverReceived = the four outcome counts' sum and serverOpen = 0.
  serverReceived @9 :Int64;
  serverCompleted @10 :Int64;
  serverRejected @11 :Int64;
  serverCancelled @12 :Int64;
  serverFailed @13 :Int64;
  serverOpen @14 :Int32;          # generations whose outcome has not reached their client yet
  shardRestarts @15 :Int64;       # crashed model shards restarted (their steps re-run)
  mailboxes @16 :List(Mailbox);   # the largest mailbox each actor of the runtime saw
  mailboxBound @17 :Int64;        # the bound the credit protocol keeps each of them under
  kvFreeBlocks @18 :Int32;
  kvTotalBlocks @19 :Int32;
}

struct Mailbox {
  actor @0 :Text;
  maxSize @1 :Int64;
}
