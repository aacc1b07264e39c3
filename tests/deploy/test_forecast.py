#!/usr/bin/env python3
"""tools/tireless-forecast against CSV histories and against a real Prometheus (Debian's) whose
history of tireless_requests_total was backfilled with promtool (three weeks of a growing
daily pattern, a sample a minute, as a server scraped every minute would have left).

    python3 tests/deploy/test_forecast.py [--keep]

Exit 0: every check held; 1: one did not (the line says which).
"""
import datetime as dt
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
TOOL = os.path.join(ROOT, "tools", "tireless-forecast")


class Failure(Exception):
    pass


def check(cond, message):
    if not cond:
        raise Failure(message)


def forecast(*args):
    r = subprocess.run([sys.executable, TOOL, *args], capture_output=True, text=True, timeout=120)
    return r.returncode, r.stdout, r.stderr


def write_csv(path, peaks, start=dt.date(2026, 9, 1)):
    with open(path, "w") as f:
        f.write("date,peak_rps\n")
        for i, p in enumerate(peaks):
            f.write(f"{start + dt.timedelta(days=i)},{p:.3f}\n")


def weekly(i, base, growth):
    day = (dt.date(2026, 9, 1) + dt.timedelta(days=i)).weekday()
    return (base + growth * i) * (1.0 if day < 5 else 0.75) * (1 + 0.02 * math.sin(i * 1.7))


def test_csv(work):
    growing = os.path.join(work, "growing.csv")
    write_csv(growing, [weekly(i, 20, 0.5) for i in range(56)])
    rc, out, err = forecast("--csv", growing, "--replicas", "17", "--per-replica", "3", "--json")
    check(rc == 0, f"growing history: exit {rc}: {err}")
    r = json.loads(out)
    # 56 days of +0.5/day from 20: a weekday peak of ~47.5 now; in two weeks ~54.
    check(r["weekly_pattern"] and r["history_days"] == 56, f"history read wrong: {r}")
    check(50 < r["forecast_peak"] < 60, f"the forecast peak {r['forecast_peak']:.1f} is not the trend's ~54")
    check(r["recommendation"] == "scale soon", f"51 requests/s of capacity against ~54 in 1-2 weeks: {r['recommendation']} ({r['why']})")
    check(r["replicas_needed"] >= 19, f"replicas needed {r['replicas_needed']}")
    days = r["days"]
    weekend = [d for d in days if dt.date.fromisoformat(d["date"]).weekday() >= 5]
    weekday = [d for d in days if dt.date.fromisoformat(d["date"]).weekday() < 5]
    check(max(x["mean"] for x in weekend) < min(x["mean"] for x in weekday), "the weekly pattern is not forecast")
    rc, out, _ = forecast("--csv", growing, "--capacity", "30", "--json")
    check(json.loads(out)["recommendation"] == "scale now", "a peak far above 1.5x the capacity is not 'scale now'")
    rc, out, _ = forecast("--csv", growing, "--capacity", "120", "--json")
    check(json.loads(out)["recommendation"] == "monitor", "twice the forecast peak of capacity is not 'monitor'")
    rc, out, _ = forecast("--csv", growing, "--capacity", "51")
    check(rc == 0 and "recommendation: scale soon" in out and "forecast, next 14 days" in out, f"the text output: {out}")

    # Bad input: a clear message, exit 2.
    bad = os.path.join(work, "bad.csv")
    with open(bad, "w") as f:
        f.write("date,peak\n2026-09-01,12\n2026-09-02,lots\n")
    for args, says in [(["--csv", bad, "--capacity", "3"], "bad.csv:3: 'lots' is not a number"),
                       (["--csv", growing], "give the fleet's capacity"),
                       (["--csv", growing, "--capacity", "3", "--column", "users"], "no column 'users'"),
                       (["--csv", os.path.join(work, "none.csv"), "--capacity", "3"], "cannot read")]:
        rc, out, err = forecast(*args)
        check(rc == 2 and says in err, f"{args}: exit {rc}, said {err!r}, not {says!r}")
    short = os.path.join(work, "short.csv")
    write_csv(short, [10, 11, 12])
    rc, _, err = forecast("--csv", short, "--capacity", "20")
    check(rc == 2 and "at least 7" in err, f"three days of history: {err}")
    print("csv: passed")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_prometheus(work):
    prometheus, promtool = shutil.which("prometheus"), shutil.which("promtool")
    check(prometheus and promtool, "prometheus and promtool are not installed (scripts/setup installs Debian's prometheus)")
    # 21 days of tireless_requests_total, a sample a minute, ending an hour ago: a daily curve
    # peaking mid-day at (10 + 0.5 a day) requests/s, lower at weekends.
    end = int(time.time()) // 300 * 300 - 3600
    start = end - 21 * 86400
    om = os.path.join(work, "history.om")
    total = 0.0
    daily_peak = {}
    with open(om, "w") as f:
        f.write("# HELP tireless_requests_total Requests by outcome\n# TYPE tireless_requests_total counter\n")
        for t in range(start, end + 1, 60):
            day_index = (t - start) / 86400
            when = dt.datetime.fromtimestamp(t, dt.timezone.utc)
            hour = when.hour + when.minute / 60
            shape = 0.3 + 0.7 * max(0.0, math.sin(math.pi * (hour - 6) / 12)) if 6 <= hour <= 18 else 0.3
            rate = (10 + 0.5 * day_index) * (1.0 if when.weekday() < 5 else 0.75) * shape
            total += rate * 60
            f.write(f'tireless_requests_total{{tier="premium",outcome="completed"}} {total:.3f} {t}\n')
            daily_peak[when.date()] = max(rate, daily_peak.get(when.date(), 0))
        f.write("# EOF\n")
    data = os.path.join(work, "tsdb")
    r = subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", "-q", om, data], capture_output=True,
                       text=True, timeout=300)
    check(r.returncode == 0, f"promtool could not backfill: {r.stderr}")
    config = os.path.join(work, "prometheus.yml")
    with open(config, "w") as f:
        f.write("global:\n  scrape_interval: 1h\nscrape_configs: []\n")
    port = free_port()
    log = open(os.path.join(work, "prometheus.log"), "wb")
    proc = subprocess.Popen([prometheus, f"--config.file={config}", f"--storage.tsdb.path={data}",
                             "--storage.tsdb.retention.time=10y", f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(url + "/-/ready", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            check(time.monotonic() < deadline and proc.poll() is None, "Prometheus did not become ready in 60 s")
            time.sleep(0.5)
        rc, out, err = forecast("--prometheus", url, "--days", "21", "--capacity", "25", "--json")
        check(rc == 0, f"from Prometheus: exit {rc}: {err}")
        res = json.loads(out)
        check(res["history_days"] >= 20, f"{res['history_days']} days read from Prometheus, not ~21")
        # The last full day's peak as Prometheus computes the 5-minute rate of the counter.
        last_full = max(d for d in daily_peak if d < dt.datetime.fromtimestamp(end, dt.timezone.utc).date())
        days = {d["date"]: d for d in res["days"]}
        check(len(days) == 14, "no 14-day forecast")
        today = dt.datetime.now(dt.timezone.utc).date()
        check(min(days) == today.isoformat(), f"the forecast starts {min(days)}, not today ({today}): the day in progress "
              "was read as a whole day of history")
        check(res["forecast_peak"] > max(daily_peak.values()), "a growing demand is not forecast to grow")
        print(f"prometheus: {res['history_days']} days, last peak {res['last_peak']:.2f} "
              f"(generated {daily_peak[last_full]:.2f} on {last_full}), forecast peak {res['forecast_peak']:.2f}, "
              f"{res['recommendation']} ({res['why']})")
        rc, out, err = forecast("--prometheus", url, "--days", "21", "--capacity", "25", "--query",
                                "sum(rate(tireless_no_such_metric[5m]))")
        check(rc == 2 and "no data" in err, f"a query with no data: exit {rc}, {err}")
        rc, out, err = forecast("--prometheus", f"http://127.0.0.1:{free_port()}", "--capacity", "25")
        check(rc == 2 and "cannot query Prometheus" in err, f"no Prometheus there: exit {rc}, {err}")
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
    print("prometheus: passed")


def main():
    work = tempfile.mkdtemp(prefix="tireless-forecast-")
    try:
        test_csv(work)
        test_prometheus(work)
    except Failure as e:
        print(f"FAIL: {e}")
        return 1
    finally:
        if "--keep" in sys.argv:
            print("kept:", work)
        else:
            shutil.rmtree(work, ignore_errors=True)
    print("forecast: passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
