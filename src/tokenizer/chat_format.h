// Literal pieces of the DeepSeek-V4.1 chat format, shared by the encoder and the parser.
#pragma once

#include <string_view>

namespace deepinfer::chat_format {

inline constexpr std::string_view kBos = "<｜begin▁of▁sentence｜>";
inline constexpr std::string_view kEos = "<｜end▁of▁sentence｜>";
inline constexpr std::string_view kUser = "<｜User｜>";
inline constexpr std::string_view kAssistant = "<｜Assistant｜>";
inline constexpr std::string_view kSystem = "<｜System｜>";
inline constexpr std::string_view kLatestReminder = "<｜latest_reminder｜>";
inline constexpr std::string_view kThinkStart = "<think>";
inline constexpr std::string_view kThinkEnd = "</think>";

// DSML: the tag names carry a leading space after the marker.
inline constexpr std::string_view kCallsOpen = "<｜DSML｜ calls>";
inline constexpr std::string_view kCallsClose = "</｜DSML｜ calls>";
inline constexpr std::string_view kInvokeOpen = "<｜DSML｜ invoke";
inline constexpr std::string_view kInvokeClose = "</｜DSML｜ invoke>";
inline constexpr std::string_view kParamOpen = "<｜DSML｜ parameter";
inline constexpr std::string_view kParamClose = "</｜DSML｜ parameter>";
// What separates content from a tool-call block in a completion.
inline constexpr std::string_view kCallsStart = "\n\n<｜DSML｜ calls";

inline constexpr std::string_view kToolResultOpen = "<tool_result>";
inline constexpr std::string_view kToolResultClose = "</tool_result>";

}  // namespace deepinfer::chat_format
