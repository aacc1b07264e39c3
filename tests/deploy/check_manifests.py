#!/usr/bin/env python3
"""Validates deploy/kubernetes offline: the core manifests against the Kubernetes schemas
(PyPI kubernetes-validate, strict), the ConfigMap in step with config/tireless.toml and accepted
by tireless-serve --check-config, the termination grace covering preStop and the server's
shutdown grace, the probes on the routes the server serves, and the InferencePool (a CRD: no
schema offline) for the fields its v1 API requires.

    python3 tests/deploy/check_manifests.py --server build/tools/tireless-serve
"""
import argparse
import os
import pathlib
import re
import subprocess
import sys
import tempfile

import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
K8S = ROOT / "deploy" / "kubernetes"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--server", required=True)
    args = p.parse_args()
    problems = []

    r = subprocess.run([sys.executable, str(K8S / "make_configmap.py"), "--check"], capture_output=True, text=True)
    if r.returncode != 0:
        problems.append(r.stdout.strip())

    core = [str(K8S / f) for f in ("configmap.yaml", "deployment.yaml", "service.yaml", "pdb.yaml", "hpa.yaml",
                                    "prometheus-adapter.yaml")]
    r = subprocess.run([sys.executable, "-m", "kubernetes_validate", "--strict"] + core, capture_output=True, text=True)
    print(r.stdout.strip())
    if r.returncode != 0 or "passed" not in r.stdout:
        problems.append(f"kubernetes-validate: {r.stdout}{r.stderr}")

    config = yaml.safe_load((K8S / "configmap.yaml").read_text())["data"]["tireless.toml"]
    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
        f.write(config)
    r = subprocess.run([args.server, "--config", f.name, "--check-config"], capture_output=True, text=True)
    os.unlink(f.name)
    if r.returncode != 0:
        problems.append(f"tireless-serve refuses the ConfigMap's configuration: {r.stdout}{r.stderr}")

    dep = yaml.safe_load((K8S / "deployment.yaml").read_text())
    pod = dep["spec"]["template"]["spec"]
    c = pod["containers"][0]
    grace_ms = int(re.search(r"shutdown_grace_ms\s*=\s*(\d+)", config).group(1))
    pre_stop = int(c["lifecycle"]["preStop"]["exec"]["command"][-1])
    if pod["terminationGracePeriodSeconds"] < pre_stop + grace_ms / 1000 + 5:
        problems.append(f"terminationGracePeriodSeconds {pod['terminationGracePeriodSeconds']} does not cover preStop "
                        f"{pre_stop} s + shutdown_grace_ms {grace_ms} + 5 s")
    if c["readinessProbe"]["httpGet"]["path"] != "/ready" or c["livenessProbe"]["httpGet"]["path"] != "/health":
        problems.append("readiness must probe /ready and liveness /health")
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    for key, name in (("http_listen", "http"), ("metrics_listen", "metrics"), ("listen", "rpc")):
        m = re.search(rf'^{key}\s*=\s*"[^"]*:(\d+)"', config, re.M)
        if not m or int(m.group(1)) != ports.get(name):
            problems.append(f"server.{key} in the ConfigMap does not match the container port {name}")

    pool = yaml.safe_load((K8S / "inferencepool.yaml").read_text())
    spec = pool.get("spec", {})
    if pool.get("apiVersion") != "inference.networking.k8s.io/v1" or pool.get("kind") != "InferencePool":
        problems.append("inferencepool.yaml is not an inference.networking.k8s.io/v1 InferencePool")
    if spec.get("selector", {}).get("matchLabels") != dep["spec"]["selector"]["matchLabels"]:
        problems.append("the InferencePool does not select the Deployment's pods")
    if [t.get("number") for t in spec.get("targetPorts", [])] != [ports["http"]]:
        problems.append("the InferencePool's targetPorts are not the HTTP port")
    if not spec.get("endpointPickerRef", {}).get("name"):
        problems.append("the InferencePool has no endpointPickerRef")

    for p in problems:
        print("FAIL:", p)
    print("manifests: " + ("ok" if not problems else f"{len(problems)} problems"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
