"""`python -m engine serve --replicas N [--ray-address ADDRESS]`: the model server as a Ray Serve application.

Without `--ray-address` it starts a local Ray cluster on this machine; with one it joins that cluster (a head node
started with `ray start --head`, or KubeRay's). Ray Serve's HTTP proxy listens on --host:--port; every replica
loads the model from the same path on its node. Ctrl+C (or SIGTERM) stops the application and the local cluster.
"""
from __future__ import annotations

import os
import signal
import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:                   # the settings' type only: engine/launch.py reads and passes them
    from engine.settings import Settings

APP_NAME = "playground"


def serve_cluster(args: Settings, api_key: str | None, token: str | None) -> int:
    import ray  # Ray: an optional extra, imported only with --replicas
    from ray import serve

    from engine.cluster.hub import hub_actor
    from engine.cluster.ingress import Ingress
    from engine.cluster.replica import replica_deployment
    from engine.serving.limits import Limits, limits_from_flags

    cuda = (args.device or "").startswith("cuda") or (args.device is None and _has_cuda())
    ray.init(address=args.ray_address or None, include_dashboard=False, logging_level="warning",
             runtime_env={"env_vars": {k: v for k, v in os.environ.items() if k.startswith("PLAYGROUND_")}})
    serve.start(http_options={"host": args.host, "port": args.port}, logging_config={"log_level": "WARNING"})
    limits = limits_from_flags(args, Limits.for_device("cuda" if cuda else "cpu").with_env())
    cpus = args.replica_cpus or 1.0
    replicas = replica_deployment(args.replicas, cpus, 1.0 if cuda else 0.0).bind(
        args.model, args.device, args.dtype, limits.to_dict(), args.threads or max(1, int(cpus)), args.draft)
    ingress = Ingress.bind(replicas, token, api_key, args.served_model_name, limits.max_sessions, args.replicas)
    serve.run(ingress, name=APP_NAME, route_prefix="/", blocking=False)
    print(f"{args.replicas} replica(s) of {args.model} on Ray Serve, served on http://{args.host}:{args.port}/v1 "
          f"(/health answers 200 when the replicas are ready)", file=sys.stderr, flush=True)
    wait_for_signal()
    serve.delete(APP_NAME)
    ray.kill(hub_actor())
    ray.shutdown()
    return 0


def wait_for_signal() -> None:
    """Until SIGINT or SIGTERM (a flag the handler sets: no lock may be taken inside a signal handler)."""
    stop = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.append(True))
    while not stop:
        time.sleep(0.2)


def _has_cuda() -> bool:
    import torch  # torch only to ask for CUDA when no device was named

    return torch.cuda.is_available()


