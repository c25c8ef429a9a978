#!/usr/bin/env python3
"""Helm's own actions on a cluster, through Helm's Go library (PyPI `helm-python-sdk`), for
machines without the helm command: what the chart's end-to-end test and docs/deploy.md run.

    tools/chart/helm.py install RELEASE NAMESPACE [--values FILE]... [--set-json JSON]...
    tools/chart/helm.py upgrade RELEASE NAMESPACE [--values FILE]... [--set-json JSON]...
    tools/chart/helm.py test RELEASE NAMESPACE
    tools/chart/helm.py uninstall RELEASE NAMESPACE

The cluster is KUBECONFIG's. install and upgrade wait for the release's workloads to be ready
(Helm's watcher) for --timeout seconds (300); `test` prints the test pods' logs. Exit status 1
with Helm's message when an action fails.
"""
import argparse
import json
import pathlib
import sys

import helm_python as helm
import yaml

CHART = pathlib.Path(__file__).resolve().parents[2] / "charts" / "dpufs"


def merged(args) -> dict:
    """Values files in order, then each --set-json object merged over them."""
    values: dict = {}
    for f in args.values or []:
        merge(values, yaml.safe_load(pathlib.Path(f).read_text()) or {})
    for j in args.set_json or []:
        merge(values, json.loads(j))
    return values


def merge(into: dict, other: dict) -> None:
    for k, v in other.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            merge(into[k], v)
        else:
            into[k] = v


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("action", choices=["install", "upgrade", "test", "uninstall"])
    p.add_argument("release")
    p.add_argument("namespace")
    p.add_argument("--values", action="append")
    p.add_argument("--set-json", action="append")
    p.add_argument("--timeout", type=int, default=300)
    args = p.parse_args()
    cfg = helm.Config(namespace=args.namespace)
    try:
        if args.action in ("install", "upgrade"):
            chart = helm.Chart.load(CHART)
            act = cfg.install if args.action == "install" else cfg.upgrade
            extra = {"create_namespace": True} if args.action == "install" else {}
            release = act(chart, args.release, merged(args), namespace=args.namespace,
                          timeout=args.timeout, wait="watcher", **extra)
            print(f"{args.action}: release {args.release} in {args.namespace}: "
                  f"{release.get('info', {}).get('status', release.get('status', 'done'))}")
        elif args.action == "test":
            result = cfg.test(args.release, timeout=args.timeout, logs=True)
            print(result.get("logs", ""))
            print(f"test: release {args.release}: passed")
        else:
            cfg.uninstall(args.release, timeout=args.timeout, wait="watcher")
            print(f"uninstall: release {args.release}: removed")
    except helm.HelmError as e:
        print(f"helm {args.action} {args.release}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
