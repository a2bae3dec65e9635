// Small string helpers for error messages.
#pragma once

#include <span>         // std::span
#include <string>       // std::string
#include <string_view>  // std::string_view

namespace zeroth {

// The candidate closest to `word` by edit distance, if it is close enough to be a likely typo;
// empty otherwise. For "did you mean" hints.
std::string closest_match(std::string_view word, std::span<const std::string_view> candidates);

// " (did you mean 'x'?)" or "".
std::string did_you_mean(std::string_view word, std::span<const std::string_view> candidates);

}  // namespace zeroth
