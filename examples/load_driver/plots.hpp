#pragma once
// PNG plots drawn by gnuplot from data files written next to them: per run, TTFT per tier,
// queue depth per tier and rejections over time; for the whole comparison, SLO attainment per
// tier and goodput against the load multiple, one line per policy.

#include <filesystem>
#include <string>
#include <vector>

#include "report.hpp"
#include "runner.hpp"
#include "scenario.hpp"

namespace tireless::load {

// Writes dir/data/*.dat, dir/plots/*.gp and, where gnuplot is installed, dir/*.png.
// Returns the PNG files written (empty, with a warning in `note`, without gnuplot).
std::vector<std::filesystem::path> write_plots(const std::filesystem::path& dir, const scenario& s,
                                               const std::vector<run_result>& runs,
                                               const std::vector<run_metrics>& metrics, std::string& note);

}  // namespace tireless::load
