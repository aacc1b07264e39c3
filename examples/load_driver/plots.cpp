#include "plots.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>

namespace tireless::load {

namespace {

namespace fs = std::filesystem;

constexpr const char* colors[] = {"#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02"};

const char* color(int32_t i) { return colors[static_cast<size_t>(i) % std::size(colors)]; }

std::string value(double v) { return std::isnan(v) ? std::string("NaN") : fmt::format("{:.6g}", v); }

double nearest_rank(std::vector<double> v, double p) {
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  const size_t rank = static_cast<size_t>(std::ceil(p / 100.0 * static_cast<double>(v.size())));
  return v[std::min(v.size() - 1, rank == 0 ? 0 : rank - 1)];
}

// About 120 bins over the run, of whole seconds at least.
double bin_width(const run_result& run) { return std::max(1.0, std::ceil(run.measure_to_s / 120.0)); }

// Columns: bin start, then per tier TTFT p50 and p99 (ms) of the completions that arrived in it.
void write_ttft(const fs::path& file, const run_result& run, const scenario& s) {
  const double w = bin_width(run);
  const size_t bins = static_cast<size_t>(std::ceil(run.measure_to_s / w));
  std::vector<std::vector<std::vector<double>>> ttft(bins, std::vector<std::vector<double>>(static_cast<size_t>(s.tier_count())));
  for (const request_record& r : run.records) {
    if (!r.done() || r.kind != outcome_kind::completed || r.ttft_ms < 0) continue;
    const size_t b = std::min(bins - 1, static_cast<size_t>(r.plan.arrival_s / w));
    ttft[b][static_cast<size_t>(r.plan.tier)].push_back(r.ttft_ms);
  }
  std::ofstream out(file);
  out << "# t_s, per tier: ttft p50 ms, ttft p99 ms\n";
  for (size_t b = 0; b < bins; ++b) {
    out << value(static_cast<double>(b) * w);
    for (const auto& v : ttft[b]) out << ' ' << value(nearest_rank(v, 50)) << ' ' << value(nearest_rank(v, 99));
    out << '\n';
  }
}

// Columns: t, queued, running, waiting in the engine, then per tier queued (NaN when the target
// does not report it) and in system (the driver's count). Means over groups of consecutive
// samples, at most ~800 rows (the JSON keeps every sample).
void write_load(const fs::path& file, const run_result& run, const scenario& s) {
  std::ofstream out(file);
  out << "# t_s, queued, running, waiting, per tier: queued_by_tier, in_system (means over " ;
  const size_t n = run.samples.size(), k = std::max<size_t>(1, (n + 799) / 800);
  out << k << " samples)\n";
  auto mean = [&](size_t from, size_t to, auto field) {
    double sum = 0;
    size_t count = 0;
    for (size_t i = from; i < to; ++i) {
      const double v = field(run.samples[i]);
      if (v >= 0) {
        sum += v;
        ++count;
      }
    }
    return count ? sum / static_cast<double>(count) : std::nan("");
  };
  for (size_t from = 0; from < n; from += k) {
    const size_t to = std::min(n, from + k);
    out << value(run.samples[from].t) << ' ' << value(mean(from, to, [](const load_sample& x) { return x.queued; })) << ' '
        << value(mean(from, to, [](const load_sample& x) { return x.running; })) << ' '
        << value(mean(from, to, [](const load_sample& x) { return x.waiting; }));
    for (int32_t i = 0; i < s.tier_count(); ++i) {
      const auto t = static_cast<size_t>(i);
      out << ' ' << value(mean(from, to, [t](const load_sample& x) { return x.queued_by_tier.empty() ? -1 : x.queued_by_tier[t]; }))
          << ' ' << value(mean(from, to, [t](const load_sample& x) { return x.in_system[t]; }));
    }
    out << '\n';
  }
}

// Columns: bin start, then per tier rejections per second (by the time of the outcome).
void write_rejects(const fs::path& file, const run_result& run, const scenario& s) {
  const double w = bin_width(run);
  const size_t bins = static_cast<size_t>(std::ceil(std::max(run.end_s, run.measure_to_s) / w)) + 1;
  std::vector<std::vector<int64_t>> n(bins, std::vector<int64_t>(static_cast<size_t>(s.tier_count())));
  for (const request_record& r : run.records) {
    if (!r.done() || r.kind != outcome_kind::rejected) continue;
    ++n[std::min(bins - 1, static_cast<size_t>(r.outcome_s / w))][static_cast<size_t>(r.plan.tier)];
  }
  std::ofstream out(file);
  out << "# t_s, per tier: rejections per second\n";
  for (size_t b = 0; b < bins; ++b) {
    out << value(static_cast<double>(b) * w);
    for (int64_t c : n[b]) out << ' ' << value(static_cast<double>(c) / w);
    out << '\n';
  }
}

std::string run_script(const fs::path& dir, const run_result& run, const scenario& s, const std::string& png) {
  const std::string d = (dir / "data" / run.label).string();
  const bool by_tier = std::any_of(run.samples.begin(), run.samples.end(), [](const load_sample& x) { return !x.queued_by_tier.empty(); });
  std::string g = fmt::format(
      "set terminal png size 1000,1100 font 'DejaVuSans,9'\nset output '{}'\nset multiplot layout 3,1 title '{}: {} at {:g}x "
      "capacity ({:.3g} requests/s)'\nset grid\nset key outside right\nset xlabel 'time (s)'\nset xrange [0:{}]\n",
      png, s.name, to_string(run.policy), run.multiple, run.rate_rps, std::max(run.end_s, run.measure_to_s));
  g += "set title 'time to first token by arrival time (thick: p99, thin: p50, +: the tier target)'\nset ylabel 'ms'\nset logscale y\n"
       "plot ";
  for (int32_t i = 0; i < s.tier_count(); ++i) {
    g += fmt::format("{}'{}.ttft.dat' using 1:{} with lines lw 2 lc rgb '{}' title '{} p99', '' using 1:{} with lines lw 1 lc rgb '{}' "
                     "notitle, {} with points pt 1 ps 0.6 lc rgb '{}' notitle",
                     i ? ", " : "", d, 3 + 2 * i, color(i), s.tier(i).name, 2 + 2 * i, color(i), s.tier(i).ttft.count(), color(i));
  }
  g += "\nunset logscale y\n";
  g += by_tier ? "set title 'requests per tier: waiting in admission (thick), in the system, i.e. submitted without an outcome yet (thin)'\n"
               : "set title 'requests per tier in the system: submitted, no outcome yet (the target reports no per-tier queue)'\n";
  g += "set ylabel 'requests'\nplot ";
  for (int32_t i = 0; i < s.tier_count(); ++i) {
    if (by_tier) {
      g += fmt::format("'{}.load.dat' using 1:{} with lines lw 2 lc rgb '{}' title '{} waiting', ", d, 5 + 2 * i, color(i),
                       s.tier(i).name);
    }
    g += fmt::format("'{}.load.dat' using 1:{} with lines {} lc rgb '{}' title '{} in system', ", d, 6 + 2 * i,
                     by_tier ? "lw 1" : "lw 2", color(i), s.tier(i).name);
  }
  g += fmt::format("'{}.load.dat' using 1:3 with lines lc rgb 'black' title 'running (all tiers)'", d);
  g += "\nset title 'rejections per second, per tier (by the time of the outcome)'\nset ylabel 'rejections/s'\nplot ";
  for (int32_t i = 0; i < s.tier_count(); ++i) {
    g += fmt::format("{}'{}.rejects.dat' using 1:{} with steps lw 2 lc rgb '{}' title '{}'", i ? ", " : "", d, 2 + i,
                     color(i), s.tier(i).name);
  }
  return g + "\nunset multiplot\n";
}

// compare.dat: one block per policy; columns: multiple, SLO attainment (%) per tier, total
// SLO attainment (%), goodput (tokens/s).
std::string compare_script(const fs::path& dir, const scenario& s, const std::vector<run_result>& runs,
                           const std::vector<run_metrics>& metrics, const std::string& png) {
  std::vector<admission_policy> policies;
  for (const run_result& r : runs) {
    if (std::find(policies.begin(), policies.end(), r.policy) == policies.end()) policies.push_back(r.policy);
  }
  {
    std::ofstream out(dir / "data" / "compare.dat");
    for (admission_policy p : policies) {
      out << "# " << to_string(p) << "\n";
      std::vector<size_t> rows;
      for (size_t i = 0; i < runs.size(); ++i) if (runs[i].policy == p) rows.push_back(i);
      std::sort(rows.begin(), rows.end(), [&](size_t a, size_t b) { return runs[a].multiple < runs[b].multiple; });
      for (size_t i : rows) {
        out << value(runs[i].multiple);
        for (const tier_metrics& t : metrics[i].tiers) out << ' ' << value(100 * t.slo_attainment);
        out << ' ' << value(100 * metrics[i].total.slo_attainment) << ' ' << value(metrics[i].total.goodput_tps) << '\n';
      }
      out << "\n\n";
    }
  }
  const std::string d = (dir / "data" / "compare.dat").string();
  const int32_t panels = s.tier_count() + 1, rows = (panels + 1) / 2;
  std::string g = fmt::format(
      "set terminal png size 1100,{} font 'DejaVuSans,9'\nset output '{}'\nset multiplot layout {},2 title '{}: policies "
      "compared (offered load as a multiple of the measured capacity)'\nset grid\nset key below horizontal\nset xlabel 'load "
      "(x capacity)'\nset xtics 1\n",
      420 * rows, png, rows, s.name);
  const char* points[] = {"5", "7", "9", "11"};
  for (int32_t i = 0; i < s.tier_count(); ++i) {
    g += fmt::format("set title 'SLO attainment, tier {} (TTFT <= {} ms, TPOT <= {} ms)'\nset ylabel '% of offered'\nset yrange [0:105]\nplot ",
                     s.tier(i).name, s.tier(i).ttft.count(), s.tier(i).tpot.count());
    for (size_t p = 0; p < policies.size(); ++p) {
      g += fmt::format("{}'{}' index {} using 1:{} with linespoints lw 2 pt {} lc rgb '{}' title '{}'", p ? ", " : "", d, p,
                       2 + i, points[p % 4], color(static_cast<int32_t>(p)), to_string(policies[p]));
    }
    g += "\n";
  }
  g += "set title 'goodput: completion tokens/s of requests that met their SLO'\nset ylabel 'tokens/s'\nset yrange [0:*]\nplot ";
  for (size_t p = 0; p < policies.size(); ++p) {
    g += fmt::format("{}'{}' index {} using 1:{} with linespoints lw 2 pt {} lc rgb '{}' title '{}'", p ? ", " : "", d, p,
                     3 + s.tier_count(), points[p % 4], color(static_cast<int32_t>(p)), to_string(policies[p]));
  }
  return g + "\nunset multiplot\n";
}

bool run_gnuplot(const fs::path& script) {
  const std::string cmd = fmt::format("gnuplot '{}' 2>'{}.err'", script.string(), script.string());
  return std::system(cmd.c_str()) == 0;
}

}  // namespace

std::vector<fs::path> write_plots(const fs::path& dir, const scenario& s, const std::vector<run_result>& runs,
                                  const std::vector<run_metrics>& metrics, std::string& note) {
  std::vector<fs::path> pngs;
  fs::create_directories(dir / "data");
  fs::create_directories(dir / "plots");
  std::vector<std::pair<fs::path, fs::path>> scripts;  // script, png
  for (const run_result& run : runs) {
    const fs::path base = dir / "data" / run.label;
    write_ttft(base.string() + ".ttft.dat", run, s);
    write_load(base.string() + ".load.dat", run, s);
    write_rejects(base.string() + ".rejects.dat", run, s);
    const fs::path png = dir / ("run-" + run.label + ".png");
    const fs::path gp = dir / "plots" / (run.label + ".gp");
    std::ofstream(gp) << run_script(dir, run, s, png.string());
    scripts.emplace_back(gp, png);
  }
  if (!runs.empty()) {
    const fs::path png = dir / "compare.png", gp = dir / "plots" / "compare.gp";
    std::ofstream(gp) << compare_script(dir, s, runs, metrics, png.string());
    scripts.emplace_back(gp, png);
  }
  if (std::system("command -v gnuplot >/dev/null 2>&1") != 0) {
    note = "gnuplot not found (Debian: apt-get install gnuplot-nox): data and scripts written, no PNG";
    return pngs;
  }
  for (const auto& [gp, png] : scripts) {
    if (run_gnuplot(gp)) pngs.push_back(png);
    else note += fmt::format("gnuplot failed on {} (see {}.err); ", gp.string(), gp.string());
  }
  return pngs;
}

}  // namespace tireless::load
