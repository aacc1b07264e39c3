# Types shared by the runtime's internal messages (runtime.capnp) and the public service
# (tireless.capnp): sampling parameters and the one terminal outcome of a request.
@0xd9b4025be0e2dac6;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("tireless::proto");

struct Sampling {
  temperature @0 :Float32 = 0.0;  # 0: greedy
  topK @1 :Int32 = 0;             # 0: all tokens
  topP @2 :Float32 = 1.0;         # in (0, 1]
  seed @3 :UInt64 = 0;
  minP @4 :Float32 = 0.0;         # [0, 1]: drop tokens less likely than minP x the most likely's
  presencePenalty @5 :Float32 = 0.0;   # [-2, 2], over generated tokens (OpenAI's)
  frequencyPenalty @6 :Float32 = 0.0;  # [-2, 2], per occurrence in generated tokens (OpenAI's)
  repetitionPenalty @7 :Float32 = 1.0; # > 0, over prompt and generated tokens; 1: off
  logprobs @8 :Int32 = -1;        # -1: none; n in [0, 20]: each token's log-probability and the n most likely's
}

# A generated token's log-probability under the model (its raw distribution: before the
# temperature, the penalties and the top-k/top-p/min-p filters), and the n most likely tokens'.
struct TokenLogprob {
  token @0 :Int32;
  logprob @1 :Float32;
  topTokens @2 :List(Int32);      # most likely first
  topLogprobs @3 :List(Float32);
}

# Every request ends with exactly one Outcome.
struct Outcome {
  requestId @0 :UInt64;
  union {
    completed @1 :Completion;
    rejected @2 :Rejection;
    cancelled @3 :Cancellation;
    failed @4 :Failure;
  }
  # What was done to the request because of load, each a sentence a person can read
  # ("max_tokens capped from 512 to 128 (tier standard, pressure 0.71)"). Never silent.
  degradations @5 :List(Text);
  usage @6 :Usage;
  timings @7 :Timings;
}

struct Completion {
  reason @0 :Reason;
  enum Reason {
    stopToken @0;    # the model ended its turn
    stopString @1;   # a requested stop sequence appeared
    maxTokens @2;    # max_tokens reached (after any cap, see degradations)
    contextFull @3;  # the context window is full
  }
}

struct Rejection {
  reason @0 :Reason;
  enum Reason {
    overloaded @0;       # the tier's queue is full or its wait would miss the tier's target
    quotaExceeded @1;    # the tenant's rate, token or concurrency quota
    unauthenticated @2;  # unknown or missing API key
    invalid @3;          # the request itself is wrong; retrying will not help
    promptTooLong @4;    # longer than this tier accepts now, or than the context; split it
    shuttingDown @5;
  }
  message @1 :Text;
  retryAfterMs @2 :Int64 = -1;  # when retrying can help: wait at least this long; else -1
  retryToken @3 :UInt64;         # refused for load: send it with the retry (GenerateRequest.retryToken)
}

struct Cancellation {
  reason @0 :Reason;
  enum Reason {
    client @0;    # the client cancelled or went away
    deadline @1;  # the request's deadline passed
    shutdown @2;  # the server stopped before the request could finish
  }
}

struct Failure {
  message @0 :Text;
}

struct Usage {
  promptTokens @0 :Int32;
  completionTokens @1 :Int32;
  cachedPromptTokens @2 :Int32;  # prompt tokens whose KV came from the prefix cache
  preemptions @3 :Int32;
}

struct Timings {
  queuedMs @0 :Float64;          # arrival to first scheduled
  timeToFirstTokenMs @1 :Float64 = -1;
  totalMs @2 :Float64;
  longestPauseMs @3 :Float64;    # the longest wait between two consecutive tokens (0: fewer than two)
}
