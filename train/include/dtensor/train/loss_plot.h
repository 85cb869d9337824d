#pragma once
// A loss curve as a standalone SVG file: training loss per step and
// validation loss at the steps it was measured, with round-numbered axes, a
// legend and the run's configuration as the title. Plain text output, so a
// run leaves a picture without any plotting library.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace dtensor::train {

/// The SVG document: train_losses[i] is the training loss at step i;
/// val_points holds (step, validation loss). Values that are NaN or infinite
/// are left out, and the legend says how many. A long title is wrapped onto
/// up to four lines in a smaller font. Either series may be empty.
std::string loss_svg(const std::string& title, const std::vector<double>& train_losses,
                     const std::vector<std::pair<std::int64_t, double>>& val_points);

/// Writes loss_svg(title, train_losses, val_points) to `path`. Throws
/// dtensor::ValueError naming the path when it cannot be written.
void write_loss_svg(const std::string& path, const std::string& title, const std::vector<double>& train_losses,
                    const std::vector<std::pair<std::int64_t, double>>& val_points);

}  // namespace dtensor::train
