#pragma once
// Where scripts/fetch-model puts the real default model.

#include <cstdlib>
#include <string>

namespace tireless {

inline std::string default_model_path() {
  const char* home = std::getenv("HOME");
  return std::string(home ? home : ".") + "/.cache/tireless/models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

}  // namespace tireless
