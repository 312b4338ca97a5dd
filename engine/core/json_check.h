// Checks of the JSON text of files a user hands us (safetensors headers, checkpoint and
// Hugging Face indexes, config.json, trainer_state.json): what a parser that keeps the last
// of two keys, or says only "not JSON", would not tell.
#pragma once

#include <istream>
#include <string>
#include <vector>

namespace switchyard {

// The first key that one object of the JSON `text` sets twice, as the keys leading to it
// ({"x"}: a top-level key; {"x", "dtype"}: "dtype" twice inside "x"), or {} when no key
// repeats (or the text is not JSON). JSON readers keep one of the two silently, so a header
// or index naming a tensor twice is refused with this instead.
std::vector<std::string> DuplicateJsonKey(const std::string& text);

// Where and why `text` is not JSON: "line 3, column 1: syntax error while parsing object -
// unexpected end of input; expected '}'", "number overflow parsing '1e999'" (a number no
// double holds), or "" when it is JSON. Parses the text again, so readers call it only once
// their own parse has failed; never throws.
std::string JsonSyntaxError(const std::string& text);
// The same for text read from `in` to its end (a file too large to hold twice); nothing of
// it is kept.
std::string JsonSyntaxError(std::istream& in);

}  // namespace switchyard
