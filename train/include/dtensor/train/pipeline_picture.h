#pragma once
// A pipelined step as measured, drawn: from a trace of it (TraceScope or
// train_gpt --trace), each rank's compute actions (F, B, I, W; the pipeline
// runtime names each action's event on the rank's "scopes" track) at the
// times they ran, in milliseconds from the step's start. The time between
// them, waiting for a message, is the bubble, hatched as pictures'
// schedule_svg draws idle time. (timeline_svg draws a trace on a logical
// clock, where a message never waits: no bubble shows there.)
#include <string>

#include <dtensor/nn/pipeline.h>

namespace dtensor::train {

/// The kind pictures::schedule_svg colours an action by: "forward",
/// "backward", "input_backward", "weight_backward"; "message" for the rest.
const char* box_kind(nn::pipeline::ActionKind kind);

/// `trace_json`: the Chrome trace's text; `schedule`: the schedule the step
/// ran (TrainResult::schedule). ParseError naming the trace when it is not
/// JSON with "traceEvents".
std::string pipeline_step_svg(const std::string& trace_json, const nn::pipeline::Schedule& schedule,
                              const std::string& title);

}  // namespace dtensor::train
