# A "newer client" of protocol/tireless.capnp, for the end-to-end schema evolution test: the
# same file id (so every struct and interface keeps its id and the schema is wire-compatible),
# with fields that this server does not know appended at new ordinals, in GenerateRequest and
# in ChatMessage: the server must ignore them and serve the request. One addition is not
# ignorable: a new member of the input union (images); an old server cannot serve that input
# and must refuse it (rejected, invalid), not crash or guess. Load it with its own capnp.SchemaParser (its ids collide
# with protocol/tireless.capnp's on purpose), with protocol/ on the import path.
@0xf9610d8f649fee81;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("tireless::rpc");

using Common = import "/common.capnp";  # from protocol/, via the import path

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
    images @16 :List(Data);          # newer than the server: an input kind it does not know
  }
  sampling @5 :Common.Sampling;  # unset: greedy
  maxTokens @6 :Int32 = -1;      # -1: the server's default; otherwise 1 .. context - prompt
  stop @7 :List(Text);           # stop sequences; the text stops before the first one
  timeoutMs @8 :Int64 = 0;       # 0: the server's default deadline; otherwise at most that
  clientRequestId @9 :Text;      # echoed in logs, for the client's own tracing
  parseSpecialTokens @10 :Bool = false;
  # --- newer than the server ---
  priorityHint @11 :Int32 = 0;   # a scalar in the data section, past the server's
  userTag @12 :Text;             # a pointer past the server's pointer section
  tools @13 :List(ToolSpec);     # a list of structs the server never heard of
  responseFormat :group {        # a group of new fields
    kind @14 :UInt8;
    schema @15 :Text;
  }
}

struct ToolSpec {
  name @0 :Text;
  description @1 :Text;
}

struct ChatMessage {
  role @0 :Text;     # "system", "user" or "assistant"
  content @1 :Text;
  # --- newer than the server ---
  name @2 :Text;
  weight @3 :Float64 = 1.0;
}

# Implemented by the client. The server calls tokens() as tokens arrive (never more than a
# window ahead of what the client has taken) and done() exactly once at the end.
interface TokenSink {
  tokens @0 (chunk :TokenChunk) -> stream;
  done @1 (outcome :Common.Outcome);
}

struct TokenChunk {
  text @0 :Text;          # complete UTF-8 characters only
  ids @1 :List(Int32);    # the token ids this chunk covers
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
  openStreams @6 :Int32;
  connections @7 :Int32;
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
}
