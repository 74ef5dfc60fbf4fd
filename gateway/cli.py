"""`llmgw`: the command line. Subcommands delegate to the package that owns them."""

import argparse
import asyncio
import os
import signal
import sys
import tempfile
from collections.abc import Callable

from gateway.settings import DEFAULT_MASTER_KEY, Settings, database_problem, load_settings, settings_problem


def _serve(args: argparse.Namespace, rest: list[str]) -> int:
    import uvicorn

    from gateway.app import create_app
    from gateway.http_server import CoalescingHttpToolsProtocol

    overrides = {"host": args.host, "port": args.port, "workers": args.workers}
    settings = load_settings(**{k: v for k, v in overrides.items() if v is not None})
    if settings.host not in ("127.0.0.1", "localhost", "::1") and settings.master_key.get_secret_value() == (
        DEFAULT_MASTER_KEY
    ):
        print(
            "refusing to serve beyond loopback with the default master key: set LLMGW_MASTER_KEY",
            file=sys.stderr,
        )
        return 2
    common = {"host": settings.host, "port": settings.port, "loop": "uvloop", "http": CoalescingHttpToolsProtocol,
              "log_level": settings.log_level, "access_log": False,
              "timeout_graceful_shutdown": settings.shutdown_grace_s + SHUTDOWN_BACKSTOP_S,
              "timeout_keep_alive": settings.keep_alive_s}  # fmt: skip
    signal.signal(signal.SIGTERM, _exit_cleanly)
    if settings.workers == 1:
        uvicorn.run(create_app(settings), **common)
        return 0
    from gateway.lifecycle import WorkerSupervisor

    _share_settings_with_workers(settings)
    config = uvicorn.Config(
        "gateway.app:app_from_environment", factory=True, workers=settings.workers, **common
    )
    supervisor = WorkerSupervisor(config, sockets=[config.bind_socket()])
    supervisor.run()
    return 3 if supervisor.startup_failed else 0  # 3: uvicorn's start-up failure, as with one worker


SHUTDOWN_BACKSTOP_S = 5.0  # uvicorn cancels what is left this long after the gateway's own grace period
WORKER_HEALTHCHECK_S = 30.0  # a worker still booting on a busy machine is not "hung" (uvicorn's default: 5 s)


def _exit_cleanly(sig: int, frame: object) -> None:
    """SIGTERM outside uvicorn's handler: before start, or re-raised by uvicorn after its graceful
    shutdown (which would otherwise end the process with status 143). Either way: exit 0."""
    raise SystemExit(0)


def _share_settings_with_workers(settings: Settings) -> None:
    """Workers re-read the settings from the environment; metrics from all of them go to one directory."""
    os.environ["LLMGW_HOST"], os.environ["LLMGW_PORT"] = settings.host, str(settings.port)
    os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", tempfile.mkdtemp(prefix="llmgw-metrics-"))


def _engine(args: argparse.Namespace, rest: list[str]) -> int:
    from backends.local_engine.cli import main as engine_main

    return engine_main(rest)


def _migrate(args: argparse.Namespace, rest: list[str]) -> int:
    from policies.migrate import main as migrate_main

    settings = load_settings()
    return migrate_main(rest, settings.database_url, settings.policies.db_schema, settings.policies.database)


def _keys(args: argparse.Namespace, rest: list[str]) -> int:
    from policies.cli import main as keys_main

    return keys_main(["keys", *rest], load_settings())


def _tenants(args: argparse.Namespace, rest: list[str]) -> int:
    from policies.errors import NotFound
    from policies.tenants_cli import run

    try:
        return asyncio.run(run(rest, load_settings()))
    except (NotFound, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1


def _plan(args: argparse.Namespace, rest: list[str]) -> int:
    from routing.planning.cli import main as plan_main

    return plan_main(rest)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="llmgw",
        description="LLM gateway with routing, caching and cascades. Settings come from LLMGW_* variables "
        "and the YAML file named by LLMGW_CONFIG_FILE.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="start the gateway (OpenAI-compatible API)")
    serve.add_argument("--host", help="bind address (default 127.0.0.1, LLMGW_HOST)")
    serve.add_argument("--port", type=int, help="port (default 8000, LLMGW_PORT)")
    serve.add_argument(
        "--workers",
        type=int,
        help="worker processes (default 1, LLMGW_WORKERS); each starts its own local engine",
    )
    serve.set_defaults(run=_serve)
    engine = commands.add_parser(
        "engine", help="the local engine: `engine generate PROMPT`, `engine serve`", add_help=False
    )
    engine.set_defaults(run=_engine)
    migrate = commands.add_parser(
        "migrate", help="upgrade the database schema (LLMGW_DATABASE_URL)", add_help=False
    )
    migrate.set_defaults(run=_migrate)
    keys = commands.add_parser("keys", help="virtual keys: `keys create|list|revoke`", add_help=False)
    keys.set_defaults(run=_keys)
    tenants = commands.add_parser(
        "tenants", help="service classes: `tenants list`, `tenants service T --class batch --weight 2`",
        add_help=False,
    )  # fmt: skip
    tenants.set_defaults(run=_tenants)
    plan = commands.add_parser(
        "plan", help="capacity planning: KV bytes, sequences, replicas at an SLO", add_help=False
    )
    plan.set_defaults(run=_plan)
    return parser


def main(argv: list[str] | None = None) -> int:
    args, rest = _parser().parse_known_args(sys.argv[1:] if argv is None else argv)
    run: Callable[[argparse.Namespace, list[str]], int] = args.run
    try:
        return run(args, rest)
    except Exception as error:  # a user's mistake in the settings: one short message, not a traceback
        problem = settings_problem(error)
        if problem is not None:
            print(f"llmgw: {problem}", file=sys.stderr)
            return 2
        problem = database_problem(error) if args.command in ("migrate", "keys") else None
        if problem is not None:
            print(f"llmgw: {problem}", file=sys.stderr)
            return 1
        raise


if __name__ == "__main__":
    sys.exit(main())
