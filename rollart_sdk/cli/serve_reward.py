"""``rollart serve-reward CONFIG``: each task's reward as a Ray Serve app that scales from zero.

For every task of CONFIG (``--task`` picks some), the task's reward backend - or, for a
``serverless`` reward with ``deploy:``, the backend named there - is deployed on Ray Serve
(``rollart_sdk.serverless.deploy``): bound to 127.0.0.1 unless ``--host``, bearer-token auth
from ``--token-env`` (required unless ``--insecure`` on loopback), JSON only, size-limited.
It prints each URL and the override that points a run at it, then logs every change of a
deployment's replica count until Ctrl-C (or ``--duration`` seconds).
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from rollart_sdk.cli.output import console


def deployments(cfg: Any, tasks: list[str] | None, args: argparse.Namespace) -> dict[str, Any]:
    """tag -> DeployOptions for the chosen tasks of ``cfg`` (flags fill what a task's own
    ``deploy:`` does not set)."""
    from rollart_sdk.errors import ConfigError
    from rollart_sdk.serverless.deploy import DeployOptions

    out: dict[str, Any] = {}
    known = [t.tag for t in cfg.tasks]
    unknown = sorted(set(tasks or []) - set(known))
    if unknown:
        raise ConfigError([("--task", f"no task {', '.join(unknown)}; tasks: {', '.join(known)}")])
    for task in cfg.tasks:
        if tasks and task.tag not in tasks:
            continue
        reward = task.reward
        own = reward.options.get("deploy") if reward.name == "serverless" else None
        base = {"backend": reward.model_dump() if own is None else own["backend"],
                "app": f"reward-{task.tag}", "host": args.host, "port": args.port,
                "min_replicas": args.min_replicas, "max_replicas": args.max_replicas,
                "downscale_to_zero_delay_s": args.downscale_to_zero_delay_s}
        if reward.name == "serverless" and own is None:
            raise ConfigError([(f"tasks.{known.index(task.tag)}.reward",
                                "a serverless reward without deploy: has nothing to serve here "
                                "(its function already lives at its url)")])
        out[task.tag] = DeployOptions.model_validate({**base, **(own or {}),
                                                     "host": args.host, "port": args.port})
    return out


def cmd_serve_reward(args: argparse.Namespace) -> int:
    from ray import serve

    from rollart_sdk.config import load_config
    from rollart_sdk.ray_utils import init_ray
    from rollart_sdk.serverless.deploy import ReplicaMonitor, check_exposure, deploy

    cfg, _ = load_config(args.config, args.overrides)
    plans = deployments(cfg, args.task, args)
    token = None if args.insecure else (os.environ.get(args.token_env) or None)
    for warning in check_exposure(args.host, token, args.insecure):
        console.print(warning, markup=False, highlight=False)
    init_ray(address=args.address, log_to_driver=False)
    monitors = []
    try:
        for tag, opts in plans.items():
            url = deploy(opts, token)
            auth = f", token_env: {args.token_env}" if token else ""
            console.print(f"task {tag}: {opts.backend.name} at {url} (min {opts.min_replicas}, "
                          f"max {opts.max_replicas} replicas)")
            index = [t.tag for t in cfg.tasks].index(tag)
            console.print(f"  run it with: 'tasks.{index}.reward={{name: serverless, options: "
                          f"{{url: {url}{auth}}}}}'")
            monitors.append(ReplicaMonitor(opts.app_name, emit=console.print).start())
        deadline = time.monotonic() + args.duration if args.duration else None
        while deadline is None or time.monotonic() < deadline:
            time.sleep(0.5)
    except KeyboardInterrupt:
        console.print("stopping")
    finally:
        for m in monitors:
            m.stop()
        for opts in plans.values():
            serve.delete(opts.app_name)
    return 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser("serve-reward", help="deploy each task's reward on Ray Serve (scales from zero)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. tasks.0.reward.name=judge")
    p.add_argument("--task", action="append", help="only this task tag (repeatable)")
    p.add_argument("--address", help="Ray cluster address (default: RAY_ADDRESS or a local Ray)")
    p.add_argument("--host", default="127.0.0.1", help="HTTP ingress address")
    p.add_argument("--port", type=int, default=8123, help="HTTP ingress port")
    p.add_argument("--token-env", default="ROLLART_REWARD_TOKEN",
                   help="environment variable holding the bearer token")
    p.add_argument("--insecure", action="store_true", help="no token (loopback hosts only)")
    p.add_argument("--min-replicas", type=int, default=0)
    p.add_argument("--max-replicas", type=int, default=2)
    p.add_argument("--downscale-to-zero-delay-s", type=float, default=10.0)
    p.add_argument("--duration", type=float, default=0.0,
                   help="stop after this many seconds (0: until Ctrl-C)")
    p.set_defaults(func=cmd_serve_reward)
