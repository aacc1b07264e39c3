#!/usr/bin/env python3
"""Checks the Grafana dashboard against the server's metrics: valid JSON, every panel with a
unique id and at least one query, and every tireless_* metric a query names exported by
server/server_metrics.cpp (histograms with their _bucket/_sum/_count series). Further files
(the alert rules) get the metric-name check too.

    python3 deploy/grafana/check_dashboard.py deploy/grafana/tireless.json server/server_metrics.cpp \
        [deploy/prometheus/tireless-alerts.yml ...]
"""
import json
import re
import sys


def main(dashboard_path, metrics_source, *others):
    dash = json.load(open(dashboard_path))
    source = open(metrics_source).read()
    exported = set(re.findall(r'name\(c, "([a-z_]+)"\)', source))
    problems = []
    ids = [p["id"] for p in dash["panels"]]
    if len(ids) != len(set(ids)):
        problems.append(f"panel ids repeat: {ids}")
    for p in dash["panels"]:
        if not p.get("targets"):
            problems.append(f"panel '{p['title']}' has no query")
        for t in p.get("targets", []):
            for m in re.findall(r"\btireless_[a-z_]+", t["expr"]):
                base = re.sub(r"_(bucket|sum|count)$", "", m[len("tireless_"):])
                if base not in exported and m[len("tireless_"):] not in exported:
                    problems.append(f"panel '{p['title']}': {m} is not exported by the server")
    for m in re.findall(r"\btireless_[a-z_]+", json.dumps(dash.get("templating", {}))):
        if m[len("tireless_"):] not in exported:
            problems.append(f"templating: {m} is not exported by the server")
    for path in others:
        for m in sorted(set(re.findall(r"\btireless_[a-z_]+", open(path).read()))):
            if re.sub(r"_(bucket|sum|count)$", "", m[len("tireless_"):]) not in exported:
                problems.append(f"{path}: {m} is not exported by the server")
    for p in problems:
        print("FAIL:", p)
    print(f"{len(dash['panels'])} panels, {len(exported)} exported metric names, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
